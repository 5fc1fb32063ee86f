#!/usr/bin/env python3
"""Golden fixture for the acceptance-aware objectives of the vocab loss, computed independently in PyTorch (float64).

Written from the published definitions, not from the project's C++ (see tests/golden/README.md, "The objectives"):
  - D-PACE position weights (Wu et al., arXiv:2605.18810; the three variants of SpecForge's loss_type and the
    D-PACE release: dpace, dpace-cumulative-confidence-only, dpace-continuation-value-only), laid out as the
    sources lay them out: a [blocks, B] tensor whose slot 0 is the anchor (not scored), confidences exp(-CE),
    torch.cumprod for the prefix products and flip/cumsum/flip for the suffix sums, under torch.no_grad();
  - total variation, negative log-acceptance and LK-hybrid (vllm-project/speculators' loss_functions: overlap
    alpha = sum_v min(p_v, q_v), TV = 1 - alpha, NLA = -log(max(alpha, 1e-5)), LK = lambda KL + (1 - lambda) TV with
    lambda = exp(-eta * alpha.detach()));
  - CE, KL (tau^2 KL(softmax(u/tau) || softmax(z/tau))) and CAP as in the existing fixture.
Gradients with respect to the drafter's final hidden X come from torch.autograd. tests/unit/test_golden_objectives.cpp
runs the same loss through dflash::model::VocabLoss (float and double, both schedules, chunks that cut blocks).

Usage: python make_vocab_objectives_golden.py [--out FILE]   writes the fixture (default: next to this script)
       python make_vocab_objectives_golden.py --check        recomputes it and compares with the committed file
"""
import argparse
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

F64 = torch.float64

# ---------------------------------------------------------------------------------------------------------------
# The problem: N blocks of B - 1 scored rows (block positions k = 1..B-1), hidden H, vocabulary V. Block 1 is fully
# masked, block 3 has a masked row in the middle (k = 3), block 5 ends past the sequence (k = 4, 5 masked).
# ---------------------------------------------------------------------------------------------------------------
H, V, B, N = 12, 37, 6, 6
SEED = 20261201
GAMMA = 4.0  # the decay of the cases without D-PACE: w = exp(-(k-1)/gamma) * mask
MASKED = {(1, k) for k in range(1, B)} | {(3, 3), (5, 4), (5, 5)}

DEFAULTS = dict(ce_weight=1.0, kl_weight=0.0, kl_temperature=1.0, cap_weight=0.0, tv_weight=0.0, lk_weight=0.0,
                lk_eta=3.0, nla_weight=0.0, position_weight="decay", dpace_alpha=0.5)
# Every term alone and the compositions the sources use (D-PACE over CE; Model-Optimizer's D-PACE over KD, i.e.
# KL with a CE share; speculators' weighted sums), α and η away from their defaults somewhere.
CASES = [
    dict(name="dpace", position_weight="dpace", dpace_alpha=0.5),
    dict(name="dpace_cumulative_confidence", position_weight="dpace_cumulative_confidence", dpace_alpha=0.3),
    dict(name="dpace_continuation_value", position_weight="dpace_continuation_value", dpace_alpha=0.7,
         cap_weight=0.3),
    dict(name="dpace_kd", position_weight="dpace", ce_weight=0.3, kl_weight=0.7),
    dict(name="tv", ce_weight=0.0, tv_weight=1.0),
    dict(name="lk_hybrid", ce_weight=0.0, lk_weight=1.0),
    dict(name="nla", ce_weight=0.0, nla_weight=1.0),
    dict(name="ce_tv", ce_weight=0.1, tv_weight=0.9),
    dict(name="all", position_weight="dpace", dpace_alpha=0.4, kl_weight=0.5, cap_weight=0.2, tv_weight=0.4,
         lk_weight=0.6, lk_eta=2.0, nla_weight=0.3),
]
NLA_FLOOR = 1e-5


