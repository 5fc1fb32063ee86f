"""dflash-prep serve-check: does a serving engine accept your exported drafter as dflash_eval measured it?

    dflash_eval --target T --drafter EXPORT --prompts P.h5 --max-new-tokens N --out eval.json [--vocab-limit V]
    dflash-prep serve-check --eval eval.json --target T --drafter EXPORT --engine vllm          (vLLM offline, here)
    dflash-prep serve-check --eval eval.json --engine vllm-server --url http://host:8000        (a running server)
    dflash-prep serve-check --eval eval.json --engine sglang --url http://host:30000            (a running server)

The engine decodes the prompts of eval.json greedily (token ids in, `max_new_tokens` out, eos ignored) with the
drafter; its output and its acceptance are put next to dflash_eval's, prompt by prompt (docs/eval.md,
"Checking a serving engine"):

  - lossless: the engine's tokens with the drafter == dflash_eval's (plain greedy decoding of our target, which
    `--check-greedy` proved) [== --reference H5, `dflash_data regenerate`'s output, when given];
  - acceptance, defined as ours: tokens kept per verify (the accepted drafts + the target's own token). One
    convention differs and is handled explicitly, not by a tolerance: dflash_eval's last verify of a prompt keeps
    at most what max_new_tokens leaves, vLLM counts every draft it accepted there. The engine's last verify is
    clipped the same way before comparing; every other verify must be equal as it is;
  - τ, the kept histogram and the acceptance per block position side by side; per prompt: equal or not, and for
    each prompt that differs its first diverging verify (or first diverging token);
  - what the engine read from the drafter's config.json (vLLM offline: through vLLM's own functions).

Exit 0 when the engine agrees exactly on every prompt, 1 when it does not (the diagnosis says where) or on bad
input (a message names it), 2 on a usage error. --out writes everything as JSON."""
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from .atomic import write_text_atomic
from .jsonfile import read_json_object

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_VLLM_PYTHON = os.path.join(os.path.dirname(HERE), ".venv-vllm", "bin", "python")


