"""dflash_prep regenerate: replace the assistant turns of chat rows with the target's own generations, through
any OpenAI-compatible server (vLLM, SGLang, transformers serve: POST /v1/chat/completions).

Per row, turn by turn: the prompt is the row's system/user turns with the earlier assistant turns already
replaced; each assistant turn is generated anew; a row ending in a user turn gets one more generated answer
(prompt-only data works). Sampling defaults to greedy (temperature 0): DFlash trains on the target's own greedy
answers.

Resume: every finished row is appended to OUT.journal as one JSON line {"key": <input line number>, ...} in one
write() call; a run that is killed loses only the rows in flight (a torn last line is cut off on resume). Running
the same command again skips the keys already there. When every row is done, OUT is written sorted by key
(atomically) and the journal removed; then, with --h5, OUT is tokenized like 'dflash-prep tokenize'.
"""
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request

from .atomic import atomic_output, fsync_path, write_text_atomic
from .rows import Reject, json_object_arg, parse_row, read_lines, require_input_files

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
FSYNC_EVERY = 64


def add_arguments(p):
    p.add_argument("input", help="jsonl rows (OpenAI 'messages' or ShareGPT 'conversations')")
    p.add_argument("--server", required=True, help="the server's base URL, e.g. http://localhost:8000 (or .../v1)")
    p.add_argument("--model", help="model name for the requests (default: the first of GET /v1/models)")
    p.add_argument("--out", required=True, help="output jsonl: one {'key', 'messages'} row per input row")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default, the DFlash recipe)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=2048, help="longest generated answer per turn")
    p.add_argument("--seed", type=int, help="sampling seed sent with every request")
    p.add_argument("--chat-template-kwargs", help="JSON object the server passes to the chat template (vLLM, "
                   "SGLang), e.g. '{\"enable_thinking\": false}' for Qwen3 without reasoning")
    p.add_argument("--extra-body", default="{}", help="JSON object merged into every request body")
    p.add_argument("--concurrency", type=int, default=16, help="rows in flight at once")
    p.add_argument("--retries", type=int, default=6, help="attempts per request on connection errors, timeouts, "
                   "HTTP 429 and 5xx, with exponential backoff (1 s doubling, at most 30 s)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--on-reject", choices=("fail", "skip"), default="fail",
                   help="rows the server or the parser refuses: fail (report, keep the journal, exit 1) or skip "
                   "(write them to OUT without .jsonl + .rejects.jsonl)")
    p.add_argument("--h5", help="then tokenize OUT into this HDF5 file (needs --tokenizer)")
    p.add_argument("--tokenizer", help="for --h5: the target's model directory")
    p.add_argument("--think", choices=("keep", "drop"), default="keep", help="for --h5: see tokenize")
    p.add_argument("--template-kwargs", default="{}", help="for --h5: see tokenize")
    p.add_argument("--max-len", type=int, default=0, help="for --h5: see tokenize")
    p.add_argument("--truncate", choices=("head", "reject"), default="head", help="for --h5: see tokenize")
    p.add_argument("--target", help="for --h5: see tokenize")
    p.add_argument("--mask-token-id", type=int, help="for --h5: see tokenize")


class ServerError(Exception):
    """The server is unreachable or keeps failing: stop the run (the journal keeps the finished rows)."""


class Client:
    def __init__(self, base: str, api_key: str, timeout: float, retries: int):
        base = base.rstrip("/")
        self.base = base[:-3] if base.endswith("/v1") else base
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout, self.retries = timeout, retries

    def _request(self, path: str, body=None):
        url = self.base + path
        data = None if body is None else json.dumps(body).encode()
        delay = 1.0
        for attempt in range(1, self.retries + 1):
            try:
                req = urllib.request.Request(url, data=data, headers=self.headers,
                                             method="GET" if data is None else "POST")
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                detail = e.read().decode("utf-8", "replace")[:300]
                if e.code in (401, 403, 404):   # wrong URL, key or model: every row would fail the same way
                    raise ServerError(f"HTTP {e.code} from {url}: {detail}")
                if e.code not in RETRY_STATUS:
                    raise Reject("server_refused", f"HTTP {e.code} from {url}: {detail}") from None
                why = f"HTTP {e.code}: {detail}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                why = str(getattr(e, "reason", e))
            if attempt == self.retries:
                raise ServerError(f"{url}: {why} (after {self.retries} attempts)")
            time.sleep(delay * (0.5 + random.random()))   # jitter: concurrent requests do not retry in lockstep
            delay = min(delay * 2, 30.0)

    def first_model(self) -> str:
        models = self._request("/v1/models").get("data") or []
        if not models:
            raise ServerError(f"{self.base}/v1/models lists no model; pass --model")
        return models[0]["id"]

    def chat(self, body: dict) -> dict:
        return self._request("/v1/chat/completions", body)