# ---------------------------------------------------------------------------------------------------------------
# The definitions
# ---------------------------------------------------------------------------------------------------------------
def dpace_weights(ce, valid, alpha, variant):
    """D-PACE factors of [N, B] rows (slot 0: the anchor), detached: q = exp(-CE), smoothed, prefix products,
    suffix sums of the valid prefix products; invalid slots are multiplicative no-ops and add nothing."""
    with torch.no_grad():
        q = torch.exp(-ce)
        smooth = torch.where(valid, (1.0 - alpha) * q + alpha, torch.ones_like(q))
        prefix = torch.cumprod(smooth, dim=-1)
        if variant == "dpace_cumulative_confidence":
            return prefix
        suffix = torch.flip(torch.cumsum(torch.flip(prefix * valid.to(F64), dims=[-1]), dim=-1), dims=[-1])
        if variant == "dpace":
            return suffix
        if variant == "dpace_continuation_value":
            return suffix / prefix
        raise ValueError(variant)


def objective(s, X, Y, W, labels, w):
    """Σ_rows w·d·ℓ and the parts; X [R, H] requires grad. Rows are N blocks × (B - 1), k = 1..B-1."""
    z, u = X @ W.T, Y @ W.T
    tau = s["kl_temperature"]
    ce = F.cross_entropy(z, labels, reduction="none")
    kl = F.kl_div(F.log_softmax(z / tau, -1), F.log_softmax(u / tau, -1), log_target=True, reduction="none").sum(-1)
    kl = kl * tau * tau
    m = torch.argmax(z, -1)  # the first maximum
    z_excl = z.masked_fill(F.one_hot(m, V).bool(), -math.inf)
    cap = torch.where(m != labels, torch.logsumexp(z, -1) - torch.logsumexp(z_excl, -1), torch.zeros_like(ce))
    p, q = torch.softmax(z, -1), torch.softmax(u, -1)
    alpha = torch.minimum(p, q).sum(-1)
    tv = 1.0 - alpha
    nla = -torch.log(alpha.clamp_min(NLA_FLOOR))
    kl1 = F.kl_div(F.log_softmax(z, -1), q, reduction="none").sum(-1)  # speculators' kl_div_loss (tau = 1)
    lam = torch.exp(-s["lk_eta"] * alpha.detach())
    lk = lam * kl1 + (1.0 - lam) * tv
    row = (s["ce_weight"] * ce + s["kl_weight"] * kl + s["cap_weight"] * cap + s["tv_weight"] * tv +
           s["lk_weight"] * lk + s["nla_weight"] * nla)
    if s["position_weight"] == "decay":
        d = torch.ones_like(ce)
    else:  # [N, B] with the anchor slot 0 (never scored), as the sources lay the block out
        pad = lambda t: torch.cat([torch.zeros(N, 1, dtype=F64), t.reshape(N, B - 1)], 1)
        valid = pad(w.detach()) > 0
        d = dpace_weights(pad(ce.detach()), valid, s["dpace_alpha"], s["position_weight"])[:, 1:].reshape(-1)
    scored = w > 0
    wd = torch.where(scored, w * d, torch.zeros_like(w))
    parts = dict(ce=ce, kl=kl, cap=cap, tv=tv, lk=lk, nla=nla)
    sums = {k: float((torch.where(scored, w * v, torch.zeros_like(w))).sum()) for k, v in parts.items()}
    sums["weight"] = float(w.sum())
    sums["dpace"] = float(wd.sum())
    loss = (wd * row).sum()
    sums["loss"] = float(loss)
    return loss, sums


