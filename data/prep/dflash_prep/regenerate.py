"""dflash_prep regenerate: replace the assistant turns of chat rows with the target's own generations, through
any OpenAI-compatible server (vLLM, SGLang, transformers serve: POST /v1/chat/completions), or several
(--server repeated: the rows are spread over them, dispatch.py).

Per row, turn by turn: the prompt is the row's system/user turns with the earlier assistant turns already
replaced; each assistant turn is generated anew; a row ending in a user turn gets one more generated answer
(prompt-only data works). Sampling defaults to greedy (temperature 0): DFlash trains on the target's own greedy
answers. Rows with tool calls are refused: a new assistant turn would no longer match the tool results after it.

Failures (client.py): a server's unusable answers are retried, then the row is tried on the other servers, then
it is recorded as failed (bad_response, with each server's URL and fault) and the run goes on; a server that is
down is left out and its rows go to the others; the run stops only when no server is left.

Resume (journal.py): every finished row is appended to OUT.journal; running the same command again skips the
rows already there (so failed and rejected rows are tried again). When every row is done, OUT is written sorted
by key, i.e. in input order (atomically), and the journal removed; then, with --h5, OUT is tokenized like
'dflash-prep tokenize'.
"""
import json
import os
import sys
import time

from .atomic import OutputError, check_output_path, write_text_atomic
from .client import BadAnswer, Client, ServerDown
from .dispatch import AllServersDown, Dispatcher, Server
from .journal import Journal
from .options import non_negative_float, non_negative_int, positive_float, positive_int, probability
from .rows import Reject, json_object_arg, parse_row, read_lines, require_input_files

MAX_PRINTED_REJECTS = 20


def add_arguments(p):
    p.add_argument("input", help="jsonl rows (OpenAI 'messages' or ShareGPT 'conversations')")
    p.add_argument("--server", action="append", required=True, metavar="URL",
                   help="a server's base URL, e.g. http://localhost:8000 (or .../v1); repeat it to spread the rows "
                   "over several servers (all serving the same model)")
    p.add_argument("--model", help="model name for the requests (default: the first of GET /v1/models)")
    p.add_argument("--out", required=True, help="output jsonl: one {'key', 'messages'} row per input row")
    p.add_argument("--temperature", type=non_negative_float, default=0.0,
                   help="0 = greedy (default, the DFlash recipe)")
    p.add_argument("--top-p", type=probability, default=1.0)
    p.add_argument("--max-tokens", type=positive_int, default=2048, help="longest generated answer per turn")
    p.add_argument("--seed", type=int, help="sampling seed sent with every request")
    p.add_argument("--chat-template-kwargs", help="JSON object the server passes to the chat template (vLLM, "
                   "SGLang), e.g. '{\"enable_thinking\": false}' for Qwen3 without reasoning")
    p.add_argument("--extra-body", default="{}", help="JSON object merged into every request body")
    p.add_argument("--concurrency", type=positive_int, default=16, help="rows in flight at once on each server")
    p.add_argument("--retries", type=positive_int, default=6, help="attempts per request on connection errors, "
                   "timeouts, HTTP 429 and 5xx, and unusable answers, with exponential backoff")
    p.add_argument("--retry-wait", type=positive_float, default=1.0, help="seconds before the second attempt; "
                   "doubles for each further one, at most 30 s")
    p.add_argument("--request-timeout", type=positive_float, default=600.0, help="seconds per request")
    p.add_argument("--on-reject", choices=("fail", "skip"), default="fail",
                   help="rows the servers or the parser refuse, and rows that failed: fail (report, keep the "
                   "journal, exit 1) or skip (write them to OUT without .jsonl + .rejects.jsonl)")
    p.add_argument("--h5", help="then tokenize OUT into this HDF5 file (needs --tokenizer)")
    p.add_argument("--tokenizer", help="for --h5: the target's model directory")
    p.add_argument("--think", choices=("keep", "drop"), default="keep", help="for --h5: see tokenize")
    p.add_argument("--template-kwargs", default="{}", help="for --h5: see tokenize")
    p.add_argument("--max-len", type=positive_int, help="for --h5: see tokenize")
    p.add_argument("--truncate", choices=("head", "reject"), default="head", help="for --h5: see tokenize")
    p.add_argument("--target", help="for --h5: see tokenize")
    p.add_argument("--mask-token-id", type=non_negative_int, help="for --h5: see tokenize")


