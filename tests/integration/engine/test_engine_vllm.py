#!/usr/bin/env python3
"""The engine half of engine_vllm.sh (see there): vLLM offline serves the exports in WORK, compared with dflash_eval.

    test_engine_vllm.py --work WORK --vllm-python PY --src SOURCE_DIR     (PYTHONPATH=data/prep, dflash-prep's Python)

Asserts, exactly (no tolerance anywhere):
  1. one vLLM process, three engines: the f32 export unpatched, the f32 and bf16 exports with the k_norm patch;
  2. every engine's tokens == dflash_eval's (plain greedy of our target) == dflash_data regenerate's;
  3. patched: per prompt, the kept tokens of every verify == dflash_eval's, the engine's last verify clipped to what
     max_new_tokens leaves (dflash_eval's convention; vLLM counts the drafts accepted past it), so τ, the kept
     histogram and the acceptance per position are equal; and the clipping mattered on some prompt (else this
     would not test the convention);
  4. unpatched: acceptance differs on some prompt (vLLM CPU's stacked k_norm defect is still in the pinned vLLM);
  5. what vLLM resolved from config.json: method dflash, num_speculative_tokens = block_size - 1, the mask token,
     target layers (vLLM's aux index = our layer + 1), every layer full and non-causal;
  6. the serving gate through the user's command: `dflash-prep serve-check --engine vllm --patch-vllm-k-norm` on the
     overfit drafter's export exits 0 (agrees) and the engine keeps full blocks (B tokens) on most verifies."""
import argparse
import json
import os
import subprocess
import sys
from types import SimpleNamespace

from dflash_prep import serve_check as sc