def split_hi_lo(x):
    """float64 → (hi, lo) float32 with hi + lo = x to ~2^-48 relative: the C++ double path checks against it."""
    x = np.asarray(x, dtype=np.float64)
    hi = x.astype(np.float32)
    lo = (x - hi.astype(np.float64)).astype(np.float32)
    return hi, lo


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "vocab_objectives_golden.safetensors"))
    ap.add_argument("--check", action="store_true",
                    help="recompute and compare with --out (tensors bit for bit, metadata equal) instead of writing")
    args = ap.parse_args()
    rng = np.random.default_rng(SEED)
    f32 = lambda a: np.asarray(a, dtype=np.float32)  # every input is a float32 value; the math runs in float64
    R = N * (B - 1)
    W_np = f32(2.5 / math.sqrt(H) * rng.standard_normal((V, H)))
    X_np = f32(rng.standard_normal((R, H)))
    Y_np = f32(X_np + 0.7 * rng.standard_normal((R, H)))  # the target near the drafter: overlaps well inside (0, 1)
    W, X0, Y = (torch.from_numpy(a).to(F64) for a in (W_np, X_np, Y_np))
    # labels: the drafter's argmax 70 % of the time (accepted runs of several rows), else any token
    z0 = (X0 @ W.T).numpy()
    labels_np = np.where(rng.random(R) < 0.7, z0.argmax(-1), rng.integers(0, V, size=R)).astype(np.int64)
    k = np.tile(np.arange(1, B), N)
    block = np.repeat(np.arange(N), B - 1)
    mask = np.array([0.0 if (b, kk) in MASKED else 1.0 for b, kk in zip(block, k)])
    decay = np.exp(-(k - 1) / GAMMA) * mask
    labels = torch.from_numpy(labels_np)

    tensors = dict(hidden=X_np, target_hidden=Y_np, head=W_np, labels=f32(labels_np), block_pos=f32(k),
                   block_id=f32(block), mask=f32(mask), decay_weights=f32(decay))
    meta = dict(hidden_size=repr(H), vocab=repr(V), block_size=repr(B), blocks=repr(N), rows=repr(R),
                seed=repr(SEED), decay_gamma=repr(GAMMA), cases=",".join(c["name"] for c in CASES))
    for case in CASES:
        s = {**DEFAULTS, **{k2: v for k2, v in case.items() if k2 != "name"}}
        # D-PACE replaces the decay (as in every source): its rows carry the mask alone
        w_np = mask if s["position_weight"] != "decay" else f32(decay).astype(np.float64)
        w = torch.from_numpy(np.asarray(w_np, dtype=np.float64))
        X = X0.clone().requires_grad_(True)
        loss, sums = objective(s, X, Y, W, labels, w)
        loss.backward()
        tag = "case." + case["name"] + "."
        for key, value in s.items():
            meta[tag + key] = value if isinstance(value, str) else repr(float(value))
        for key, value in sums.items():
            meta[tag + "sum_" + key] = repr(value)
        hi, lo = split_hi_lo(X.grad.numpy())
        tensors[tag + "dX"] = hi
        tensors[tag + "dX_lo"] = lo
        print(f"{case['name']:>28}: loss {sums['loss']:.10f}  Σw {sums['weight']:.4f}  Σw·d {sums['dpace']:.4f}  "
              f"tv {sums['tv']:.4f}  |dX| {float(X.grad.norm()):.4e}")
    meta["generator"] = "tests/golden/make_vocab_objectives_golden.py (torch " + torch.__version__ + ", float64)"
    tensors = {k2: np.ascontiguousarray(v) for k2, v in tensors.items()}
    if args.check:
        old = load_file(args.out)
        with safe_open(args.out, "np") as f:
            old_meta = f.metadata()
        bad = sorted(k2 for k2 in set(old) | set(tensors)
                     if k2 not in old or k2 not in tensors or not np.array_equal(old[k2], tensors[k2]))
        bad += sorted(k2 for k2 in set(old_meta) | set(meta) if k2 != "generator" and old_meta.get(k2) != meta.get(k2))
        if bad:
            raise SystemExit(f"{args.out} differs from a fresh computation in {len(bad)} entries: {bad[:10]}")
        print(f"{args.out}: {len(tensors)} tensors and the metadata reproduce exactly")
        return
    save_file(tensors, args.out, metadata=meta)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, {len(tensors)} tensors)")


if __name__ == "__main__":
    main()