def check_regenerable(row):
    """Raises Reject for rows regenerate cannot handle."""
    if row.text is not None:
        raise Reject("text_row", "a plain 'text' row has no prompt to regenerate")
    if row.tools or any(t.role == "tool" or t.tool_calls for t in row.turns):
        raise Reject("tool_row", "a row with tool calls cannot be regenerated (new answers would not match its "
                     "tool results); tokenize it as it is")


def regenerate_row(client: Client, row, body: dict) -> dict:
    """The row with every assistant turn generated by the server; raises Reject, BadAnswer, ServerDown."""
    msgs, finish, generated = [], [], 0

    def generate():
        nonlocal generated
        if not msgs or msgs[-1]["role"] != "user":
            raise Reject("no_prompt", f"an assistant turn (number {len(finish) + 1}) does not follow a user turn")
        m, fr, n = client.chat(dict(body, messages=list(msgs)))
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


def choose_model(servers: list, model) -> str:
    """--model, or the first model the first server that can list its models lists. A server that cannot be
    reached is left out; none that can list a model is an error naming each server's fault."""
    if model:
        return model
    faults = []
    for s in servers:
        try:
            ids = s.client.models()
        except ServerDown as e:
            s.alive = False
            faults.append(str(e))
            continue
        except (BadAnswer, Reject) as e:
            faults.append(str(e))
            continue
        if ids:
            for f in faults:
                print(f"warning: cannot list the models of a server: {f}", file=sys.stderr)
            return ids[0]
        faults.append(f"{s.client.base}/v1/models lists no model")
    raise SystemExit("error: cannot list the server's models: " + "; ".join(faults) + " (pass --model NAME when "
                     "the server does not list it)")


