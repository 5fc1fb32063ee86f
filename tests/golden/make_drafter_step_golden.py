#!/usr/bin/env python3
"""Golden fixture for one (two) DFlash drafter training steps, computed independently in PyTorch (float64).

Written from the published definitions (DFlash drafter, the project's loss contract in docs/loss.md, the training
recipe), not from the project's C++: the forward is plain tensor code with the attention mask built from its
definition, the gradients come from torch.autograd, the optimizer is torch.optim.AdamW with
torch.nn.utils.clip_grad_norm_. tests/unit/test_golden_step.cpp runs the same steps through the trainer
(dflash::train::DrafterStep) and compares. See tests/golden/README.md.

Usage: python make_drafter_step_golden.py [--out FILE]   writes the fixture (default: next to this script)
       python make_drafter_step_golden.py --check        recomputes it and compares with the committed file
"""
import argparse
import json
import math
import os

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

F64 = torch.float64

# ---------------------------------------------------------------------------------------------------------------
# The problem: a tiny drafter, two sequences (two micro-batches of one rank), every hyperparameter away from the
# special values that would hide a bug (τ ≠ 1, all λ ≠ 0, weight decay ≠ 0, clipping active, warmup).
# ---------------------------------------------------------------------------------------------------------------
MODEL = dict(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, intermediate=48, block_size=4, n_taps=2,
             vocab=97, mask_token_id=96, rope_theta=10000.0, rms_eps=1e-6)
# layer 0: full attention; layer 1: sliding window of 5 positions (the window is >= B so it only cuts context)
WINDOW = [0, 5]
LOSS = dict(ce_weight=1.0, kl_weight=0.7, kl_temperature=2.0, cap_weight=0.3, decay_gamma=2.0, top_k=4)
OPTIM = dict(lr=2e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, warmup_ratio=0.2, min_lr_ratio=0.1,
             total_steps=10, grad_clip=None)  # grad_clip: set below to 0.6 × the first step's norm (clip active)
STEPS = 2
SEED = 20261129

# Loss masks. Anchor candidates are positions i with mask[i] and mask[i+1]; the trainer takes all of them when
# anchors_per_seq is at least their number, so these masks fix the anchors:
#   sequence 0 (S = 24): 5, 6, 7 (overlapping blocks; block 7 scores 8, 9, 10 with mask[9] = 0),
#                        12 (block scores 13, 14, 15 with mask[14] = 0), 22 (positions 24, 25 fall beyond S)
#   sequence 1 (S = 13): 0 (sees no context at all), 3, 4 (overlapping), 10 (mask[12] = 0, position 13 beyond S)
MASKS = [
    [0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1],
    [1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0],
]
EXPECTED_ANCHORS = [[5, 6, 7, 12, 22], [0, 3, 4, 10]]


def anchor_candidates(mask):
    return [i for i in range(len(mask) - 1) if mask[i] and mask[i + 1]]


def param_layout(m):
    """(export name, shape, is_norm) in the project's flat order (lib/model/drafter_params.h names)."""
    H, Q, KV, D, I = m["hidden"], m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"], m["head_dim"], m[
        "intermediate"]
    out = []
    for l in range(m["layers"]):
        p = f"layers.{l}."
        out += [(p + "input_layernorm.weight", (H,), True), (p + "self_attn.q_proj.weight", (Q, H), False),
                (p + "self_attn.k_proj.weight", (KV, H), False), (p + "self_attn.v_proj.weight", (KV, H), False),
                (p + "self_attn.o_proj.weight", (H, Q), False), (p + "self_attn.q_norm.weight", (D,), True),
                (p + "self_attn.k_norm.weight", (D,), True), (p + "post_attention_layernorm.weight", (H,), True),
                (p + "mlp.gate_proj.weight", (I, H), False), (p + "mlp.up_proj.weight", (I, H), False),
                (p + "mlp.down_proj.weight", (H, I), False)]
    out += [("fc.weight", (H, m["n_taps"] * H), False), ("hidden_norm.weight", (H,), True),
            ("norm.weight", (H,), True)]
    return out