def add_arguments(p):
    p.add_argument("--eval", required=True, help="dflash_eval's --out JSON (with its per_prompt record)")
    p.add_argument("--engine", required=True, choices=("vllm", "vllm-server", "sglang"),
                   help="vllm: vLLM offline in a separate Python (--vllm-python), on its CPU or GPU build; "
                   "vllm-server: a running `vllm serve` (--url); sglang: a running SGLang server (--url)")
    p.add_argument("--target", help="the target model directory (vllm: required; servers: already loaded)")
    p.add_argument("--drafter", help="the exported drafter (dflash_mpi --export; vllm: required)")
    p.add_argument("--prompts", help="the prompts (default: eval.json's prompts_file)")
    p.add_argument("--reference", help="an HDF5 of the target's greedy continuations of the same prompts "
                   "(dflash_data regenerate's output): the engine's tokens must equal them too")
    p.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON,
                   help="a Python with vLLM (default data/prep/.venv-vllm: bash mpi_launch/install_prep.sh --vllm)")
    p.add_argument("--dtype", default="float32", help="vllm: the engine's dtype (float32 compares exactly with "
                   "dflash_eval's fp32 CPU run; bfloat16 is what GPUs serve, where near-ties may flip a token)")
    p.add_argument("--patch-vllm-k-norm", action="store_true",
                   help="vllm: replace vLLM's one stacked k_norm call over all drafter layers by one per layer "
                   "(vLLM's CPU kernel reads only layer 0's weight: docs/export.md, 'vLLM')")
    p.add_argument("--kv-cache-gib", type=float, help="vllm: the KV cache's size (default: 0.25 GiB on vLLM's CPU "
                   "build, vLLM's own sizing on a GPU)")
    p.add_argument("--url", help="vllm-server / sglang: the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="vllm-server: the served model name (default: the first of /v1/models)")
    p.add_argument("--out", help="write the comparison as JSON")


def read_prompts(path: str, count: int) -> list:
    """The first `count` prompts of an HDF5 dataset as dflash_eval takes them: each sequence's tokens before its
    first loss_mask = 1 (all of them when there is none)."""
    with h5py.File(path, "r") as f:
        for k in ("tokens", "offsets", "loss_mask"):
            if k not in f:
                raise SystemExit(f"{path}: no dataset '{k}' (the format of data/README.md)")
        tokens, offsets, mask = f["tokens"][:], f["offsets"][:], f["loss_mask"][:]
    if len(offsets) - 1 < count:
        raise SystemExit(f"{path}: {len(offsets) - 1} sequences, the eval ran {count}")
    out = []
    for i in range(count):
        s, e = int(offsets[i]), int(offsets[i + 1])
        m = mask[s:e]
        n = int(np.argmax(m)) if m.any() else e - s
        out.append([int(t) for t in tokens[s:s + n]])
    return out


def read_continuations(path: str, count: int) -> list:
    """Each sequence's tokens from its first loss_mask = 1 on: the continuation dflash_data regenerate appended."""
    with h5py.File(path, "r") as f:
        tokens, offsets, mask = f["tokens"][:], f["offsets"][:], f["loss_mask"][:]
    out = []
    for i in range(min(count, len(offsets) - 1)):
        s, e = int(offsets[i]), int(offsets[i + 1])
        m = mask[s:e]
        out.append([int(t) for t in tokens[s + int(np.argmax(m)):e]] if m.any() else [])
    return out


def clip_last(kept: list, budget: int) -> list:
    """The engine's kept tokens per verify under dflash_eval's convention: the verifies together keep at most
    `budget` tokens (max_new_tokens minus the prefill's token), so the last one keeps what is left."""
    out, left = [], budget
    for m in kept:
        out.append(min(m, left))
        left -= out[-1]
    return out


def histogram(kept: list, block: int) -> list:
    h = [0] * (block + 1)
    for m in kept:
        h[m] += 1
    return h


def by_position(hist: list) -> list:
    """Share of verifies whose draft at block position j (1..B-1) was accepted: kept more than j tokens."""
    n = sum(hist)
    return [sum(hist[j + 1:]) / n if n else 0.0 for j in range(1, len(hist) - 1)]


def first_difference(a: list, b: list):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_prompt(i: int, ours: dict, engine: dict, max_new: int, block: int, reference) -> dict:
    """One prompt: ours = dflash_eval's {"kept", "tokens"}; engine = {"tokens", "verifies": [[drafted, accepted]]}
    (a verify trace) or {"tokens", "histogram": [B+1] unclipped} (a server's metrics)."""
    r = {"prompt": i, "ours_kept": ours["kept"]}
    tok = first_difference(engine["tokens"], ours["tokens"])
    r["tokens_equal"] = tok is None
    if tok is not None:
        r["first_token_difference"] = tok
    if reference is not None:
        ref = reference[i][:max_new]
        r["reference_equal"] = engine["tokens"] == ref
    if "verifies" in engine:
        raw = [a + 1 for _, a in engine["verifies"]]
        r["engine_kept_reported"] = raw
        r["engine_drafted"] = sorted({d for d, _ in engine["verifies"]})
        kept = clip_last(raw, max_new - 1)
        r["engine_kept"] = kept
        v = first_difference(kept, ours["kept"])
        r["acceptance_equal"] = v is None
        if v is not None:
            r["first_verify_difference"] = v
        r["engine_histogram"] = histogram(kept, block)
    elif engine.get("histogram") is None:
        # only the number of verifies (SGLang without spec_accept_histogram): with the same tokens, the same count
        # of verifies is the same tau for this prompt
        r["engine_verifies"] = engine.get("verifies_count")
        r["acceptance_equal"] = engine.get("verifies_count") == len(ours["kept"])
        r["engine_histogram"] = None
    else:
        # a server's counters: only the prompt's histogram; the one convention difference is the last verify,
        # which ours clipped to what max_new_tokens left and the engine did not
        h = list(engine["histogram"])
        ours_h = histogram(ours["kept"], block)
        last = ours["kept"][-1] if ours["kept"] else None
        clipped = sum(ours["kept"]) == max_new - 1
        diff = [x - y for x, y in zip(h, ours_h)]
        if any(diff) and clipped and last is not None and diff[last] == -1 and \
                sum(1 for d in diff if d) == 2 and any(d == 1 for d in diff[last + 1:]):
            h[last] += 1
            h[diff.index(1)] -= 1
        r["engine_histogram"] = h
        r["acceptance_equal"] = h == ours_h
    r["ours_histogram"] = histogram(ours["kept"], block)
    return r


def run_vllm_offline(args, prompts: list, max_new: int, block_size: int) -> dict:
    if not args.target or not args.drafter:
        raise SystemExit("--engine vllm needs --target DIR and --drafter EXPORT_DIR")
    if not os.access(args.vllm_python, os.X_OK):
        raise SystemExit(f"--vllm-python {args.vllm_python}: not an executable Python (make data/prep/.venv-vllm "
                         "with 'bash mpi_launch/install_prep.sh --vllm', or name a Python with vLLM)")
    block = int(read_json_object(os.path.join(args.drafter, "config.json"), "the exported drafter's config")
                .get("block_size", 0))
    if block != block_size:
        raise SystemExit(f"--drafter {args.drafter}: block_size {block}, but {args.eval} evaluated a drafter of "
                         f"block_size {block_size}: check the export that dflash_eval measured")
    longest = max((len(p) for p in prompts), default=0)
    request = {"target": os.path.abspath(args.target), "prompts": prompts, "max_tokens": max_new,
               "dtype": args.dtype, "max_model_len": longest + max_new + 2 * block,
               "kv_cache_bytes": int(args.kv_cache_gib * (1 << 30)) if args.kv_cache_gib else None,
               "runs": [{"drafter": os.path.abspath(args.drafter), "patch_k_norm": args.patch_vllm_k_norm}]}
    with tempfile.TemporaryDirectory(prefix="serve-check-") as tmp:
        req, res = os.path.join(tmp, "request.json"), os.path.join(tmp, "result.json")
        json.dump(request, open(req, "w"))
        p = subprocess.run([args.vllm_python, os.path.join(HERE, "engine_vllm.py"), req, res])
        if p.returncode != 0 or not os.path.exists(res):
            raise SystemExit(f"the vLLM engine failed (exit {p.returncode}; its output is above)")
        result = json.load(open(res))
    run = result["runs"][0]
    return {"engine": f"vLLM {result['vllm']} offline ({result['platform']}, torch {result['torch']}, "
                      f"dtype {args.dtype})", "patched": run["patched"], "read": run["read"],
            "requests": run["requests"]}


def run(args) -> int:
    ev = read_json_object(args.eval, "dflash_eval's --out file")
    for k in ("block_size", "max_new_tokens", "prompts", "prompts_file"):
        if k not in ev:
            raise SystemExit(f"{args.eval}: no '{k}': not the --out file of dflash_eval")
    if "per_prompt" not in ev:
        raise SystemExit(f"{args.eval}: no per_prompt record: it was written by an older dflash_eval; run it again")
    block, max_new, count = int(ev["block_size"]), int(ev["max_new_tokens"]), int(ev["prompts"])
    prompts_path = args.prompts or ev["prompts_file"]
    if not args.prompts and not os.path.exists(prompts_path):   # relative to where dflash_eval ran: try eval.json's
        prompts_path = os.path.join(os.path.dirname(os.path.abspath(args.eval)), prompts_path)
    prompts = read_prompts(prompts_path, count)
    reference = read_continuations(args.reference, count) if args.reference else None
    if args.engine == "vllm":
        engine = run_vllm_offline(args, prompts, max_new, block)
    else:
        from .engine_http import run_server
        if not args.url:
            raise SystemExit(f"--engine {args.engine} needs --url (the running server's base URL)")
        engine = run_server(args.engine, args.url, args.model, prompts, max_new, block)
    results = [compare_prompt(i, ev["per_prompt"][i], engine["requests"][i], max_new, block, reference)
               for i in range(count)]
    report = summarize(ev, engine, results, block, max_new, args)
    if args.out:
        write_text_atomic(args.out, json.dumps(report, indent=1) + "\n")
    return 0 if report["agree"] else 1


def summarize(ev: dict, engine: dict, results: list, block: int, max_new: int, args) -> dict:
    ours_h = [sum(r["ours_histogram"][k] for r in results) for k in range(block + 1)]
    eng_h = [sum(r["engine_histogram"][k] for r in results if r["engine_histogram"] is not None)
             for k in range(block + 1)]
    tau = lambda h: sum(k * n for k, n in enumerate(h)) / sum(h) if sum(h) else float("nan")
    lossless = all(r["tokens_equal"] for r in results)
    ref_ok = all(r.get("reference_equal", True) for r in results)
    same = [r["prompt"] for r in results if r["acceptance_equal"]]
    differ = [r for r in results if not r["acceptance_equal"]]
    print(f"serve-check: {engine['engine']}{' (PATCHED: k_norm per layer)' if engine.get('patched') else ''}; "
          f"{len(results)} prompts x {max_new} tokens, block {block} (drafts per verify {block - 1})")
    print(f"  lossless: the engine's tokens == dflash_eval's on {sum(r['tokens_equal'] for r in results)}/"
          f"{len(results)} prompts" + (f"; == {args.reference} on {sum(r['reference_equal'] for r in results)}/"
                                       f"{len(results)}" if args.reference else ""))
    reported = [sum(r["engine_kept_reported"]) for r in results if "engine_kept_reported" in r]
    extra = ""
    if len(reported) == len(results):
        verifies = sum(len(r["engine_kept_reported"]) for r in results)
        extra = (f" (as the engine counts them, the last verify of each prompt unclipped: "
                 f"{sum(reported) / verifies:.4f})" if verifies else "")
    print(f"  tau (tokens kept per verify): dflash_eval {tau(ours_h):.4f} over {sum(ours_h)} verifies | engine "
          f"{tau(eng_h):.4f} over {sum(eng_h)}{extra}; dflash_eval's json says {ev.get('tau')}")
    print(f"  kept histogram  dflash_eval {ours_h}")
    print(f"                  engine      {eng_h}")
    print("  acceptance by position  " + " ".join(f"{j:>6}" for j in range(1, block)))
    print("    dflash_eval           " + " ".join(f"{a:6.3f}" for a in by_position(ours_h)))
    print("    engine                " + " ".join(f"{a:6.3f}" for a in by_position(eng_h)))
    print(f"  per prompt: acceptance equal on {len(same)}/{len(results)}")
    for r in differ[:10]:
        where = (f"first diverging verify {r['first_verify_difference']} (dflash_eval kept "
                 f"{r['ours_kept'][r['first_verify_difference']:][:6]}..., engine "
                 f"{r['engine_kept'][r['first_verify_difference']:][:6]}...)") if "first_verify_difference" in r \
            else f"histograms dflash_eval {r['ours_histogram']} engine {r['engine_histogram']}"
        tok = "" if r["tokens_equal"] else f"; tokens differ from token {r['first_token_difference']}"
        print(f"    prompt {r['prompt']}: {where}{tok}")
    if len(differ) > 10:
        print(f"    ... and {len(differ) - 10} more")
    if engine.get("read"):
        print("  the engine read: " + json.dumps(engine["read"]))
    agree = lossless and ref_ok and not differ
    print("  diagnosis: " + diagnose(results, engine, lossless, differ, block))
    print(f"serve-check: {'AGREES' if agree else 'DISAGREES'}")
    return {"agree": agree, "engine": engine["engine"], "patched": engine.get("patched", False),
            "read": engine.get("read"), "tau_ours": tau(ours_h), "tau_engine": tau(eng_h),
            "kept_histogram_ours": ours_h, "kept_histogram_engine": eng_h,
            "acceptance_by_position_ours": by_position(ours_h), "acceptance_by_position_engine": by_position(eng_h),
            "lossless": lossless, "reference_equal": ref_ok if args.reference else None,
            "prompts_equal": same, "prompts": results}


def diagnose(results: list, engine: dict, lossless: bool, differ: list, block: int) -> str:
    if lossless and not differ:
        return "none needed: the engine decodes and accepts exactly as dflash_eval does"
    notes = []
    if not lossless:
        notes.append("the engine's output differs from dflash_eval's: it does not run the same target greedily "
                     "(another model or revision, a dtype whose rounding flips near-ties, a vocabulary limit: "
                     "dflash_eval keeps the mask token out when it is the last id unless --vocab-limit says "
                     "otherwise); acceptance compares only where the outputs agree")
    read = engine.get("read") or {}
    if read:
        if read.get("num_speculative_tokens") not in (None, block - 1):
            notes.append(f"the engine drafts {read['num_speculative_tokens']} tokens per verify, the drafter was "
                         f"trained for block_size - 1 = {block - 1}")
        causal = [l.get("causal") for l in read.get("layers", [])]
        if any(causal) and read.get("layer_types") and \
                any(c != (t == 'sliding_attention') for c, t in zip(causal, read["layer_types"])):
            notes.append(f"per-layer causality {causal} does not follow layer_types {read['layer_types']} (the "
                         "drafter trains full layers bidirectional inside the block, sliding layers causal)")
    first = [r.get("first_verify_difference") for r in differ if "first_verify_difference" in r]
    if first and all(v == 0 for v in first) and len(differ) > len(results) // 2:
        notes.append("most prompts differ from their first verify on: the drafter computes something else in the "
                     "engine (config keys read differently: mask token, target layer ids, layer types/window, "
                     "rope; or an engine defect such as vLLM CPU's stacked k_norm, --patch-vllm-k-norm)")
    elif differ and not first:
        notes.append(f"{len(differ)} prompts differ; a server reports only per-prompt counts, so the first diverging "
                     "verify is not known: run the same check with --engine vllm (offline) for it")
    elif differ:
        notes.append(f"{len(differ)} prompts differ, first at verifies {first[:10]}: a difference that shows only "
                     "later in a prompt (near-tied logits in another precision, a window or position past some "
                     "length, the KV cache of the drafter's context)")
    if read.get("num_hidden_layers", 0) > 1 and "CPU" in engine.get("engine", "") and not engine.get("patched"):
        notes.append("vLLM's CPU build applies layer 0's k_norm to every drafter layer's context keys: rerun with "
                     "--patch-vllm-k-norm to see whether that is all")
    return "; ".join(notes)
