"""vLLM offline, in-process, for `dflash-prep serve-check --engine vllm` (serve_check.py runs this file with the Python
of an environment that has vLLM, e.g. data/prep/.venv-vllm; it imports nothing of dflash_prep, whose pins differ).

    python engine_vllm.py REQUEST.json RESULT.json

REQUEST: {"target": DIR, "runs": [{"drafter": DIR, "patch_k_norm": bool[, "prompts", "max_tokens"]}, ...],
          "prompts": [[ids], ...], "max_tokens": N, "dtype": "float32", "max_model_len": N, "kv_cache_bytes": N}
          (a run's own "prompts" / "max_tokens" replace the request's)
RESULT:  {"vllm": version, "torch": version, "platform": ..., "runs": [{"drafter", "patched", "seconds",
          "read": {what the engine resolved from the drafter's config.json}, "requests": [{"tokens": [...],
          "verifies": [[drafted, accepted], ...]}, ...]}, ...]}

One engine per run (the target with that drafter: method "dflash", num_speculative_tokens = block_size - 1, greedy,
token ids in and out: skip_tokenizer_init). The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
so that its scheduler can be observed: every verify of every request, as the scheduler counts it for vLLM's own
spec-decode metrics (Scheduler.make_spec_decoding_stats: drafts proposed, drafts accepted), is recorded per request.

patch_k_norm: vLLM's DFlash model (vllm/model_executor/models/qwen3_dflash.py, DFlashQwen3Model.
_normalize_context_k) normalises the context keys of all drafter layers in one rms_norm call with the layers'
k_norm weights stacked [L, head_dim]; vLLM's CPU rms_norm kernel reads only the first row of such a weight, so every
layer after the first runs with layer 0's k_norm (docs/export.md, "vLLM"). The patch replaces that method by one
rms_norm call per layer with its own weight, the same kernel otherwise. It is printed loudly wherever it is applied."""
import json
import os
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # the engine core in this process: its scheduler is observable


def main():
    request = json.load(open(sys.argv[1]))
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform
    from vllm.v1.core.sched.scheduler import Scheduler

    verifies = {}   # the scheduler's request id -> [[drafted, accepted], ...] in order
    observed = Scheduler.make_spec_decoding_stats

    def observe(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                request_id):
        drafted = num_draft_tokens - (num_invalid_spec_tokens or {}).get(request_id, 0)
        if num_draft_tokens:
            verifies.setdefault(request_id, []).append([drafted, num_accepted_tokens])
        return observed(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                        request_id)

    Scheduler.make_spec_decoding_stats = observe

    from vllm.model_executor.models import qwen3_dflash
    unpatched = qwen3_dflash.DFlashQwen3Model._normalize_context_k
    from vllm import _custom_ops as ops

    def normalize_context_k_per_layer(self, all_k):
        # all_k [L, num_ctx, nkv, hd] contiguous: layer i with its own k_norm weight (the stacked call reads row 0)
        out = torch.empty_like(all_k)
        for i in range(all_k.shape[0]):
            ops.rms_norm(out[i], all_k[i], self._k_norm_weights[i].contiguous(), self._rms_norm_eps)
        return out

    result = {"vllm": vllm.__version__, "torch": torch.__version__, "platform": type(current_platform).__name__,
              "runs": []}
    for run in request["runs"]:
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in run.get("prompts", request["prompts"])]
        sampling = SamplingParams(temperature=0.0, max_tokens=int(run.get("max_tokens", request["max_tokens"])),
                                  ignore_eos=True, detokenize=False)
        drafter = run["drafter"]
        config = json.load(open(os.path.join(drafter, "config.json")))
        patched = bool(run.get("patch_k_norm"))
        qwen3_dflash.DFlashQwen3Model._normalize_context_k = normalize_context_k_per_layer if patched else unpatched
        if patched:
            print("engine_vllm: PATCHED vLLM: DFlashQwen3Model._normalize_context_k runs one rms_norm per drafter "
                  "layer (vLLM's CPU kernel reads only row 0 of the stacked k_norm weights; docs/export.md)",
                  flush=True)
        verifies.clear()
        start = time.time()
        # the CPU build reserves a share of all memory for the KV cache unless told a size; a GPU sizes its own
        kv_bytes = request.get("kv_cache_bytes") or (256 << 20 if current_platform.is_cpu() else None)
        memory = {"kv_cache_memory_bytes": int(kv_bytes)} if kv_bytes else {}
        llm = LLM(model=request["target"], skip_tokenizer_init=True, dtype=request.get("dtype", "float32"),
                  enforce_eager=True, max_model_len=int(request["max_model_len"]), seed=0, disable_log_stats=False,
                  max_num_seqs=min(len(prompts), 64), **memory,
                  speculative_config={"method": "dflash", "model": drafter,
                                      "num_speculative_tokens": int(config["block_size"]) - 1})
        read = resolved_config(llm, qwen3_dflash)
        outputs = llm.generate(prompts, sampling, use_tqdm=False)
        requests = []
        for out in outputs:
            mine = [v for rid, v in verifies.items() if rid.split("-")[0] == out.request_id]
            if len(mine) > 1:
                raise SystemExit(f"engine_vllm: request {out.request_id}: {len(mine)} scheduler requests match")
            requests.append({"tokens": [int(t) for t in out.outputs[0].token_ids], "verifies": mine[0] if mine else []})
        result["runs"].append({"drafter": drafter, "patched": patched, "seconds": time.time() - start,
                               "read": read, "requests": requests})
        del llm
        import gc
        gc.collect()
    json.dump(result, open(sys.argv[2], "w"))


def resolved_config(llm, qwen3_dflash):
    """What vLLM made of the drafter's config.json, through its own functions: the method and draft count, the
    tapped target layers, the mask token, and per drafter layer the sliding window and causality."""
    from vllm.config import set_current_vllm_config
    vllm_config = llm.llm_engine.vllm_config
    spec = vllm_config.speculative_config
    hf = spec.draft_model_config.hf_config
    dflash = dict(getattr(hf, "dflash_config", None) or {})
    read = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
            "architectures": list(getattr(hf, "architectures", None) or []),
            "mask_token_id": dflash.get("mask_token_id", getattr(hf, "mask_token_id", None)),
            "num_hidden_layers": hf.num_hidden_layers, "hidden_size": hf.hidden_size,
            "head_dim": getattr(hf, "head_dim", None), "rms_norm_eps": hf.rms_norm_eps,
            "rope": dict(getattr(hf, "rope_parameters", None) or {}),
            "layer_types": list(getattr(hf, "layer_types", None) or []),
            "sliding_window": getattr(hf, "sliding_window", None)}
    try:
        from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import get_eagle3_aux_layers_from_config
        read["target_layer_ids"] = list(get_eagle3_aux_layers_from_config(spec) or [])
    except Exception as e:   # another vLLM: say what could not be read rather than fail the check
        read["target_layer_ids"] = f"not read ({type(e).__name__}: {e})"
    layers = []
    with set_current_vllm_config(vllm_config):
        for i in range(hf.num_hidden_layers):
            window, causal = qwen3_dflash._resolve_layer_attention(hf, i)
            layers.append({"sliding_window": window, "causal": causal})
    read["layers"] = layers
    return read


if __name__ == "__main__":
    main()
