#pragma once
// Shape and mask of the DFlash drafter attention, shared by the CPU and CUDA kernels (host and device code).
//
// Shapes (NB = n_blocks * block rows, block-major: row = b*block + j; NH query heads, KVH kv heads, D head_dim):
//   q     [NB, NH, D]   block queries, after q_norm and RoPE
//   k_ctx [S, KVH, D]   context keys (k_proj of the drafter context), after k_norm and RoPE at positions 0..S-1
//   v_ctx [S, KVH, D]
//   k_blk [NB, KVH, D]  block keys, after k_norm and RoPE at positions anchor_b + j
//   v_blk [NB, KVH, D]
//   out   [NB, NH, D]
//   lse   [NB, NH]      log-sum-exp of each query's scaled scores, saved for backward
// Query head h reads kv head h / (NH / KVH) (GQA).
//
// Mask, for query row j of block b with anchor a = anchors[b]:
//   full layer (window == 0):  context keys [0, a)                          + block keys [0, block)   (bidirectional)
//   sliding layer (window > 0): context keys [max(0, a + j - (window-1)), a) + block keys [0, j]      (causal)
// The anchor's own context row is never visible (strict <): its target state already encodes the next token.

#include "kernels/math/hd.h"  // DFLASH_HD

namespace dflash::kernels {

struct DFlashAttentionShape {
  int n_blocks = 0;    // N
  int block = 0;       // B
  int ctx_len = 0;     // S
  int heads = 0;       // NH
  int kv_heads = 0;    // KVH
  int head_dim = 0;    // D
  int window = 0;      // 0 = full attention; > 0 = sliding window of this many positions
};

// Visible context key range [lo, hi) of query row j in a block anchored at `anchor`.
DFLASH_HD inline void dflash_ctx_range(const DFlashAttentionShape& s, int anchor, int j, int& lo, int& hi) {
  hi = anchor < s.ctx_len ? anchor : s.ctx_len;
  lo = 0;
  if (s.window > 0) {
    const int first = anchor + j - (s.window - 1);
    lo = first > 0 ? first : 0;
    if (lo > hi) lo = hi;
  }
}
// Number of visible block keys of query row j.
DFLASH_HD inline int dflash_blk_count(const DFlashAttentionShape& s, int j) { return s.window > 0 ? j + 1 : s.block; }

// Number of (query, key, head) score pairs the mask admits: the attention FLOPs are 4·D per pair forward.
inline long long dflash_attention_pairs(const int* anchors, const DFlashAttentionShape& s) {
  long long pairs = 0;
  for (int b = 0; b < s.n_blocks; ++b)
    for (int j = 0; j < s.block; ++j) {
      int lo, hi;
      dflash_ctx_range(s, anchors[b], j, lo, hi);
      pairs += (hi - lo) + dflash_blk_count(s, j);
    }
  return pairs * s.heads;
}

}  // namespace dflash::kernels
