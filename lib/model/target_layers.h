#pragma once
// The token mixers of one target decoder layer on one TP rank, from the normed input to the rank's row-parallel
// partial sum (the caller all-reduces it): full attention (dense Qwen3, or Qwen3.5's gated attention with partial
// RoPE) and Gated DeltaNet. The math is in docs/target.md; every step is a call on a kernels::Backend<float>
// (kernels/backend.h). Weights, activations (part, h, pos) and the scratch arena are in the backend's memory; the
// caches (TargetCache's host vectors) are used in place on a host backend and staged through the scratch arena
// (upload before, download after) on a device backend.
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "lib/core/buffer.h"
#include "lib/model/qwen_config.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"

namespace dflash::model {

// part[S, H] (=) this rank's share of o_proj(attention(h)); h [S, H] normed input at positions pos[S] (int32) =
// past .. past + S − 1. keys/values (optional, host, [past, kv_count, head_dim] on entry): the earlier positions'
// keys and values, extended by these S rows; without them past must be 0. tree_parents[S] (optional, host, needs
// keys/values): the S rows are the nodes of a verification tree (kernels/cpu/attention_tree.h: row i sees the cache
// and its ancestors), at the positions pos gives (past + depth); without it row i sees the cache and rows ≤ i. The
// tree runs the CPU kernel on host memory: with a device backend it is a dflash::Error. scratch: backend memory,
// at least attention_scratch_bytes(...), rewound on return.
void attention_forward(kernels::Backend<float>& be, Arena& scratch, float* part, const float* h, const int32_t* pos,
                       int S, const TargetLayer& L, const QwenConfig& c, const TargetShard& shard,
                       std::vector<float>* keys = nullptr, std::vector<float>* values = nullptr,
                       const int* tree_parents = nullptr);
// Scratch attention_forward takes for S rows after a cache of `past` positions (the cache staging counts only on a
// device backend).
size_t attention_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S, int past, MemoryKind memory);

// part[S, H] (=) this rank's share of out_proj(gated_deltanet(h)); h [S, H]. conv_tail [K−1, local channels] and
// state [local value heads, dk, dv] (optional, host, both or neither; empty = a fresh sequence) carry the earlier
// positions and are updated to include these S. scratch: at least gated_deltanet_scratch_bytes(...), rewound.
void gated_deltanet_forward(kernels::Backend<float>& be, Arena& scratch, float* part, const float* h, int S,
                            const TargetLayer& L, const QwenConfig& c, const TargetShard& shard,
                            std::vector<float>* conv_tail = nullptr, std::vector<float>* state = nullptr);
size_t gated_deltanet_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S, MemoryKind memory);

// y[N, out] (=) x[N, in] · Wᵀ on the backend, tolerating an empty shard (out = 0: nothing) or an empty input
// (in = 0: zeros)
void shard_linear(kernels::Backend<float>& be, float* y, const float* x, const float* W, int N, int in, int out);

}  // namespace dflash::model