# ---------------------------------------------------------------------------------------------------------------
# The drafter, from the definition (Qwen3 decoder layers with KV injection of the target context)
# ---------------------------------------------------------------------------------------------------------------
def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    """HF rotate_half RoPE: x [n, heads, D] at positions pos [n]; dim i pairs with i + D/2."""
    D = x.shape[-1]
    half = D // 2
    inv_freq = theta ** (-torch.arange(half, dtype=F64) * 2.0 / D)
    ang = pos.to(F64)[:, None] * inv_freq[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def dflash_mask(anchors, S, B, window):
    """visible[NB, S + NB]: query j of block b (position a_b + j) against [context 0..S-1 ; every block row].

    Context key c is visible iff c < a_b (strict: the anchor's own target state is hidden) and, in a sliding layer
    of window w, (a_b + j) − c < w. Block key i of block b' is visible iff b' == b and, in a sliding layer, i <= j
    (causal) and j − i < w. Full layers see their whole block (bidirectional)."""
    N = len(anchors)
    vis = torch.zeros(N * B, S + N * B, dtype=torch.bool)
    for b, a in enumerate(anchors):
        for j in range(B):
            qpos = a + j
            for c in range(S):
                vis[b * B + j, c] = c < a and (window == 0 or qpos - c < window)
            for i in range(B):
                vis[b * B + j, S + b * B + i] = window == 0 or (i <= j and j - i < window)
    return vis


def drafter_forward(P, taps, tokens, anchors, embed):
    m = MODEL
    H, NH, KVH, D, B, eps = m["hidden"], m["heads"], m["kv_heads"], m["head_dim"], m["block_size"], m["rms_eps"]
    S, N = tokens.shape[0], len(anchors)
    ctx = rmsnorm(taps @ P["fc.weight"].T, P["hidden_norm.weight"], eps)  # [S, H]
    blk_tokens = []
    blk_pos = []
    for a in anchors:
        blk_tokens += [int(tokens[a])] + [m["mask_token_id"]] * (B - 1)
        blk_pos += [a + j for j in range(B)]
    blk_pos = torch.tensor(blk_pos)
    ctx_pos = torch.arange(S)
    x = embed[torch.tensor(blk_tokens)]  # [NB, H]
    NB = N * B
    G = NH // KVH
    for l in range(m["layers"]):
        p = lambda n: P[f"layers.{l}.{n}"]
        xn = rmsnorm(x, p("input_layernorm.weight"), eps)
        q = rope(rmsnorm((xn @ p("self_attn.q_proj.weight").T).view(NB, NH, D), p("self_attn.q_norm.weight"), eps),
                 blk_pos, m["rope_theta"])
        kb = rope(rmsnorm((xn @ p("self_attn.k_proj.weight").T).view(NB, KVH, D), p("self_attn.k_norm.weight"), eps),
                  blk_pos, m["rope_theta"])
        vb = (xn @ p("self_attn.v_proj.weight").T).view(NB, KVH, D)
        kc = rope(rmsnorm((ctx @ p("self_attn.k_proj.weight").T).view(S, KVH, D), p("self_attn.k_norm.weight"), eps),
                  ctx_pos, m["rope_theta"])
        vc = (ctx @ p("self_attn.v_proj.weight").T).view(S, KVH, D)
        K = torch.cat([kc, kb]).repeat_interleave(G, dim=1)  # [S+NB, NH, D]: query head h reads kv head h // G
        V = torch.cat([vc, vb]).repeat_interleave(G, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, K) / math.sqrt(D)
        vis = dflash_mask(anchors, S, B, WINDOW[l])
        scores = scores.masked_fill(~vis[None], float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), V).reshape(NB, NH * D)
        x = x + attn @ p("self_attn.o_proj.weight").T
        n = rmsnorm(x, p("post_attention_layernorm.weight"), eps)
        x = x + (torch.nn.functional.silu(n @ p("mlp.gate_proj.weight").T) * (n @ p("mlp.up_proj.weight").T)) @ p(
            "mlp.down_proj.weight").T
    return rmsnorm(x, P["norm.weight"], eps)  # [NB, H]


# ---------------------------------------------------------------------------------------------------------------
# The loss (docs/loss.md, "The math, per row") and its metrics
# ---------------------------------------------------------------------------------------------------------------
def scored_rows(tokens, mask, anchors):
    """Rows (b, k, label, weight, target_pos) for k = 1..B-1: w = exp(−(k−1)/γ) · mask[a+k] · [a+k < S]."""
    B, S, gamma = MODEL["block_size"], len(mask), LOSS["decay_gamma"]
    rows = []
    for b, a in enumerate(anchors):
        for k in range(1, B):
            pos = a + k
            inside = pos < S
            w = math.exp(-(k - 1) / gamma) * (mask[pos] if inside else 0)
            # the target predicted token a+k at position a+k−1; rows beyond S have w = 0 (any row would do)
            rows.append(dict(b=b, k=k, label=int(tokens[pos]) if inside else 0, w=w, target_pos=min(pos - 1, S - 1)))
    return rows