def need(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--src", required=True)
    a = ap.parse_args()
    os.chdir(a.work)
    evals = {e: json.load(open(f"eval_{e}.json")) for e in ("f32", "bf16")}
    ev = evals["f32"]
    block, max_new, count = ev["block_size"], ev["max_new_tokens"], ev["prompts"]
    prompts = sc.read_prompts("prompts.h5", count)
    reference = sc.read_continuations("reference.h5", count)
    runs = [("f32", False), ("f32", True), ("bf16", True)]
    request = {"target": os.path.abspath("target"), "prompts": prompts, "max_tokens": max_new, "dtype": "float32",
               "max_model_len": max(len(p) for p in prompts) + max_new + 2 * block,
               "runs": [{"drafter": os.path.abspath(e), "patch_k_norm": patched} for e, patched in runs]}
    json.dump(request, open("engine_request.json", "w"))
    p = subprocess.run([a.vllm_python, os.path.join(a.src, "data/prep/dflash_prep/engine_vllm.py"),
                        "engine_request.json", "engine_result.json"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    open("engine.log", "w").write(p.stdout)
    print("\n".join(l for l in p.stdout.splitlines() if l.startswith("engine_vllm:")))
    need(p.returncode == 0, f"the vLLM engine failed (exit {p.returncode}):\n{p.stdout[-3000:]}")
    result = json.load(open("engine_result.json"))
    print(f"vLLM {result['vllm']} ({result['platform']}), torch {result['torch']}")

    for (export, patched), run in zip(runs, result["runs"]):
        ev = evals[export]
        print(f"\n=== {export} export, {'PATCHED (k_norm per layer)' if patched else 'unpatched vLLM'} "
              f"({run['seconds']:.1f} s)")
        if patched:
            print("!!! vLLM is PATCHED in this run: DFlashQwen3Model._normalize_context_k does one rms_norm per "
                  "layer (vLLM's CPU kernel reads only layer 0's k_norm; docs/export.md)")
        results = [sc.compare_prompt(i, ev["per_prompt"][i], run["requests"][i], max_new, block, reference)
                   for i in range(count)]
        report = sc.summarize(ev, {"engine": f"vLLM {result['vllm']}", "patched": patched, "read": run["read"],
                                   "requests": run["requests"]}, results, block, max_new,
                              SimpleNamespace(reference="reference.h5"))
        need(report["lossless"], f"{export}: the engine's tokens differ from dflash_eval's")
        need(report["reference_equal"], f"{export}: the engine's tokens differ from dflash_data regenerate's")
        need(all(r["engine_drafted"] == [block - 1] for r in results),
             f"{export}: the engine did not draft block_size - 1 = {block - 1} tokens per verify")
        read = run["read"]
        cfg = json.load(open(os.path.join(export, "config.json")))
        need(read["method"] == "dflash" and read["num_speculative_tokens"] == block - 1, f"read {read}")
        need(read["mask_token_id"] == cfg["dflash_config"]["mask_token_id"], f"mask token read {read}")
        need(read["target_layer_ids"] == [l + 1 for l in cfg["dflash_config"]["target_layer_ids"]],
             f"target layers read {read['target_layer_ids']} for ours {cfg['dflash_config']['target_layer_ids']}")
        need(all(l == {"sliding_window": None, "causal": False} for l in read["layers"]), f"layers read {read}")
        if patched:
            need(report["agree"], f"{export}: the patched engine disagrees with dflash_eval (above)")
            ours_kept = sum(sum(q["kept"]) for q in ev["per_prompt"])
            need(sum(report["kept_histogram_engine"]) == ev["verify_forwards"] and
                 sum(k * n for k, n in enumerate(report["kept_histogram_engine"])) == ours_kept and
                 report["kept_histogram_engine"] == ev["kept_histogram"],
                 f"{export}: totals differ from eval_{export}.json")
            clipped = [r["prompt"] for r in results if r["engine_kept_reported"] != r["engine_kept"]]
            need(clipped, "no prompt's last verify went past max_new_tokens: the convention is not exercised")
            print(f"  the last-verify convention: on prompts {clipped} vLLM counted drafts accepted past "
                  f"max_new_tokens (kept {[results[i]['engine_kept_reported'][-1] for i in clipped]}, dflash_eval "
                  f"{[results[i]['engine_kept'][-1] for i in clipped]})")
            print(f"PASS: {export} export: vLLM == dflash_eval on every prompt and verify (tau "
                  f"{report['tau_engine']:.4f} == {ev['tau']:.4f})")
        else:
            differ = [r["prompt"] for r in results if not r["acceptance_equal"]]
            need(differ, "unpatched vLLM agrees with dflash_eval: the pinned vLLM no longer has the stacked k_norm "
                 "defect; drop --patch-vllm-k-norm from this test and update docs/export.md")
            print(f"PASS: unpatched vLLM {result['vllm']} still has the CPU k_norm defect: acceptance differs on "
                  f"prompts {differ} (tau {report['tau_engine']:.4f} vs {ev['tau']:.4f}); tokens stay lossless")

    # 6. the serving gate, through the user's command
    print("\n=== the serving gate: one sequence overfit, `dflash-prep serve-check --engine vllm --patch-vllm-k-norm`")
    p = subprocess.run([os.path.join(a.src, "data/prep/dflash-prep"), "serve-check", "--eval", "eval_gate.json",
                        "--target", "target", "--drafter", "gate", "--engine", "vllm", "--vllm-python",
                        a.vllm_python, "--patch-vllm-k-norm", "--reference", "gate_reference.h5",
                        "--out", "gate_check.json"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    open("gate.log", "w").write(p.stdout)
    print("\n".join(l for l in p.stdout.splitlines() if l.startswith(("serve-check", "  ", "engine_vllm:"))))
    need(p.returncode == 0, f"serve-check exited {p.returncode} on the gate")
    gate = json.load(open("gate_check.json"))
    h = gate["kept_histogram_engine"]
    full = h[block] / sum(h)
    need(gate["agree"] and full >= 0.75, f"the engine kept full blocks on {full:.0%} of the verifies (>= 75%)")
    print(f"PASS: serving gate: vLLM keeps full blocks ({block} tokens) on {h[block]}/{sum(h)} verifies, tau "
          f"{gate['tau_engine']:.3f} == dflash_eval's {gate['tau_ours']:.3f}")


if __name__ == "__main__":
    main()
