#!/usr/bin/env python3
"""An export loads with transformers and computes the trainer's forward (export_hf.sh runs this; see there).

    test_export_hf.py --f32 DIR --f32-dump FILE --bf16 DIR --bf16-dump FILE

DIR: an export (dflash_mpi --export), FILE: drafter_forward_dump's forward of that export (the C++ drafter_forward in
float and double on two fixed sequences, with the inputs and a stand-in for the target's embedding and lm_head).
Asserts, printing every measured difference (rel = max |python - c++| / max |c++| over the tensor):

  1. AutoModel.from_pretrained(DIR, trust_remote_code=True) gives DFlashDraftModel from the export's
     modeling_dflash.py, with no missing or unexpected weight, every weight equal to the file's; auto_map names
     only AutoModel (as z-lab's drafters), so AutoConfig gives transformers' Qwen3Config, from which the model
     takes its DFlashConfig (the facts below, RoPE's base included);
  2. float64 (weights widened from the file): final hidden states and logits vs the C++ double forward,
     rel <= 1e-12. Both compute the same expression in double (the angles of RoPE, the softmax, the norms); what
     remains is the order of the sums, ~1e-16 per operation through 3 layers: a wrong mask, position, norm or
     head grouping moves them by far more than 1e-3;
  3. float32: vs the C++ float forward and vs the double one, rel <= 1e-5 (float rounding, 6e-8 per operation,
     grows through the layers' norms and softmax to ~1e-6; the bound leaves 10x);
  4. the bf16 export read as float64: vs the C++ double forward of that export, rel <= 1e-12 (bf16 weights widen
     exactly on both sides); read as its own dtype (bfloat16, the config's dtype), rel <= 5e-2 against the
     double forward (measured 1e-2): bf16 activations keep 8 bits (relative step 2^-8 = 0.4%) and the rounding of
     ~30 operations in a row adds up to about 1% of the largest value;
  5. the model's own contract: an unbatched call equals its batch row (1e-14), the second sequence's padding
     rows (context past its length) change none of its outputs, output_hidden_states gives L + 1 states.
"""
import argparse
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()

F64, F32 = torch.float64, torch.float32


def rel(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).abs().max() / ref.abs().max())


def check(name, got, ref, bound):
    r = rel(got, ref)
    print(f"  {name}: rel {r:.3e} (bound {bound:.0e})")
    if not r <= bound:
        sys.exit(f"FAIL: {name}: rel {r:.3e} > {bound:.0e}")


