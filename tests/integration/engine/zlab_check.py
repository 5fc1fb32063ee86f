#!/usr/bin/env python3
"""Our export loads in z-lab's DFlash package (`dflash`, the reference code of the published DFlash drafters) and
computes what our own modeling_dflash.py computes. Run by engine_vllm.sh with the vLLM environment's Python
(data/prep/.venv-vllm: torch, transformers, dflash==0.1.0).

    zlab_check.py EXPORT_DIR...

For each export: z-lab's DFlashDraftModel.from_pretrained(DIR) (its config_class is transformers' Qwen3Config,
which reads our config.json) has no missing or unexpected weight; on random taps of S = 3 * block_size context
positions and a random block at the positions after them (the anchor at S, the way z-lab's decoding loop calls it)
its final hidden states equal ours (AutoModel with trust_remote_code, anchors = [S]), both loaded in float64, within
1e-5 of the largest value: z-lab's RMSNorm and RoPE (transformers' Qwen3 modules) compute in float32 whatever the
dtype (measured 1.4e-7); a mask, position or window off by one moves the output by more than 1e-2. An export with a sliding layer checks the window convention too (a window shorter than S: which
context keys a sliding query sees, causal inside the block), which vLLM's CPU build cannot serve."""
import sys

import torch
from transformers import AutoModel
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()


def need(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def main():
    from dflash.model import DFlashDraftModel as ZLab
    for d in sys.argv[1:]:
        ours = AutoModel.from_pretrained(d, trust_remote_code=True, dtype=torch.float64).eval()
        zlab, info = ZLab.from_pretrained(d, dtype=torch.float64, output_loading_info=True)
        zlab.eval()
        for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            need(not info.get(k), f"{d}: z-lab's DFlashDraftModel: {k} {info.get(k)}")
        cfg = ours.config
        need(zlab.target_layer_ids == cfg.target_layer_ids and zlab.mask_token_id == cfg.mask_token_id and
             zlab.block_size == cfg.block_size,
             f"{d}: z-lab read target_layer_ids {zlab.target_layer_ids}, mask {zlab.mask_token_id}, block "
             f"{zlab.block_size}; ours {cfg.target_layer_ids}, {cfg.mask_token_id}, {cfg.block_size}")
        B, H = cfg.block_size, cfg.hidden_size
        S = 3 * B
        g = torch.Generator().manual_seed(7)
        taps = torch.randn(1, S, len(cfg.target_layer_ids) * H, generator=g, dtype=torch.float64)
        block = torch.randn(1, B, H, generator=g, dtype=torch.float64)
        with torch.no_grad():
            a = ours(target_hidden=taps, inputs_embeds=block, anchors=torch.tensor([[S]])).last_hidden_state
            b = zlab(position_ids=torch.arange(S + B)[None], noise_embedding=block, target_hidden=taps)
        rel = float((a - b).abs().max() / a.abs().max())
        print(f"  {d}: layer_types {cfg.layer_types} (window {cfg.sliding_window}): z-lab dflash vs ours, "
              f"rel {rel:.2e} (bound 1e-5)")
        need(rel <= 1e-5, f"{d}: z-lab's forward differs from ours by {rel:.2e}")
    print(f"PASS: z-lab's dflash package loads {len(sys.argv) - 1} exports and computes our forward")


if __name__ == "__main__":
    main()
