#!/usr/bin/env python3
"""Golden fixtures for the Qwen3-MoE target (Qwen3MoeForCausalLM), made by Hugging Face transformers.

    python3 -m venv /tmp/moe-venv && /tmp/moe-venv/bin/pip install -r tests/golden_moe/requirements.txt
    /tmp/moe-venv/bin/python tests/golden_moe/make_golden.py tests/golden_moe
    /tmp/moe-venv/bin/python tests/golden_moe/make_golden.py --from-model DIR
        (golden.safetensors for an existing model folder, e.g. one `dflash_data make-target --arch qwen3_moe`
         wrote, either --expert-layout: then `moe_golden_check --model DIR` compares our forward with transformers)

Two tiny random models (hidden 64, 3 layers, 6 Q / 2 KV heads of 8, vocab 128, one dense `mlp_only_layers` layer):
    per_expert/   6 experts top-2, norm_topk_prob true, mlp_only_layers [1], untied; the checkpoint as
                  save_pretrained writes it: per-expert tensors mlp.experts.{e}.{gate,up,down}_proj.weight
    fused/        7 experts top-3, norm_topk_prob false, mlp_only_layers [2], tied embeddings; the checkpoint
                  rewritten with the experts fused and 3-D, no .weight suffix (mlp.experts.gate_up_proj [E, 2I, H],
                  each expert's gate rows then its up rows; mlp.experts.down_proj [E, H, I]), which transformers
                  loads as it is (its own parameter layout); the script checks that both layouts load to the same
                  model
    qwen3_5_moe/  the Qwen3.5/3.6 MoE hybrid as released: Qwen3_5MoeForConditionalGeneration (text model under
                  model.language_model., a tiny vision tower, an injected mtp.* weight), hidden 32, layers [linear,
                  full, linear, full] (6 Q / 2 KV heads of 8; DeltaNet 2 key / 6 value heads of 8), 7 experts top-2
                  (the router always renormalises), a shared expert of 24 gated by sigmoid(shared_expert_gate(x)),
                  experts fused (the published BF16 layout)
Expert counts 6 and 7 do not divide the TP sizes 5 (and 4, 7 not 2 or 3). Weights are random (not HF's init) and
rounded to bf16, stored bf16 (exact), so the fp32 forward of transformers and ours read the same numbers:
RMSNorm weights 1 + N(0, 0.2²), linear weights (router and experts included) N(0, 1/in), embedding N(0, 1).
moe_intermediate_size 24: 2·24 ≠ hidden 64, so a transposed fused tensor cannot pass the shape check.

Each <name>/golden.safetensors holds, all F32, for S in LENGTHS:
    tokens.s{S}         [S]          the prompt's token ids
    layers.s{S}         [L, S, H]    raw output of every decoder layer (the drafter's taps; HF hidden_states[l+1])
    final.s{S}          [S, H]       final RMSNorm of the last layer (HF last_hidden_state)
    logits.s{S}         [8, V]       logits of the last 8 positions
    greedy.s{S}         [G]          generate()'s greedy continuation
    margin.s{S}         [G]          top-1 minus top-2 logit at each greedy step
    router_margin.s{S}  [moe layers] min over tokens of the k-th minus the (k+1)-th largest router logit: how far
                                     the expert choice is from a tie (a tiny margin would make a fixture fragile)
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

LENGTHS = (30, 70)
GREEDY = 6
LOGIT_ROWS = 8


def config(**over):
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=3,
                num_attention_heads=6, num_key_value_heads=2, head_dim=8, num_experts=6, num_experts_per_tok=2,
                norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                max_position_embeddings=4096)
    base.update(over)
    return Qwen3MoeConfig(**base)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            n = torch.randn(p.shape, generator=g)
            if "norm" in name and p.dim() == 1:
                v = 1.0 + 0.2 * n
            elif "embed_tokens" in name:
                v = n
            else:  # linear weights [out, in] and the experts' [E, out, in]: N(0, 1/in)
                v = n / p.shape[-1] ** 0.5
            p.copy_(v.bfloat16().float())


def to_bf16_file(path):
    w = load_file(path)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in w.items()}, path, metadata={"format": "pt"})


def fuse_experts(path, cfg, prefix="model."):
    """Per-expert tensors → transformers' fused 3-D parameters (gate rows then up rows), in place."""
    w = load_file(path)
    E = cfg.num_experts
    for l in range(cfg.num_hidden_layers):
        p = f"{prefix}layers.{l}.mlp.experts."
        if p + "0.gate_proj.weight" not in w:
            continue
        gate_up = [torch.cat([w.pop(f"{p}{e}.gate_proj.weight"), w.pop(f"{p}{e}.up_proj.weight")]) for e in range(E)]
        down = [w.pop(f"{p}{e}.down_proj.weight") for e in range(E)]
        w[p + "gate_up_proj"] = torch.stack(gate_up).contiguous()
        w[p + "down_proj"] = torch.stack(down).contiguous()
    save_file(w, path, metadata={"format": "pt"})