def need(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def load(path, dtype):
    model, info = AutoModel.from_pretrained(path, trust_remote_code=True, dtype=dtype, output_loading_info=True)
    need(type(model).__name__ == "DFlashDraftModel", f"{path}: AutoModel gave {type(model).__name__}")
    need(type(model).__module__.split(".")[-1] == "modeling_dflash",
         f"{path}: the model class comes from {type(model).__module__}, not the export's modeling_dflash.py")
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        need(not info.get(key), f"{path}: {key} {info.get(key)}")
    return model.eval()


def forward(model, d, taps=None):
    """The dump's batch through the model: the block inputs embedded with the target's (stand-in) embedding."""
    dtype = model.fc.weight.dtype
    embed = torch.nn.Embedding.from_pretrained(d["embed"].to(dtype))
    lm_head = torch.nn.Linear(d["lm_head"].shape[1], d["lm_head"].shape[0], bias=False, dtype=dtype)
    lm_head.weight.data.copy_(d["lm_head"].to(dtype))
    with torch.no_grad():
        out = model(target_hidden=(d["taps"] if taps is None else taps).to(dtype), inputs_embeds=embed(d["block_ids"]),
                    anchors=d["anchors"]).last_hidden_state
        return out, lm_head(out)


def main():
    ap = argparse.ArgumentParser()
    for k in ("f32", "f32-dump", "bf16", "bf16-dump"):
        ap.add_argument("--" + k, required=True)
    a = ap.parse_args()
    d32, d16 = load_file(a.f32_dump), load_file(a.bf16_dump)

    print(f"1. {a.f32}: AutoConfig / AutoModel with trust_remote_code")
    qwen3 = AutoConfig.from_pretrained(a.f32, trust_remote_code=True)
    need(type(qwen3).__name__ == "Qwen3Config", f"AutoConfig gave {type(qwen3).__name__} (auto_map names AutoModel only)")
    m64 = load(a.f32, F64)
    cfg = m64.config
    need(type(cfg).__name__ == "DFlashConfig", f"the model's config is {type(cfg).__name__}")
    need(cfg.target_layer_ids == [1, 4, 6] and cfg.mask_token_id == 100 and cfg.block_size == 4,
         f"config facts: {cfg.target_layer_ids}, {cfg.mask_token_id}, {cfg.block_size}")
    need(cfg.layer_types == ["full_attention", "sliding_attention", "full_attention"] and cfg.sliding_window == 6,
         f"layer types {cfg.layer_types}, window {cfg.sliding_window}")
    need(cfg.rope_theta == qwen3.rope_parameters["rope_theta"] and cfg.rms_norm_eps == qwen3.rms_norm_eps,
         f"rope_theta {cfg.rope_theta} / eps {cfg.rms_norm_eps} lost on the way from Qwen3Config")
    weights = load_file(f"{a.f32}/model.safetensors")
    state = m64.state_dict()
    need(sorted(state) == sorted(weights), f"parameters {sorted(set(state) ^ set(weights))} differ from the file's")
    for k, w in weights.items():
        need(torch.equal(state[k], w.to(F64)), f"weight {k} differs from the file's")
    print(f"  {len(weights)} tensors, all equal to model.safetensors")

    print("2. float64 vs the C++ double forward (f32 export)")
    out, logits = forward(m64, d32)
    check("final hidden", out, d32["out_f64"], 1e-12)
    check("logits", logits, d32["logits_f64"], 1e-12)

    print("3. float32 vs the C++ float and double forwards")
    m32 = load(a.f32, F32)
    out32, logits32 = forward(m32, d32)
    check("final hidden vs float", out32, d32["out_f32"], 1e-5)
    check("final hidden vs double", out32, d32["out_f64"], 1e-5)
    check("logits vs float", logits32, d32["logits_f32"], 1e-5)
    check("C++ float vs C++ double (for scale)", d32["out_f32"], d32["out_f64"], 1e-5)

    print(f"4. {a.bf16}: bf16 weights")
    b64 = load(a.bf16, F64)
    out, logits = forward(b64, d16)
    check("read as float64: final hidden vs C++ double", out, d16["out_f64"], 1e-12)
    check("read as float64: logits vs C++ double", logits, d16["logits_f64"], 1e-12)
    bauto = load(a.bf16, "auto")
    need(bauto.fc.weight.dtype == torch.bfloat16, f"dtype='auto' gave {bauto.fc.weight.dtype}, config says bfloat16")
    outb, logitsb = forward(bauto, d16)
    check("read as bfloat16: final hidden vs C++ double", outb, d16["out_f64"], 5e-2)
    check("read as bfloat16: logits vs C++ double", logitsb, d16["logits_f64"], 5e-2)

    print("5. the model's contract")
    with torch.no_grad():
        embed = torch.nn.Embedding.from_pretrained(d32["embed"].to(F64))
        one = m64(target_hidden=d32["taps"][1].to(F64), inputs_embeds=embed(d32["block_ids"][1]),
                  anchors=d32["anchors"][1]).last_hidden_state
        full, _ = forward(m64, d32)
        check("unbatched call vs its batch row", one, full[1], 1e-14)  # the same sums, maybe another BLAS order
        taps = d32["taps"].clone()
        n = int(d32["seq_len"][1])
        taps[1, n:] = 1e3 * torch.randn_like(taps[1, n:])
        padded, _ = forward(m64, d32, taps)
        need(torch.equal(padded[1], full[1]), "the padding rows of the second sequence changed its outputs")
        hs = m64(target_hidden=d32["taps"].to(F64), inputs_embeds=embed(d32["block_ids"]), anchors=d32["anchors"],
                 output_hidden_states=True).hidden_states
        need(len(hs) == m64.config.num_hidden_layers + 1, f"{len(hs)} hidden states")
    print("  unbatched == batched, padding unread, hidden_states L + 1")
    print("PASS (test_export_hf.py)")


if __name__ == "__main__":
    main()