def assistant_message(resp: dict) -> tuple:
    """(message for the row, finish_reason, generated tokens) of a chat completion response."""
    try:
        choice = resp["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise Reject("bad_response", f"no choices[0].message in the server's answer: {json.dumps(resp)[:200]}")
    out = {"role": "assistant", "content": msg.get("content") or ""}
    reasoning = msg.get("reasoning_content", msg.get("reasoning"))   # servers with a reasoning parser
    if reasoning:
        out["reasoning_content"] = reasoning
    return out, choice.get("finish_reason"), (resp.get("usage") or {}).get("completion_tokens", 0)


def regenerate_row(client: Client, row, body: dict) -> dict:
    """The row with every assistant turn generated by the server."""
    if row.text is not None:
        raise Reject("text_row", "a plain 'text' row has no prompt to regenerate")
    msgs, finish, generated = [], [], 0

    def generate():
        nonlocal generated
        if not msgs or msgs[-1]["role"] != "user":
            raise Reject("no_prompt", f"an assistant turn (number {len(finish) + 1}) does not follow a user turn")
        m, fr, n = assistant_message(client.chat(dict(body, messages=list(msgs))))
        msgs.append(m)
        finish.append(fr)
        generated += n

    for t in row.turns:
        if t.role == "assistant":
            generate()
        else:
            msgs.append({"role": t.role, "content": t.content})
    if msgs[-1]["role"] == "user":
        generate()
    return {"key": row.line, "messages": msgs, "finish_reasons": finish, "generated_tokens": generated}


class Journal:
    """Append-only jsonl of finished rows. The first line records the settings, so a resume with other settings
    is refused instead of mixing two kinds of generations."""

    def __init__(self, path: str, header: dict):
        self.path, self.done, self.rows = path, set(), []
        if os.path.exists(path):
            self._load(header)
        else:
            with atomic_output(path) as partial:
                with open(partial, "w", encoding="utf-8") as f:
                    f.write(json.dumps({"journal": header}) + "\n")
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.unsynced = 0

    def _load(self, header: dict):
        with open(path := self.path, "rb") as f:
            data = f.read()
        good_end = 0
        lines = data.split(b"\n")
        for i, raw in enumerate(lines):
            if not raw:
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError:
                if i == len(lines) - 1:   # the torn last write of a killed run: cut it off
                    break
                raise SystemExit(f"error: {path}:{i + 1}: not valid JSON in the middle of the journal; it was "
                                 "edited or the disk is damaged (delete it to start over)") from None
            if i == 0:
                old = obj.get("journal") if isinstance(obj, dict) else None
                if old != header:
                    diff = sorted(k for k in set(header) | set(old or {}) if (old or {}).get(k) != header.get(k))
                    raise SystemExit(f"error: {path} was started with other settings ({', '.join(diff)}): resume "
                                     "with the same command, or delete the journal to start over")
            elif not isinstance(obj, dict) or not isinstance(obj.get("key"), int):
                raise SystemExit(f"error: {path}:{i + 1}: a journal row without an integer 'key'; the journal was "
                                 "edited (delete it to start over)")
            elif obj["key"] in self.done:
                raise SystemExit(f"error: {path}:{i + 1}: key {obj['key']} appears twice")
            else:
                self.done.add(obj["key"])
                self.rows.append(obj)
            good_end += len(raw) + 1
        if good_end < len(data):
            print(f"{path}: cut off a torn last line ({len(data) - good_end} bytes) of a killed run")
            os.truncate(path, good_end)

    def append(self, obj: dict):
        os.write(self.fd, (json.dumps(obj, ensure_ascii=False) + "\n").encode())  # one write: whole line or none
        self.done.add(obj["key"])
        self.rows.append(obj)
        self.unsynced += 1
        if self.unsynced >= FSYNC_EVERY:
            self.sync()

    def sync(self):
        os.fsync(self.fd)
        self.unsynced = 0

    def close(self):
        self.sync()
        os.close(self.fd)


def run(args) -> int:
    require_input_files([args.input])
    if args.h5 and not args.tokenizer:
        raise SystemExit("error: --h5 needs --tokenizer (the target's model directory)")
    client = Client(args.server, os.environ.get("OPENAI_API_KEY", ""), args.request_timeout, args.retries)
    try:
        model = args.model or client.first_model()
    except (ServerError, Reject) as e:
        raise SystemExit(f"error: cannot list the server's models: {e}") from None
    body = {"model": model, "temperature": args.temperature, "top_p": args.top_p, "max_tokens": args.max_tokens}
    if args.seed is not None:
        body["seed"] = args.seed
    if args.chat_template_kwargs:
        body["chat_template_kwargs"] = json_object_arg(args.chat_template_kwargs, "--chat-template-kwargs")
    body.update(json_object_arg(args.extra_body, "--extra-body"))
    header = {"input": os.path.abspath(args.input), "request": body}
    journal = Journal(args.out + ".journal", header)
    if journal.done:
        print(f"resuming: {len(journal.done)} rows already in {journal.path}")

    rejects = []
    total = 0
    todo = []
    for line_no, line in read_lines(args.input):
        total += 1
        if line_no in journal.done:
            continue
        try:
            if isinstance(line, Reject):
                raise line
            todo.append(parse_row(line_no, line))
        except Reject as r:
            rejects.append({"file": args.input, "line": line_no, "reason": r.reason, "message": str(r), "row": None})
    print(f"{args.input}: {total} rows, {len(journal.done)} done, {len(todo)} to generate with {model} at "
          f"{args.server} (temperature {args.temperature}, top_p {args.top_p}, max_tokens {args.max_tokens})",
          flush=True)

    start, last_print, generated, at_length = time.time(), 0.0, 0, 0
    pool = ThreadPoolExecutor(max_workers=max(1, args.concurrency))
    pending, it = {}, iter(todo)
    try:
        while True:
            while len(pending) < 2 * max(1, args.concurrency):
                row = next(it, None)
                if row is None:
                    break
                pending[pool.submit(regenerate_row, client, row, body)] = row
            if not pending:
                break
            finished, _ = wait(pending, timeout=2.0, return_when=FIRST_COMPLETED)
            for fut in finished:
                row = pending.pop(fut)
                try:
                    out = fut.result()
                except Reject as r:
                    rejects.append({"file": args.input, "line": row.line, "reason": r.reason, "message": str(r),
                                    "row": row.raw})
                    continue
                journal.append(out)
                generated += out["generated_tokens"]
                at_length += sum(1 for f in out["finish_reasons"] if f == "length")
            now = time.time()
            if now - last_print >= 2.0:
                last_print = now
                el = max(now - start, 1e-9)
                print(f"  {len(journal.done)}/{total} rows, {generated / el:.1f} generated tokens/s", flush=True)
    except ServerError as e:
        journal.close()
        pool.shutdown(wait=False, cancel_futures=True)
        print(f"error: the server failed: {e}\n  {len(journal.done)} finished rows are kept in {journal.path}; "
              "run the same command again to resume", file=sys.stderr)
        os._exit(1)   # do not wait for requests still in flight
    except KeyboardInterrupt:
        journal.close()
        print(f"interrupted: {len(journal.done)} rows kept in {journal.path}; run again to resume", file=sys.stderr)
        os._exit(130)
    pool.shutdown()
    journal.close()
    print(f"generated {generated} tokens in {time.time() - start:.1f} s; {at_length} answers stopped at "
          f"--max-tokens (finish_reason 'length')")

    stem = args.out[:-6] if args.out.endswith(".jsonl") else args.out
    for r in rejects[:20]:
        print(f"  rejected {r['file']}:{r['line']}: {r['reason']}: {r['message']}", file=sys.stderr)
    if rejects and args.on_reject == "fail":
        raise SystemExit(f"error: {len(rejects)} rows rejected; the {len(journal.done)} finished rows stay in "
                         f"{journal.path}. Fix the rows and run again, or pass --on-reject skip")
    if rejects:
        write_text_atomic(stem + ".rejects.jsonl",
                          "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects))
        print(f"{len(rejects)} rejected rows written to {stem}.rejects.jsonl")
    rows = sorted(journal.rows, key=lambda r: r["key"])
    write_text_atomic(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    os.remove(journal.path)
    print(f"wrote {args.out}: {len(rows)} rows (of {total} input rows, {len(rejects)} rejected)", flush=True)

    if args.h5:
        from argparse import Namespace
        from . import tokenize_cmd
        return tokenize_cmd.run(Namespace(
            inputs=[args.out], tokenizer=args.tokenizer, out=args.h5, think=args.think,
            template_kwargs=args.template_kwargs, max_len=args.max_len, truncate=args.truncate,
            on_reject=args.on_reject, rejects=None, stats=None, target=args.target, mask_token_id=args.mask_token_id,
            workers=1))
    return 0
