"""A small OpenAI-compatible chat server for the regeneration test (GET /v1/models, POST /v1/chat/completions),
on Python's http.server. Not a neural network: it renders the request with the tokenizer's chat template
(add_generation_prompt, chat_template_kwargs) exactly as a serving engine does, then generates greedily with a
fixed deterministic trigram rule over the tokenizer's plain-text tokens:
    next = allowed[(31 * t[-1] + 17 * t[-2] + 7 * len(t)) % len(allowed)],  end of turn when (t[-1] + t[-2]) % 13 == 0
so the same prompt always gets the same answer, and an answer depends on the whole rendered prompt only
through its last two tokens and its length (different conversations get different answers).
Faults for the client's retries: --fail-every K answers every K-th chat request with HTTP 503.
Usage: server.py TOKENIZER_DIR --port-file F [--delay S] [--fail-every K]   (port 0: any free port, written to F)
"""
import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import json
import os
import re
import threading
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
from transformers import AutoTokenizer  # noqa: E402

MODEL = "tiny-trigram"


class State:
    def __init__(self, tok, delay, fail_every):
        self.tok, self.delay, self.fail_every = tok, delay, fail_every
        self.lock = threading.Lock()
        self.requests = 0
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
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.requests += 1
                n = state.requests
            if state.fail_every and n % state.fail_every == 0:
                return self._send(503, {"error": {"message": "overloaded (injected fault)"}})
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
            self._send(200, {"id": f"cmpl-{n}", "object": "chat.completion", "model": MODEL,
                             "choices": [{"index": 0, "finish_reason": finish,
                                          "message": {"role": "assistant", "content": state.tok.decode(ids)}}],
                             "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}})
    return Handler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--fail-every", type=int, default=0)
    a = ap.parse_args()
    state = State(AutoTokenizer.from_pretrained(a.tokenizer), a.delay, a.fail_every)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    with open(a.port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.replace(a.port_file + ".tmp", a.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
