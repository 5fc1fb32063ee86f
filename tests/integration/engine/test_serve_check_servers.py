#!/usr/bin/env python3
"""`dflash-prep serve-check --engine vllm-server|sglang` against stand-in servers on 127.0.0.1 (no GPU here): the HTTP
paths, the per-prompt counters and the last-verify convention, without an engine. Run by serve_check_servers.sh.

    test_serve_check_servers.py --src SOURCE_DIR --work WORK

The stand-ins answer from a script: for each prompt (its first token is its index) the tokens to return and the
kept tokens of each verify as the engine would count them (vLLM: the last verify unclipped). The vLLM stand-in
serves /v1/models, /v1/completions (return_token_ids) and /metrics (vllm:spec_decode_num_drafts_total and
vllm:spec_decode_num_accepted_tokens_per_pos_total{position=j}, counters over all requests, as vLLM's); the SGLang
one /generate with meta_info.spec_verify_ct and spec_accept_histogram. Asserts:
  1. the scripted engine agreeing with eval.json (its last verify past max_new_tokens on one prompt) -> exit 0,
     tau and histograms equal;
  2. one prompt's drafts accepted less from its third verify -> exit 1, that prompt named, the histograms differ;
  3. one prompt's tokens differ -> exit 1, lossless false, the first differing token named;
  4. SGLang with and without spec_accept_histogram -> exit 0; a wrong verify count -> exit 1."""
import argparse
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import h5py
import numpy as np

B, N = 4, 10   # block size, max_new_tokens
# per prompt: dflash_eval's kept tokens per verify (sum = N - 1) and its tokens
OURS = [[4, 4, 1], [2, 3, 4], [1, 1, 1, 1, 1, 1, 1, 1, 1]]
ENGINE = [[4, 4, 3], [2, 3, 4], [1, 1, 1, 1, 1, 1, 1, 1, 1]]   # prompt 0: last verify accepted past the end


def tokens_of(i):
    return [100 + 10 * i + k for k in range(N)]


class Script:
    engine = ENGINE
    tokens = {i: tokens_of(i) for i in range(3)}
    histogram = True
    verify_bias = 0


def make_server(kind):
    counters = {"drafts": 0, "pos": [0] * (B - 1)}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def reply(self, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/v1/models":
                return self.reply({"data": [{"id": "target"}]})
            if self.path == "/metrics":
                lines = ['vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} %d.0' % counters["drafts"]]
                lines += ['vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",'
                          'position="%d"} %d.0' % (j, n) for j, n in enumerate(counters["pos"])]
                return self.reply(("\n".join(lines) + "\n").encode(), "text/plain")
            self.send_error(404)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt = req.get("prompt", req.get("input_ids"))
            i = prompt[0]
            kept = Script.engine[i]
            if kind == "vllm":
                assert req["temperature"] == 0 and req["ignore_eos"] and req["return_token_ids"], req
                counters["drafts"] += len(kept)
                for m in kept:
                    for j in range(m - 1):
                        counters["pos"][j] += 1
                return self.reply({"choices": [{"token_ids": Script.tokens[i], "text": ""}]})
            assert req["sampling_params"]["temperature"] == 0 and req["sampling_params"]["ignore_eos"], req
            meta = {"completion_tokens": N, "spec_verify_ct": len(kept) + Script.verify_bias}
            if Script.histogram:
                meta["spec_accept_histogram"] = [sum(1 for m in kept if m - 1 == a) for a in range(B)]
            return self.reply({"output_ids": Script.tokens[i], "meta_info": meta})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def need(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    os.chdir(a.work)
    prompts = [[i, 7, 8, 9] for i in range(3)]
    with h5py.File("prompts.h5", "w") as f:
        f["tokens"] = np.array(sum(prompts, []), dtype=np.int32)
        f["offsets"] = np.array([0, 4, 8, 12], dtype=np.int64)
        f["loss_mask"] = np.zeros(12, dtype=np.uint8)
    hist = [0] * (B + 1)
    for kept in OURS:
        for m in kept:
            hist[m] += 1
    ev = {"prompts_file": "prompts.h5", "prompts": 3, "max_new_tokens": N, "block_size": B,
          "tau": sum(sum(k) for k in OURS) / sum(len(k) for k in OURS), "kept_histogram": hist,
          "per_prompt": [{"kept": OURS[i], "tokens": tokens_of(i)} for i in range(3)]}
    json.dump(ev, open("eval.json", "w"))
    prep = os.path.join(a.src, "data", "prep", "dflash-prep")

    def check(kind, url, label):
        p = subprocess.run([prep, "serve-check", "--eval", "eval.json", "--engine", kind, "--url", url,
                            "--out", f"{label}.json"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(f"--- {label}: exit {p.returncode}\n{p.stdout}")
        return p.returncode, (json.load(open(f"{label}.json")) if os.path.exists(f"{label}.json") else None)

    vllm_srv, vllm_url = make_server("vllm")
    rc, r = check("vllm-server", vllm_url, "vllm_agree")
    need(rc == 0 and r["agree"] and r["kept_histogram_engine"] == hist and r["tau_engine"] == ev["tau"],
         "1. the agreeing vLLM server (last verify past the end on prompt 0) was not found equal")

    Script.engine = [ENGINE[0], [2, 3, 1, 1, 1, 1], ENGINE[2]]
    rc, r = check("vllm-server", vllm_url, "vllm_differ")
    need(rc == 1 and not r["agree"] and r["prompts_equal"] == [0, 2] and r["lossless"],
         "2. a prompt accepting less was not reported")
    Script.engine = ENGINE

    Script.tokens = {0: tokens_of(0), 1: tokens_of(1), 2: tokens_of(2)[:5] + [1] * 5}
    rc, r = check("vllm-server", vllm_url, "vllm_tokens")
    need(rc == 1 and not r["lossless"] and r["prompts"][2]["first_token_difference"] == 5,
         "3. differing tokens were not reported at token 5")
    Script.tokens = {i: tokens_of(i) for i in range(3)}

    sgl_srv, sgl_url = make_server("sglang")
    Script.engine = OURS   # SGLang stops at max_new_tokens: its last verify keeps what is left
    rc, r = check("sglang", sgl_url, "sglang_hist")
    need(rc == 0 and r["kept_histogram_engine"] == hist, "4. SGLang with spec_accept_histogram")
    Script.histogram = False
    rc, r = check("sglang", sgl_url, "sglang_count")
    need(rc == 0 and r["agree"], "4. SGLang with only spec_verify_ct")
    Script.verify_bias = 1
    rc, r = check("sglang", sgl_url, "sglang_wrong")
    need(rc == 1 and not r["agree"], "4. SGLang with a wrong verify count")
    vllm_srv.shutdown()
    sgl_srv.shutdown()
    print("PASS (serve_check_servers)")


if __name__ == "__main__":
    main()
