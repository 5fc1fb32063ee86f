#pragma once
// Per-query math of the CUDA attention kernels, host and device: which keys a query sees (and, for the backward
// kernel that owns a key, which queries see it), and the online-softmax merge of one key tile into a query's
// running state. tests/unit/test_cuda_math.cpp runs these on the CPU against kernels/cpu/attention_dflash.
#include <math.h>

#include "kernels/attention_shape.h"

namespace dflash::kernels::cuda_math {

// The keys query row j of block b sees, in the order the kernels visit them: n_ctx context rows
// [ctx_lo, ctx_lo + n_ctx) of k_ctx, then n_blk rows [b·block, b·block + n_blk) of k_blk.
struct DFlashKeys {
  int ctx_lo = 0, n_ctx = 0, n_blk = 0;
  DFLASH_HD int count() const { return n_ctx + n_blk; }
};

DFLASH_HD inline DFlashKeys dflash_query_keys(const DFlashAttentionShape& s, int anchor, int j) {
  DFlashKeys k;
  int lo, hi;
  dflash_ctx_range(s, anchor, j, lo, hi);
  k.ctx_lo = lo;
  k.n_ctx = hi - lo;
  k.n_blk = dflash_blk_count(s, j);
  return k;
}

// Row of key t (< keys.count()) in k_ctx (returns true) or in k_blk (returns false) for a query of block b.
DFLASH_HD inline bool dflash_key_row(const DFlashKeys& keys, int b, int block, int t, int& row) {
  if (t < keys.n_ctx) {
    row = keys.ctx_lo + t;
    return true;
  }
  row = b * block + (t - keys.n_ctx);
  return false;
}

// Query rows [j_lo, j_hi) of a block anchored at `anchor` that see context key c (the inverse of
// dflash_ctx_range): none when c ≥ min(anchor, S); all rows for a full layer; rows j ≤ c − anchor + window − 1
// for a sliding window.
DFLASH_HD inline void dflash_rows_seeing_ctx(const DFlashAttentionShape& s, int anchor, int c, int& j_lo, int& j_hi) {
  const int hi = anchor < s.ctx_len ? anchor : s.ctx_len;
  j_lo = 0;
  if (c >= hi) {
    j_hi = 0;
    return;
  }
  if (s.window <= 0) {
    j_hi = s.block;
    return;
  }
  const int last = c - anchor + s.window;  // exclusive bound on j
  j_hi = last < 0 ? 0 : (last < s.block ? last : s.block);
}

// Query rows [j_lo, block) of a block that see its own block key i: all for a full layer, j ≥ i when sliding.
DFLASH_HD inline void dflash_rows_seeing_blk(const DFlashAttentionShape& s, int i, int& j_lo, int& j_hi) {
  j_lo = s.window > 0 ? i : 0;
  j_hi = s.block;
}

// Running online-softmax state of one query: m = max score seen, l = Σ exp(score − m). The running output
// O = Σ exp(score − m) v is kept by the caller and rescaled by the factor rescale() returns.
struct OnlineSoftmax {
  float m = -INFINITY;
  float l = 0;

  // Before a tile whose largest (visible) score is tile_max: moves m to max(m, tile_max) and returns α, the
  // factor by which l (done here) and the caller's running output must be multiplied. The tile's probabilities
  // are then exp(score − m).
  DFLASH_HD float rescale(float tile_max) {
    const float m_new = tile_max > m ? tile_max : m;
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);  // no exp(−∞ − (−∞)) = NaN on the first tile
    m = m_new;
    l *= alpha;
    return alpha;
  }
  DFLASH_HD void add(float p) { l += p; }
  // log Σ exp(score): what the forward saves for the backward's recomputation.
  DFLASH_HD float lse() const { return m + logf(l); }
};

// One step of the backward at one (query, key) pair, with p = exp(score − lse), dp = dO·v, delta = dO·O:
// dS = p (dp − delta); dQ += scale·dS·k, dK += scale·dS·q, dV += p·dO.
DFLASH_HD inline float attention_dscore(float p, float dp, float delta) { return p * (dp - delta); }

}  // namespace dflash::kernels::cuda_math