def row_losses(z, u, label):
    """CE, KL, CAP of one row (scalars with autograd), and the argmax m (held fixed: the usual subgradient)."""
    tau = LOSS["kl_temperature"]
    logp = torch.log_softmax(z, -1)
    ce = -logp[label]
    log_pt = torch.log_softmax(z / tau, -1)
    log_qt = torch.log_softmax(u / tau, -1)
    kl = tau * tau * (log_qt.exp() * (log_qt - log_pt)).sum()  # forward KL(q_τ ‖ p_τ)
    m = int(torch.argmax(z.detach()))  # torch returns the first maximal index: the lowest index on ties
    cap = -torch.log1p(-logp[m].exp()) if m != label else z.new_zeros(())  # −log(1 − p_m), float64 is ample here
    return ce, kl, cap, m


def step_loss(P, seqs, lm_head, embed):
    """Global loss L = Σ w ℓ / Σ w over every row of every sequence, the unnormalised sums, and the metrics."""
    B, top_k = MODEL["block_size"], LOSS["top_k"]
    lam_ce, lam_kl, lam_cap = LOSS["ce_weight"], LOSS["kl_weight"], LOSS["cap_weight"]
    sums = dict(loss=0.0, ce=0.0, kl=0.0, cap=0.0, weight=0.0)
    metrics = dict(correct=[0] * B, scored=[0] * B, topk_hits=0, accepted_sum=0, blocks=0)
    total = None
    for s in seqs:
        out = drafter_forward(P, s["taps"], s["tokens"], s["anchors"], embed)
        rows = scored_rows(s["tokens"], s["mask"], s["anchors"])
        run = {}  # block → (still accepting, accepted so far, has a scored row)
        for r in rows:
            z = out[r["b"] * B + r["k"]] @ lm_head.T
            u = s["final_hidden"][r["target_pos"]] @ lm_head.T
            ce, kl, cap, m = row_losses(z, u, r["label"])
            w = r["w"]
            ell = lam_ce * ce + lam_kl * kl + lam_cap * cap
            total = w * ell if total is None else total + w * ell
            sums["loss"] += w * float(ell)
            sums["ce"] += w * float(ce)
            sums["kl"] += w * float(kl)
            sums["cap"] += w * float(cap)
            sums["weight"] += w
            acc, n, any_scored = run.get(r["b"], (True, 0, False))
            scored = w > 0
            correct = scored and m == r["label"]
            if scored:
                metrics["scored"][r["k"]] += 1
                metrics["correct"][r["k"]] += int(correct)
                zd = z.detach()
                rank = int((zd > zd[r["label"]]).sum()) + int((zd[: r["label"]] == zd[r["label"]]).sum())
                metrics["topk_hits"] += int(rank < top_k)
            if acc and correct:
                n += 1
            else:
                acc = False  # a masked or wrong position ends the accepted run
            run[r["b"]] = (acc, n, any_scored or scored)
        for acc, n, any_scored in run.values():
            if any_scored:
                metrics["blocks"] += 1
                metrics["accepted_sum"] += 1 + n
    return total / sums["weight"], sums, metrics


