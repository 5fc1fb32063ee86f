#!/usr/bin/env python3
"""Golden fixtures for the Qwen3.5 / Qwen3.6 hybrid target, made by Hugging Face transformers.

    python3 -m venv /tmp/hybrid-venv && /tmp/hybrid-venv/bin/pip install -r tests/golden_hybrid/requirements.txt
    /tmp/hybrid-venv/bin/python tests/golden_hybrid/make_qwen3_5_golden.py tests/golden_hybrid
    /tmp/hybrid-venv/bin/python tests/golden_hybrid/make_qwen3_5_golden.py --from-model DIR
        (golden.safetensors for an existing model folder, e.g. one `dflash_data make-target --arch qwen3_5` wrote:
         then `hybrid_golden_check --model DIR` compares our forward with transformers on it)

For each tiny random model (both layer types: Gated DeltaNet linear attention and gated full attention) it writes
    <name>/config.json, <name>/model.safetensors     the weights as save_pretrained writes them
    <name>/golden.safetensors                        what our forward must reproduce (all F32):
        tokens.s{S}  [S]        the input token ids (exact small integers)
        layers.s{S}  [L, S, H]  raw output of every decoder layer l (HF hidden_states[l+1] for l < L-1)
        final.s{S}   [S, H]     final RMSNorm of the last layer's output (HF last_hidden_state)
        greedy.s{S}  [G]        greedy continuation of the S tokens (model.generate, do_sample=False)
        margin.s{S}  [G]        top-1 minus top-2 logit at each greedy step (how safe the argmax is)
Sequence lengths straddle the delta rule's chunk of 64 (transformers' torch fallback): 30 and 150.

Weights are not HF's init (norm weights zero, small linears): every tensor is random so that a wrong convention
shows — RMSNorm weights N(0, 0.2²) (Qwen3.5 scales by 1 + w), the gated norm 1 + N(0, 0.2²), linear weights
N(0, 1/in), conv1d N(0, 1/K), A_log = log U(0.05, 2), dt_bias N(0, 0.5²), embedding N(0, 1).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration,
                          Qwen3_5TextConfig)

LENGTHS = (30, 150)
GREEDY = 6


def text_config(**over):
    base = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=12,
                linear_conv_kernel_dim=4, rms_norm_eps=1e-6, tie_word_embeddings=False,
                max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                 "mrope_interleaved": True, "mrope_section": [1, 1, 0]})
    base.update(over)
    return base


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            n = lambda: torch.randn(p.shape, generator=g)
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.05, 2.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * n())
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * n())
            elif "norm" in name and p.dim() == 1:
                p.copy_(0.2 * n())
            elif name.endswith("conv1d.weight"):
                p.copy_(n() / p.shape[-1] ** 0.5)
            elif "embed_tokens" in name:
                p.copy_(n())
            elif p.dim() >= 2:
                p.copy_(n() / p.shape[-1] ** 0.5)
            else:
                p.copy_(0.1 * n())


def capture(model, text_model, tokens):
    """Raw decoder layer outputs via forward hooks, the final normed state, greedy continuation."""
    outs = []
    hooks = [layer.register_forward_hook(lambda m, i, o: outs.append((o[0] if isinstance(o, tuple) else o).detach()))
             for layer in text_model.layers]
    ids = torch.tensor([tokens])
    with torch.no_grad():
        r = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    for h in hooks:
        h.remove()
    layers = torch.stack([o[0] for o in outs])                      # [L, S, H]
    hs = r.hidden_states
    # cross-check the hooks against HF's own hidden_states (l+1 for every layer but the last)
    for l in range(layers.shape[0] - 1):
        assert torch.equal(hs[l + 1][0], layers[l]), f"hidden_states[{l + 1}] differs from layer {l} output"
    final = text_model.norm(layers[-1])
    with torch.no_grad():
        gen = model.generate(input_ids=ids, max_new_tokens=GREEDY, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    greedy = gen.sequences[0, len(tokens):]
    margins = []
    for step_logits in gen.logits:
        top = torch.topk(step_logits[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    # the cached generate path (recurrent update, KV cache) must agree with a full forward on the first token
    assert int(r.logits[0, -1].argmax()) == int(greedy[0])
    return layers.float(), final.detach().float(), greedy, torch.tensor(margins)


def write_golden(d, model, text_model, vocab, seed):
    golden = {}
    summary = {"model": d, "layer_types": text_model.config.layer_types, "lengths": {}}
    g = torch.Generator().manual_seed(seed + 1000)
    for S in LENGTHS:
        tokens = torch.randint(0, vocab, (S,), generator=g).tolist()
        layers, final, greedy, margins = capture(model, text_model, tokens)
        golden[f"tokens.s{S}"] = torch.tensor(tokens, dtype=torch.float32)
        golden[f"layers.s{S}"] = layers.contiguous()
        golden[f"final.s{S}"] = final.contiguous()
        golden[f"greedy.s{S}"] = greedy.float()
        golden[f"margin.s{S}"] = margins.float()
        summary["lengths"][S] = {"greedy": greedy.tolist(), "min_margin": float(margins.min())}
    save_file(golden, os.path.join(d, "golden.safetensors"), metadata={"format": "pt"})
    print(json.dumps(summary))


def from_model(d):
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(d)
    if cfg.model_type == "qwen3_5":
        model = Qwen3_5ForConditionalGeneration.from_pretrained(d, dtype=torch.float32).eval()
        text_model, vocab = model.model.language_model, cfg.text_config.vocab_size
    else:
        model = Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        text_model, vocab = model.model, cfg.vocab_size
    write_golden(d, model, text_model, vocab, 5)


def make(out_dir, name, seed, conditional, text_over):
    torch.manual_seed(seed)
    tc = text_config(**text_over)
    if conditional:
        cfg = Qwen3_5Config(text_config=tc,
                            vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                                               out_hidden_size=tc["hidden_size"], patch_size=4,
                                               temporal_patch_size=1, num_position_embeddings=16))
        model = Qwen3_5ForConditionalGeneration(cfg)
        text_model = model.model.language_model
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**tc))
        text_model = model.model
    model = model.float().eval()
    randomize(model, seed)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    if conditional:
        # real checkpoints also carry multi-token-prediction weights, which a target must ignore
        w = load_file(os.path.join(d, "model.safetensors"))
        w["mtp.fc.weight"] = torch.randn(tc["hidden_size"], 2 * tc["hidden_size"])
        w["mtp.layers.0.input_layernorm.weight"] = torch.randn(tc["hidden_size"])
        save_file(w, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})

    write_golden(d, model, text_model, tc["vocab_size"], seed)


def main():
    torch.set_num_threads(2)
    if len(sys.argv) == 3 and sys.argv[1] == "--from-model":
        return from_model(sys.argv[2])
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    # text-only causal LM: [linear ×3, full] (full_attention_interval 4), 6 Q / 2 KV heads, 2 key / 6 value heads
    make(out, "causal_lm", 11, False, {})
    # the released layout: ConditionalGeneration, weights under model.language_model., tiny vision tower, MTP
    # weights; layer order [linear, full, linear, linear, linear, full], 8 Q / 4 KV, 4 key / 8 value heads
    make(out, "conditional", 23, True,
         dict(num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, linear_num_key_heads=4,
              linear_num_value_heads=8, linear_value_head_dim=16, linear_key_head_dim=8, head_dim=32,
              layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention",
                           "linear_attention", "full_attention"]))


if __name__ == "__main__":
    main()