def run(args) -> int:
    require_input_files([args.input])
    if args.h5 and not args.tokenizer:
        raise SystemExit("error: --h5 needs --tokenizer (the target's model directory)")
    stem = args.out[:-6] if args.out.endswith(".jsonl") else args.out
    for path, option in ((args.out, "--out"), (args.out + ".journal", "--out (its journal)"),
                         (stem + ".rejects.jsonl", "--out (its rejects file)"), (args.h5, "--h5")):
        if path:
            check_output_path(path, option, [args.input])
    servers = [Server(url, Client(url, os.environ.get("OPENAI_API_KEY", ""), args.request_timeout, args.retries,
                                  args.retry_wait)) for url in args.server]
    model = choose_model(servers, args.model)
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
            row = parse_row(line_no, line)
            check_regenerable(row)
            todo.append(row)
        except Reject as r:
            rejects.append({"file": args.input, "line": line_no, "reason": r.reason, "message": str(r), "row": None})
    urls = ", ".join(s.url for s in servers)
    print(f"{args.input}: {total} rows, {len(journal.done)} done, {len(todo)} to generate with {model} at "
          f"{urls} (temperature {args.temperature}, top_p {args.top_p}, max_tokens {args.max_tokens})", flush=True)

    stats = {"generated": 0, "at_length": 0, "failed": 0, "last_print": 0.0}
    start = time.time()

    def done(row, out):
        journal.append(out)
        stats["generated"] += out["generated_tokens"]
        stats["at_length"] += sum(1 for f in out["finish_reasons"] if f == "length")

    def reject(row, r):
        rejects.append({"file": args.input, "line": row.line, "reason": r.reason, "message": str(r), "row": row.raw})

    def failed(row, faults):
        stats["failed"] += 1
        rejects.append({"file": args.input, "line": row.line, "reason": "bad_response",
                        "message": "no usable answer: " + "; ".join(faults), "row": row.raw})

    def tick():
        now = time.time()
        if now - stats["last_print"] >= 2.0:
            stats["last_print"] = now
            print(f"  {len(journal.done)}/{total} rows, {stats['generated'] / max(now - start, 1e-9):.1f} generated "
                  "tokens/s", flush=True)

    dispatcher = Dispatcher([s for s in servers if s.alive], args.concurrency,
                            lambda client, row: regenerate_row(client, row, body))
    try:
        dispatcher.run(todo, done, reject, failed, tick)
    except AllServersDown:
        _stop(journal, dispatcher, f"error: no server is left (see the warnings above); {len(journal.done)} finished "
              f"rows are kept in {journal.path}; run the same command again to resume", 1)
    except KeyboardInterrupt:
        _stop(journal, dispatcher, f"interrupted: {len(journal.done)} rows kept in {journal.path}; run again to "
              "resume", 130)
    except OutputError as e:   # the journal cannot be written (a full disk)
        _stop(journal, dispatcher, f"error: {e}", 1)
    except BaseException:
        _stop(journal, dispatcher, None, None)
        raise
    dispatcher.shutdown(wait_for_requests=True)
    journal.close()
    spread = ", ".join(f"{s.url} {s.rows}" for s in servers) if len(servers) > 1 else ""
    print(f"generated {stats['generated']} tokens in {time.time() - start:.1f} s; {stats['at_length']} answers "
          "stopped at --max-tokens (finish_reason 'length')" + (f"; rows per server: {spread}" if spread else ""))

    rejects.sort(key=lambda r: r["line"])   # input order, whatever order the servers finished in
    for r in rejects[:MAX_PRINTED_REJECTS]:
        print(f"  rejected {r['file']}:{r['line']}: {r['reason']}: {r['message']}", file=sys.stderr)
    if len(rejects) > MAX_PRINTED_REJECTS:
        print(f"  ... and {len(rejects) - MAX_PRINTED_REJECTS} more", file=sys.stderr)
    failed_note = f" ({stats['failed']} failed: no usable answer from the servers)" if stats["failed"] else ""
    if rejects and args.on_reject == "fail":
        raise SystemExit(f"error: {len(rejects)} rows rejected{failed_note}; the {len(journal.done)} finished rows "
                         f"stay in {journal.path}. Fix the rows (or the servers) and run again, or pass "
                         "--on-reject skip")
    if rejects:
        write_text_atomic(stem + ".rejects.jsonl",
                          "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects))
        print(f"{len(rejects)} rejected rows{failed_note} written to {stem}.rejects.jsonl")
    rows = sorted(journal.rows, key=lambda r: r["key"])
    write_text_atomic(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    os.remove(journal.path)
    print(f"wrote {args.out}: {len(rows)} rows (of {total} input rows, {len(rejects)} rejected"
          f"{', ' + str(stats['failed']) + ' of them failed' if stats['failed'] else ''})", flush=True)

    if args.h5:
        from argparse import Namespace
        from . import tokenize_cmd
        return tokenize_cmd.run(Namespace(
            inputs=[args.out], tokenizer=args.tokenizer, out=args.h5, think=args.think,
            template_kwargs=args.template_kwargs, max_len=args.max_len, truncate=args.truncate,
            on_reject=args.on_reject, rejects=None, stats=None, target=args.target, mask_token_id=args.mask_token_id,
            workers=1))
    return 0


def _stop(journal: Journal, dispatcher: Dispatcher, message, code):
    """Ends a run early: the journal keeps the finished rows; requests still in flight are not waited for."""
    try:
        journal.close()
    except OutputError:
        pass   # the journal keeps what was written before
    dispatcher.shutdown(wait_for_requests=False)
    if message is None:
        return
    print(message, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # threads blocked in requests would otherwise keep the process alive
