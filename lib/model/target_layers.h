#pragma once
// The token mixers of one target decoder layer on one TP rank, from the normed input to the rank's row-parallel
// partial sum (the caller all-reduces it): full attention (dense Qwen3, or Qwen3.5's gated attention with partial
// RoPE) and Gated DeltaNet. The math is in docs/target.md; every step is a call on a kernels::Backend<float>
// (kernels/backend.h). The arrays (weights, activations, caches) are host std::vectors, so `be` must be a CPU
// backend for now: running these on CUDA needs the weights, activations and caches in device memory.
#include "kernels/backend.h"
#include "lib/model/qwen_config.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"

namespace dflash::model {

// part[S, H] (=) this rank's share of o_proj(attention(h)); h [S, H] normed input at positions pos[S] =
// past .. past + S − 1. keys/values (optional, [past, kv_count, head_dim] on entry): the earlier positions' keys and
// values, extended by these S rows; without them past must be 0. tree_parents[S] (optional, needs keys/values): the
// S rows are the nodes of a verification tree (kernels/cpu/attention_tree.h: row i sees the cache and its
// ancestors), at the positions pos gives (past + depth); without it row i sees the cache and rows ≤ i.
void attention_forward(kernels::Backend<float>& be, float* part, const float* h, const int* pos, int S,
                       const TargetLayer& L, const QwenConfig& c, const TargetShard& shard,
                       std::vector<float>* keys = nullptr, std::vector<float>* values = nullptr,
                       const int* tree_parents = nullptr);

// part[S, H] (=) this rank's share of out_proj(gated_deltanet(h)); h [S, H]. conv_tail [K−1, local channels] and
// state [local value heads, dk, dv] (optional, both or neither; empty = a fresh sequence) carry the earlier
// positions and are updated to include these S.
void gated_deltanet_forward(kernels::Backend<float>& be, float* part, const float* h, int S, const TargetLayer& L,
                            const QwenConfig& c, const TargetShard& shard, std::vector<float>* conv_tail = nullptr,
                            std::vector<float>* state = nullptr);

// y[N, out] (=) x[N, in] · Wᵀ, tolerating an empty shard (out = 0) or an empty input (in = 0 → zeros)
void shard_linear(float* y, const float* x, const float* W, int N, int in, int out);

}  // namespace dflash::model
