#pragma once
// The token mixers of one target decoder layer on one TP rank, from the normed input to the rank's row-parallel
// partial sum (the caller all-reduces it): full attention (dense Qwen3, or Qwen3.5's gated attention with partial
// RoPE) and Gated DeltaNet. The math is in docs/target.md; every step is a call on a kernels::Backend<float>
// (kernels/backend.h). Weights, activations (part, h, pos), the scratch arena and the caches (TargetCache's
// buffers) are all in the backend's memory; the caches are read and extended in place.
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "lib/core/buffer.h"
#include "lib/model/qwen_config.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"

namespace dflash::model {

// part[S, H] (=) this rank's share of o_proj(attention(h)); h [S, H] normed input at positions pos[S] (int32) =
// past .. past + S − 1. keys/values (optional, backend memory, room for [past + S, kv_count, head_dim]): the first
// past rows hold the earlier positions' keys and values; these S rows are written after them. Without them past
// must be 0. tree_parents[S] (optional, host, needs keys/values): the S rows are the nodes of a verification tree
// (kernels/cpu/attention_tree.h: row i sees the cache and its ancestors), at the positions pos gives (past + depth);
// without it row i sees the cache and rows ≤ i. The tree runs the CPU kernel on host memory: with a device backend
// it is a dflash::Error. scratch: backend memory, at least attention_scratch_bytes(...), rewound on return.
void attention_forward(kernels::Backend<float>& be, Arena& scratch, float* part, const float* h, const int32_t* pos,
                       int S, const TargetLayer& L, const QwenConfig& c, const TargetShard& shard,
                       float* keys = nullptr, float* values = nullptr, int past = 0,
                       const int* tree_parents = nullptr);
// Scratch attention_forward takes for S rows.
size_t attention_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S);

// part[S, H] (=) this rank's share of out_proj(gated_deltanet(h)); h [S, H]. conv_tail [K−1, local channels] and
// state [local value heads, dk, dv] (optional, backend memory, both or neither; zeros = a fresh sequence) carry the
// earlier positions and are updated in place to include these S. scratch: at least
// gated_deltanet_scratch_bytes(...), rewound.
void gated_deltanet_forward(kernels::Backend<float>& be, Arena& scratch, float* part, const float* h, int S,
                            const TargetLayer& L, const QwenConfig& c, const TargetShard& shard,
                            float* conv_tail = nullptr, float* state = nullptr);
size_t gated_deltanet_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S);

// y[N, out] (=) x[N, in] · Wᵀ on the backend, tolerating an empty shard (out = 0: nothing) or an empty input
// (in = 0: zeros)
void shard_linear(kernels::Backend<float>& be, float* y, const float* x, const float* W, int N, int in, int out);

}  // namespace dflash::model