def capture(model, tokens, text_model=None):
    text_model = text_model if text_model is not None else model.model
    k = text_model.config.num_experts_per_tok
    outs, routers = [], []
    hooks = [layer.register_forward_hook(lambda m, i, o: outs.append((o[0] if isinstance(o, tuple) else o).detach()))
             for layer in text_model.layers]
    for layer in text_model.layers:
        if hasattr(layer.mlp, "gate"):
            hooks.append(layer.mlp.gate.register_forward_hook(lambda m, i, o: routers.append(o[0].detach())))
    ids = torch.tensor([tokens])
    with torch.no_grad():
        r = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    for h in hooks:
        h.remove()
    layers = torch.stack([o[0] for o in outs])  # [L, S, H]
    for l in range(layers.shape[0] - 1):
        assert torch.equal(r.hidden_states[l + 1][0], layers[l]), f"hidden_states[{l + 1}] differs from layer {l}"
    final = text_model.norm(layers[-1]).detach()
    router_margin = []
    for z in routers:  # [S, E]
        top = torch.topk(z.float(), k + 1, dim=-1).values
        router_margin.append(float((top[:, k - 1] - top[:, k]).min()))
    with torch.no_grad():
        # an explicit all-ones mask: without one, generate() masks out every prompt token equal to pad_token_id
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=GREEDY,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    greedy = gen.sequences[0, len(tokens):]
    margins = [float(t[0] - t[1]) for t in (torch.topk(s[0].float(), 2).values for s in gen.logits)]
    # generate()'s first step must be the full forward's last logits (same inputs, same model)
    assert torch.allclose(gen.logits[0][0], r.logits[0, -1], atol=1e-4, rtol=0), "generate() saw other inputs"
    assert int(r.logits[0, -1].argmax()) == int(greedy[0])
    return (layers.float(), final.float(), r.logits[0, -LOGIT_ROWS:].float(), greedy, torch.tensor(margins),
            torch.tensor(router_margin))


def write_golden(d, model, seed, text_model=None):
    golden, summary = {}, {"model": d, "lengths": {}}
    g = torch.Generator().manual_seed(seed + 1000)
    vocab = (text_model if text_model is not None else model.model).config.vocab_size
    for S in LENGTHS:
        tokens = torch.randint(0, vocab, (S,), generator=g).tolist()
        layers, final, logits, greedy, margins, router_margin = capture(model, tokens, text_model)
        sfx = f".s{S}"
        golden["tokens" + sfx] = torch.tensor(tokens, dtype=torch.float32)
        golden["layers" + sfx] = layers.contiguous()
        golden["final" + sfx] = final.contiguous()
        golden["logits" + sfx] = logits.contiguous()
        golden["greedy" + sfx] = greedy.float()
        golden["margin" + sfx] = margins.float()
        golden["router_margin" + sfx] = router_margin.float()
        summary["lengths"][S] = {"greedy": greedy.tolist(), "min_margin": float(margins.min()),
                                 "router_margin": router_margin.tolist()}
    save_file(golden, os.path.join(d, "golden.safetensors"), metadata={"format": "pt"})
    print(json.dumps(summary))


def from_model(d):
    with open(os.path.join(d, "config.json")) as f:
        model_type = json.load(f)["model_type"]
    if model_type == "qwen3_5_moe_text":  # make-target --arch qwen3_5_moe: the causal-LM layout
        from transformers import Qwen3_5MoeForCausalLM
        model = Qwen3_5MoeForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    elif model_type == "qwen3_5_moe":
        model = Qwen3_5MoeForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
        return write_golden(d, model, 5, model.model.language_model)
    else:
        model = Qwen3MoeForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    write_golden(d, model, 5)


