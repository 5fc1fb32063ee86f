"""A small OpenAI-compatible chat server for the regeneration test (GET /v1/models, POST /v1/chat/completions),
on Python's http.server. Not a neural network: it renders the request with the tokenizer's chat template
(add_generation_prompt, chat_template_kwargs) exactly as a serving engine does, then generates greedily with a
fixed deterministic trigram rule over the tokenizer's plain-text tokens:
    next = allowed[(31 * t[-1] + 17 * t[-2] + 7 * len(t)) % len(allowed)],  end of turn when (t[-1] + t[-2]) % 13 == 0
so the same prompt always gets the same answer, and an answer depends on the whole rendered prompt only
through its last two tokens and its length (different conversations get different answers).
Faults for the client's retries: --fail-every K answers every K-th chat request with HTTP 503; --exit-after K
exits at the (K+1)-th chat request (its connection is cut, later ones are refused: a server that dies).
Hostile answers, for 'regenerate' to survive:
  - a chat request whose last message holds HOSTILE_<kind> gets a malformed answer, every time (or, for
    HOSTILE_flaky, only the first time that prompt is asked): see HOSTILE below;
  - base URL http://HOST:PORT/<variant> (the client appends /v1/...): /garbage answers every chat request with an
    HTML page; /models-<kind> answers GET /v1/models with a malformed list (MODELS below).
GET /v1/stats: {"chat": chat requests answered normally}.
Usage: server.py TOKENIZER_DIR --port-file F [--delay S] [--fail-every K] [--exit-after K]
       (port 0: any free port, written to F)
"""
import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import json
import os
import re
import sys
import threading
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
from transformers import AutoTokenizer  # noqa: E402

MODEL = "tiny-trigram"
HTML = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
# kind -> (content type, body) of a malformed chat answer; "truncated" promises more bytes than it sends
HOSTILE = {
    "html": ("text/html", HTML),
    "notjson": ("application/json", b"this is not json"),
    "truncated": ("application/json", b'{"choices": [{"message": {"role": "assist'),
    "message_string": ("application/json", json.dumps({"choices": [{"message": "hello"}]}).encode()),
    "no_choices": ("application/json", json.dumps({"id": "x", "object": "chat.completion"}).encode()),
    "choices_dict": ("application/json", json.dumps({"choices": {"0": {"message": {"content": "hi"}}}}).encode()),
    "content_list": ("application/json", json.dumps({"choices": [{"message": {"content": [1, 2]}}]}).encode()),
    "list": ("application/json", b"[1, 2, 3]"),
    "deep": ("application/json", b"[" * 100000 + b"]" * 100000),
}
MODELS = {
    "list": b'["tiny-trigram"]', "dict": b'{"data": {"id": "tiny-trigram"}}', "strings": b'{"data": ["tiny-trigram"]}',
    "html": HTML, "empty": b'{"data": []}',
}


class State:
    def __init__(self, tok, delay, fail_every, exit_after):
        self.tok, self.delay, self.fail_every, self.exit_after = tok, delay, fail_every, exit_after
        self.lock = threading.Lock()
        self.requests = 0
        self.answered = 0
        self.asked = set()   # prompts asked before (HOSTILE_flaky)
        specials = {t.content for t in tok.added_tokens_decoder.values()}
        # tokens that decode to plain printable text on their own: answers stay valid UTF-8 without tags
        self.allowed = [i for piece, i in sorted(tok.get_vocab().items(), key=lambda x: x[1])
                        if piece not in specials and re.fullmatch(r"[A-Za-z ,.?!]+", tok.decode([i]))]
        self.eos = tok.eos_token_id

    def generate(self, prompt_ids, max_tokens):
        t = list(prompt_ids)
        out = []
        while len(out) < max_tokens:
            if len(out) >= 2 and (t[-1] + t[-2]) % 13 == 0:
                return out, "stop"
            nxt = self.allowed[(31 * t[-1] + 17 * t[-2] + 7 * len(t)) % len(self.allowed)]
            t.append(nxt)
            out.append(nxt)
        return out, "length"


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, obj):
            self._send_raw(code, "application/json", json.dumps(obj).encode())

        def _send_raw(self, code, content_type, data, length=None):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(length or len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self):
            """(variant, path): '/garbage/v1/models' -> ('garbage', '/v1/models')."""
            m = re.fullmatch(r"(?:/([\w-]+))?(/v1/.*)", self.path)
            return (m.group(1), m.group(2)) if m else (None, self.path)

        def do_GET(self):
            variant, path = self._route()
            if path == "/v1/models" and variant and variant.startswith("models-"):
                return self._send_raw(200, "application/json", MODELS[variant[len("models-"):]])
            if path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            if path == "/v1/stats":
                return self._send(200, {"chat": state.answered})
            self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            variant, path = self._route()
            if path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            try:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            except ValueError:   # a request cut off (its client killed while sending it)
                return self._send(400, {"error": {"message": "request body is not JSON"}})
            with state.lock:
                state.requests += 1
                n = state.requests
            if state.exit_after and n > state.exit_after:
                os._exit(0)   # the server dies: this connection is cut, later ones are refused
            if state.fail_every and n % state.fail_every == 0:
                return self._send(503, {"error": {"message": "overloaded (injected fault)"}})
            if variant == "garbage":
                return self._send_raw(200, "text/html", HTML)
            last = str(body["messages"][-1]["content"])
            kind = re.search(r"HOSTILE_(\w+)", last)
            if kind and kind.group(1) == "flaky":
                with state.lock:
                    first = last not in state.asked
                    state.asked.add(last)
                if first:
                    return self._send_raw(200, "text/html", HTML)
            elif kind and kind.group(1) in HOSTILE:
                ctype, data = HOSTILE[kind.group(1)]
                return self._send_raw(200, ctype, data, length=len(data) + 100 if kind.group(1) == "truncated"
                                      else None)
            if body.get("model") != MODEL:
                return self._send(404, {"error": {"message": f"model {body.get('model')!r} not served"}})
            if body.get("temperature", 1.0) != 0:
                return self._send(400, {"error": {"message": "this server only samples greedily (temperature 0)"}})
            msgs = body["messages"]
            if any("FAIL_400" in m["content"] for m in msgs):
                return self._send(400, {"error": {"message": "prompt refused (test marker FAIL_400)"}})
            text = state.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                                 **body.get("chat_template_kwargs", {}))
            prompt = state.tok(text, add_special_tokens=False)["input_ids"]
            ids, finish = state.generate(prompt, int(body.get("max_tokens", 64)))
            time.sleep(state.delay)
            usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}
            if kind and kind.group(1) == "odd_usage":   # statistics of the wrong type: the answer is still usable
                usage, finish = ["not", "a", "dict"], 7
            with state.lock:
                state.answered += 1
            self._send(200, {"id": f"cmpl-{n}", "object": "chat.completion", "model": MODEL,
                             "choices": [{"index": 0, "finish_reason": finish,
                                          "message": {"role": "assistant", "content": state.tok.decode(ids)}}],
                             "usage": usage})
    return Handler


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # a client that went away mid-answer (regenerate killed, or given up after its timeout) is no error here
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--exit-after", type=int, default=0)
    a = ap.parse_args()
    state = State(AutoTokenizer.from_pretrained(a.tokenizer), a.delay, a.fail_every, a.exit_after)
    srv = Server(("127.0.0.1", 0), make_handler(state))
    with open(a.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.replace(a.port_file + ".tmp", a.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
