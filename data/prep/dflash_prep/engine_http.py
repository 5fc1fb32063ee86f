"""A running server with the drafter, for `dflash-prep serve-check --engine vllm-server|sglang --url URL`: the prompts
one at a time (so that every counter the server keeps belongs to one prompt), greedy, token ids in and out, eos
ignored. What each server tells per prompt:

  vllm-server  POST /v1/completions {"prompt": [ids], "return_token_ids": true, "ignore_eos": true}: the tokens;
               GET /metrics before and after: vllm:spec_decode_num_drafts_total (verifies) and
               vllm:spec_decode_num_accepted_tokens_per_pos_total{position=j} (verifies that accepted the draft
               at position j + 1), hence the prompt's kept histogram (its last verify unclipped: serve_check.py
               clips it). Start it with the drafter:
                 vllm serve TARGET --speculative-config '{"method": "dflash", "model": "EXPORT",
                   "num_speculative_tokens": B-1}'   (no --disable-log-stats: the counters are needed)
  sglang       POST /generate {"input_ids": [ids], "sampling_params": {"temperature": 0, "max_new_tokens": N,
               "ignore_eos": true}}: output_ids, meta_info.spec_verify_ct (verifies) and completion_tokens; with
               meta_info.spec_accept_histogram (index k: verifies that accepted k drafts) the prompt's histogram,
               else only its verify count, which with the same output equals ours exactly when τ does.
               Start it with --speculative-algorithm DFLASH --speculative-draft-model-path EXPORT
               --speculative-num-draft-tokens B.
Neither path has run here: both need a GPU server (docs/eval.md says so)."""
import json
import re
import urllib.request

TIMEOUT = 600


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        return json.loads(r.read())


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
        return r.read().decode()


SAMPLE = re.compile(r'^(vllm:spec_decode_num_(?:drafts|accepted_tokens_per_pos)_total)(\{[^}]*\})?\s+([0-9.eE+-]+)$')


def vllm_counters(text: str) -> dict:
    """{"drafts": n, "per_pos": {j: n}} summed over engines, from a Prometheus text page."""
    out = {"drafts": 0.0, "per_pos": {}}
    for line in text.splitlines():
        m = SAMPLE.match(line.strip())
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name.endswith("drafts_total"):
            out["drafts"] += value
        else:
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                j = int(pos.group(1))
                out["per_pos"][j] = out["per_pos"].get(j, 0.0) + value
    return out


def histogram_from_positions(drafts: int, accepted: list, block: int) -> list:
    """Kept histogram [B+1] from the verify count and accepted[j] = verifies whose draft at position j + 1 was
    accepted (acceptance is a prefix, so kept > j + 1 exactly for those)."""
    at_least = [drafts] + list(accepted) + [0] * (block - 1 - len(accepted))   # at_least[k-1]: kept >= k
    h = [0] * (block + 1)
    for k in range(1, block + 1):
        h[k] = at_least[k - 1] - (at_least[k] if k < block else 0)
    return h


def run_server(kind: str, url: str, model, prompts: list, max_new: int, block: int) -> dict:
    url = url.rstrip("/")
    requests = []
    if kind == "vllm-server":
        if not model:
            model = json.loads(_get(url + "/v1/models"))["data"][0]["id"]
        for p in prompts:
            before = vllm_counters(_get(url + "/metrics"))
            resp = _post(url + "/v1/completions", {"model": model, "prompt": p, "max_tokens": max_new,
                                                   "temperature": 0.0, "ignore_eos": True, "return_token_ids": True})
            after = vllm_counters(_get(url + "/metrics"))
            tokens = resp["choices"][0].get("token_ids")
            if tokens is None:
                raise SystemExit(f"{url}: the server returned no token_ids (a vLLM older than return_token_ids)")
            drafts = int(round(after["drafts"] - before["drafts"]))
            acc = [int(round(after["per_pos"].get(j, 0) - before["per_pos"].get(j, 0))) for j in range(block - 1)]
            requests.append({"tokens": [int(t) for t in tokens], "histogram": histogram_from_positions(drafts, acc,
                                                                                                       block)})
        return {"engine": f"vLLM server {url} ({model})", "read": None, "requests": requests}
    for p in prompts:
        resp = _post(url + "/generate", {"input_ids": p, "sampling_params": {"temperature": 0.0,
                                                                             "max_new_tokens": max_new,
                                                                             "ignore_eos": True}})
        meta = resp.get("meta_info", {})
        verifies = int(meta.get("spec_verify_ct", 0))
        hist = meta.get("spec_accept_histogram")
        if isinstance(hist, list) and sum(hist) == verifies:
            h = [0] + [int(n) for n in hist][:block] + [0] * max(0, block - len(hist))
        else:   # only the count: all the prompt's kept tokens in one bin per verify is unknown; keep the total
            h = None
        requests.append({"tokens": [int(t) for t in resp.get("output_ids", [])], "histogram": h,
                         "verifies_count": verifies})
    return {"engine": f"SGLang server {url}", "read": None, "requests": requests}