def lr_at(step):
    """Linear warmup over ceil(warmup_ratio · total) steps to lr, then cosine to min_lr_ratio · lr at the last step."""
    o = OPTIM
    warmup = math.ceil(o["warmup_ratio"] * o["total_steps"])
    if step < warmup:
        return o["lr"] * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, o["total_steps"] - warmup - 1))
    return o["lr"] * (o["min_lr_ratio"] + (1 - o["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * progress)))


# ---------------------------------------------------------------------------------------------------------------
# Fixture
# ---------------------------------------------------------------------------------------------------------------
def split_hi_lo(x):
    """float64 → (hi, lo) float32 with hi + lo = x to ~2^-48 relative: the C++ double path checks against it."""
    x = np.asarray(x, dtype=np.float64)
    hi = x.astype(np.float32)
    lo = (x - hi.astype(np.float64)).astype(np.float32)
    return hi, lo


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "drafter_step_golden.safetensors"))
    ap.add_argument("--check", action="store_true",
                    help="recompute and compare with --out (tensors bit for bit, metadata equal) instead of writing")
    args = ap.parse_args()
    torch.set_default_dtype(F64)
    m = MODEL
    H, V = m["hidden"], m["vocab"]
    rng = np.random.default_rng(SEED)
    f32 = lambda a: np.asarray(a, dtype=np.float32)  # every input is a float32 value; the math runs in float64

    for mask, expect in zip(MASKS, EXPECTED_ANCHORS):
        assert anchor_candidates(mask) == expect, (anchor_candidates(mask), expect)

    # weights: linear ~ N(0, 0.2²) (larger than the 0.02 init so the logits spread and argmax/CAP are not trivial),
    # norm weights 1 + N(0, 0.1²) (not all ones, so their gradients are not symmetric)
    layout = param_layout(m)
    weights = {}
    for name, shape, is_norm in layout:
        weights[name] = f32(1.0 + 0.1 * rng.standard_normal(shape) if is_norm else 0.2 * rng.standard_normal(shape))
    embed = f32(rng.standard_normal((V, H)))
    lm_head = f32(0.4 * rng.standard_normal((V, H)))
    seqs_np = []
    for mask in MASKS:
        S = len(mask)
        seqs_np.append(dict(tokens=rng.integers(0, V - 1, size=S).astype(np.int64),  # never the mask token
                            mask=mask, taps=f32(rng.standard_normal((S, m["n_taps"] * H))),
                            final_hidden=f32(rng.standard_normal((S, H)))))
    seqs = [dict(tokens=torch.from_numpy(s["tokens"]), mask=s["mask"], anchors=anchor_candidates(s["mask"]),
                 taps=torch.from_numpy(s["taps"]).to(F64), final_hidden=torch.from_numpy(s["final_hidden"]).to(F64))
            for s in seqs_np]
    E = torch.from_numpy(embed).to(F64)
    W_head = torch.from_numpy(lm_head).to(F64)

    params = [torch.nn.Parameter(torch.from_numpy(weights[n]).to(F64)) for n, _, _ in layout]
    P = {n: p for (n, _, _), p in zip(layout, params)}
    matrices = [p for (n, _, is_norm), p in zip(layout, params) if not is_norm]
    norms = [p for (n, _, is_norm), p in zip(layout, params) if is_norm]
    o = OPTIM
    opt = torch.optim.AdamW([dict(params=matrices, weight_decay=o["weight_decay"]),
                             dict(params=norms, weight_decay=0.0)],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])

    tensors = {}
    meta = {}
    for name, _, _ in layout:
        tensors["weight." + name] = weights[name]
    tensors["embed"] = embed
    tensors["lm_head"] = lm_head
    for i, s in enumerate(seqs_np):
        tensors[f"seq{i}.tokens"] = f32(s["tokens"])
        tensors[f"seq{i}.loss_mask"] = f32(s["mask"])
        tensors[f"seq{i}.taps"] = s["taps"]
        tensors[f"seq{i}.final_hidden"] = s["final_hidden"]
        tensors[f"seq{i}.anchors"] = f32(anchor_candidates(s["mask"]))

    for step in range(STEPS):
        opt.zero_grad()
        L, sums, metrics = step_loss(P, seqs, W_head, E)
        L.backward()
        grads = [p.grad.detach().clone() for p in params]  # normalised by the global Σw, before clipping
        if o["grad_clip"] is None:
            norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
            o["grad_clip"] = float(np.float32(0.6 * norm))  # clipping active on the first step
        norm = float(torch.nn.utils.clip_grad_norm_(params, o["grad_clip"]))
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        tag = f"step{step}."
        meta[tag + "loss"] = repr(float(L))
        for k, v in sums.items():
            meta[tag + "sum_" + k] = repr(v)
        meta[tag + "grad_norm"] = repr(norm)
        meta[tag + "lr"] = repr(lr)
        meta[tag + "metrics"] = json.dumps(metrics)
        for (name, _, _), g, p in zip(layout, grads, params):
            if step == 0:
                hi, lo = split_hi_lo(g.numpy())
                tensors[tag + "grad." + name] = hi
                tensors[tag + "grad_lo." + name] = lo
            tensors[tag + "weight_after." + name] = f32(p.detach().numpy())
        print(f"step {step}: L = {float(L):.10f}  Σw = {sums['weight']:.6f}  |g| = {norm:.6e}  lr = {lr:.6g}  "
              f"metrics {metrics}")

    for k, v in {**MODEL, **LOSS, **OPTIM}.items():
        meta[k] = repr(v)
    meta["window"] = json.dumps(WINDOW)
    meta["steps"] = repr(STEPS)
    meta["seed"] = repr(SEED)
    meta["sequences"] = repr(len(MASKS))
    meta["generator"] = "tests/golden/make_drafter_step_golden.py (torch " + torch.__version__ + ", float64)"
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    if args.check:
        # the header's key order is not stable (safetensors keeps metadata in a hash map): compare the contents
        old = load_file(args.out)
        with safe_open(args.out, "np") as f:
            old_meta = f.metadata()
        bad = sorted(k for k in set(old) | set(tensors)
                     if k not in old or k not in tensors or not np.array_equal(old[k], tensors[k]))
        bad += sorted(k for k in set(old_meta) | set(meta) if k != "generator" and old_meta.get(k) != meta.get(k))
        if bad:
            raise SystemExit(f"{args.out} differs from a fresh computation in {len(bad)} entries: {bad[:10]}")
        print(f"{args.out}: {len(tensors)} tensors and the metadata reproduce exactly")
        return
    save_file(tensors, args.out, metadata=meta)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, {len(tensors)} tensors)")


if __name__ == "__main__":
    main()