def make(out_dir, name, seed, fused, over):
    torch.manual_seed(seed)
    cfg = config(**over)
    model = Qwen3MoeForCausalLM(cfg).float().eval()
    randomize(model, seed)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    os.remove(os.path.join(d, "generation_config.json"))
    path = os.path.join(d, "model.safetensors")
    to_bf16_file(path)
    written = sorted(load_file(path).keys())
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in written), "save_pretrained no longer writes per expert"
    if fused:
        fuse_experts(path, cfg)
    # the fixture is what transformers computes from these files
    loaded = Qwen3MoeForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    for (n1, p1), (n2, p2) in zip(sorted(model.named_parameters()), sorted(loaded.named_parameters())):
        assert n1 == n2 and torch.equal(p1, p2), f"{n1} did not load back from {name}"
    write_golden(d, loaded, seed)


def randomize_hybrid(model, seed):
    """Qwen3.5 conventions: RMSNorm weights are offsets (applied as 1 + w), DeltaNet's own parameters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            n = torch.randn(p.shape, generator=g)
            if name.endswith("A_log"):
                v = torch.empty(p.shape).uniform_(0.05, 2.0, generator=g).log()
            elif name.endswith("dt_bias"):
                v = 0.5 * n
            elif name.endswith("linear_attn.norm.weight"):
                v = 1.0 + 0.2 * n
            elif "norm" in name and p.dim() == 1:
                v = 0.2 * n
            elif name.endswith("conv1d.weight"):
                v = n / p.shape[-1] ** 0.5
            elif "embed_tokens" in name:
                v = n
            elif p.dim() >= 2:
                v = n / p.shape[-1] ** 0.5
            else:
                v = 0.1 * n
            p.copy_(v.bfloat16().float())


def make_qwen3_5_moe(out_dir, name, seed):
    """The Qwen3.5/3.6 MoE hybrid as released: Qwen3_5MoeForConditionalGeneration (text model under
    model.language_model., a vision tower, injected mtp.* weights), experts fused and 3-D as the BF16 checkpoints
    hold them, a shared expert gated by sigmoid(shared_expert_gate(x))."""
    torch.manual_seed(seed)
    tc = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
              head_dim=8, linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=8,
              linear_value_head_dim=8, linear_conv_kernel_dim=4, moe_intermediate_size=20,
              shared_expert_intermediate_size=24, num_experts=7, num_experts_per_tok=2, rms_norm_eps=1e-6,
              tie_word_embeddings=False, max_position_embeddings=4096,
              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                               "mrope_interleaved": True, "mrope_section": [1, 0, 0]})
    cfg = Qwen3_5MoeConfig(text_config=tc,
                           vision_config=dict(depth=1, hidden_size=8, intermediate_size=16, num_heads=1,
                                              out_hidden_size=tc["hidden_size"], patch_size=2,
                                              temporal_patch_size=1, num_position_embeddings=4))
    model = Qwen3_5MoeForConditionalGeneration(cfg).float().eval()
    randomize_hybrid(model, seed)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    os.remove(os.path.join(d, "generation_config.json"))
    path = os.path.join(d, "model.safetensors")
    to_bf16_file(path)
    text_cfg = model.model.language_model.config
    fuse_experts(path, text_cfg, "model.language_model.")
    w = load_file(path)
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in w
    w["mtp.fc.weight"] = torch.randn(tc["hidden_size"], 2 * tc["hidden_size"]).bfloat16()
    save_file(w, path, metadata={"format": "pt"})
    loaded = Qwen3_5MoeForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
    for (n1, p1), (n2, p2) in zip(sorted(model.named_parameters()), sorted(loaded.named_parameters())):
        assert n1 == n2 and torch.equal(p1, p2), f"{n1} did not load back from {name}"
    write_golden(d, loaded, seed, loaded.model.language_model)


def main():
    torch.set_num_threads(2)
    if len(sys.argv) == 3 and sys.argv[1] == "--from-model":
        return from_model(sys.argv[2])
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    make(out, "per_expert", 31, False, {})
    make(out, "fused", 47, True, dict(num_experts=7, num_experts_per_tok=3, norm_topk_prob=False,
                                      mlp_only_layers=[2], tie_word_embeddings=True))
    make_qwen3_5_moe(out, "qwen3_5_moe", 59)


if __name__ == "__main__":
    main()
