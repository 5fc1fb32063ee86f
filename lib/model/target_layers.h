#pragma once
// One target decoder layer's weights on one TP rank, and its token mixers from the normed input to the rank's
// row-parallel partial sum (the caller all-reduces it): full attention (dense Qwen3, or Qwen3.5's gated attention
// with partial RoPE) and Gated DeltaNet. The math is in docs/target.md; every step is a call on a
// kernels::Backend<T> (kernels/backend.h) in the target's compute type T (float, double on the CPU; float, bf16 on
// CUDA). Weights, activations (part, h, pos), the scratch arena and the caches (TargetCache's buffers) are all in
// the backend's memory; the caches are read and extended in place. Statistics and the DeltaNet gates and recurrent
// state are in A = acc_t<T> (float for bf16) as the kernel contract says.
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "lib/core/buffer.h"
#include "lib/model/qwen_config.h"
#include "lib/model/target_shard.h"

namespace dflash::model {

// One weight tensor in the backend's memory, in T.
template <typename T>
struct TargetWeight {
  Buffer buffer;
  size_t count = 0;  // elements
  const T* data() const { return buffer.as<T>(); }
  size_t size() const { return count; }
  bool empty() const { return count == 0; }
};

// One decoder layer's slices on this rank (shapes with the shard's local sizes: qd = q_count·head_dim,
// kvd = kv_count·head_dim, ic = mlp_end − mlp_begin; DeltaNet: nk key heads of dk, nv value heads of dv held).
// Hybrid RMSNorm weights are stored here as 1 + w (Qwen3.5 scales by 1 + w), so one rmsnorm kernel serves both.
template <typename T>
struct TargetLayer {
  bool linear = false;         // Gated DeltaNet layer (else full attention)
  // The Qwen3 attention and MLP under their Hugging Face names (the drafter's DrafterLayerWeights uses the same)
  TargetWeight<T> input_layernorm;           // [H]
  TargetWeight<T> q_proj;                    // [qd, H]   rows; hybrid: [q_count, 2, head_dim] rows = query, gate
  TargetWeight<T> k_proj, v_proj;            // [kvd, H]  rows
  TargetWeight<T> q_norm;                    // [head_dim]
  TargetWeight<T> k_norm;                    // [head_dim]
  TargetWeight<T> o_proj;                    // [H, qd]   columns
  TargetWeight<T> post_attention_layernorm;  // [H]
  TargetWeight<T> gate_proj, up_proj;        // [ic, H]   rows
  TargetWeight<T> down_proj;                 // [H, ic]   columns
  // Gated DeltaNet (linear_attn.*)
  TargetWeight<T> w_qkv;           // [2·nk·dk + nv·dv, H] rows of in_proj_qkv: this rank's q | k | v channels
  TargetWeight<T> conv;            // [2·nk·dk + nv·dv, K] the same channels of conv1d.weight [C, 1, K]
  TargetWeight<T> w_z;             // [nv·dv, H] rows of in_proj_z (output gate)
  TargetWeight<T> w_b, w_a;        // [nv, H] rows of in_proj_b (β), in_proj_a (decay)
  TargetWeight<T> a_log, dt_bias;  // [nv]
  TargetWeight<T> gated_norm;      // [dv] linear_attn.norm.weight (plain w)
  TargetWeight<T> w_out;           // [H, nv·dv] columns of out_proj
  // Mixture of experts (Qwen3-MoE layers; then gate_proj/up_proj/down_proj are empty): ne = shard.expert_count
  // experts
  // [expert_begin, expert_begin + ne) whole, I = moe_intermediate
  bool moe = false;
  TargetWeight<T> router;  // [E, H] mlp.gate.weight, every rank (replicated); with a shared expert [E + 1, H]:
                           // its gate mlp.shared_expert_gate.weight [1, H] as the last row (one GEMM for both);
                           // the shared expert's channels are in gate_proj/up_proj/down_proj (split like a dense MLP)
  TargetWeight<T> expert_gate, expert_up;      // [ne, I, H] gate_proj, up_proj of the held experts
  TargetWeight<T> expert_down;                 // [ne, H, I] down_proj of the held experts

  size_t elements() const;  // of all the tensors above
};

// part[S, H] (=) this rank's share of o_proj(attention(h)); h [S, H] normed input at positions pos[S] (int32) =
// past .. past + S − 1. keys/values (optional, backend memory, room for [past + S, kv_count, head_dim]): the first
// past rows hold the earlier positions' keys and values; these S rows are written after them. Without them past
// must be 0. tree_parents[S] (optional, host, needs keys/values): the S rows are the nodes of a verification tree
// (kernels/cpu/attention_tree.h: row i sees the cache and its ancestors), at the positions pos gives (past + depth);
// without it row i sees the cache and rows ≤ i. The tree runs the CPU kernel on host memory: with a device backend
// it is a dflash::Error. scratch: backend memory, at least attention_scratch_bytes<T>(...), rewound on return.
template <typename T>
void attention_forward(kernels::Backend<T>& be, Arena& scratch, T* part, const T* h, const int32_t* pos, int S,
                       const TargetLayer<T>& L, const QwenConfig& c, const TargetShard& shard, T* keys = nullptr,
                       T* values = nullptr, int past = 0, const int* tree_parents = nullptr);
// Scratch attention_forward<T> takes for S rows.
template <typename T>
size_t attention_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S);

// part[S, H] (=) this rank's share of out_proj(gated_deltanet(h)); h [S, H]. conv_tail [K−1, local channels] (T)
// and state [local value heads, dk, dv] (A) (optional, backend memory, both or neither; zeros = a fresh sequence)
// carry the earlier positions and are updated in place to include these S. scratch: at least
// gated_deltanet_scratch_bytes<T>(...), rewound.
template <typename T>
void gated_deltanet_forward(kernels::Backend<T>& be, Arena& scratch, T* part, const T* h, int S,
                            const TargetLayer<T>& L, const QwenConfig& c, const TargetShard& shard,
                            T* conv_tail = nullptr, kernels::acc_t<T>* state = nullptr);
template <typename T>
size_t gated_deltanet_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S);

// The router's choice for S tokens, made on the host from the router logits (identical on every TP rank: the
// normed input is): per token the k experts of the largest logits — softmax is monotone, so these are the k largest
// probabilities — in descending order, equal logits going to the lower expert index; their softmax probabilities
// (over all E experts), divided by their sum when norm_topk_prob. Then, per expert, the tokens it serves in
// ascending order with their weights. Computed in double.
struct MoeRouting {
  int S = 0, E = 0, k = 0;
  std::vector<int32_t> chosen;       // [S, k] expert ids
  std::vector<double> weight;        // [S, k] routing weights
  std::vector<int64_t> expert_start;  // [E + 1] offsets into tokens / token_weight
  std::vector<int32_t> tokens;        // [S·k] token ids, grouped by expert, ascending within an expert
  std::vector<double> token_weight;   // [S·k] the matching weights
  std::vector<double> shared_gate;    // [S] sigmoid(shared_expert_gate(h)) (MoE hybrids; else empty)
  int count(int e) const { return int(expert_start[size_t(e) + 1] - expert_start[size_t(e)]); }
};
// logits [S, ld ≥ E] row-major (the first E columns are the router's), any floating type on the host.
template <typename U>
MoeRouting route_tokens(const U* logits, int S, int E, int k, bool norm_topk_prob, int ld = 0);

// part[S, H] (=) this rank's share of the routed MLP of h [S, H]: Σ over its experts e and the tokens t routed to e
// of weight(t, e) · down_e(silu(gate_e(h_t)) ⊙ up_e(h_t)), plus with a shared expert (MoE hybrids)
// sigmoid(shared_expert_gate(h_t)) · this rank's channels of shared_expert(h_t); the caller all-reduces it (the
// experts and channels of the other ranks add theirs). Router logits h · routerᵀ on the backend, the routing on the host (route_tokens), then per held
// expert: gather its tokens' rows, three GEMMs, weighted add back. routing (out): the choice made. scratch: at
// least moe_scratch_bytes<T>(...), rewound.
template <typename T>
void moe_forward(kernels::Backend<T>& be, Arena& scratch, T* part, const T* h, int S, const TargetLayer<T>& L,
                 const QwenConfig& c, const TargetShard& shard, MoeRouting& routing);
template <typename T>
size_t moe_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S);

// y[N, out] (=) x[N, in] · Wᵀ on the backend, tolerating an empty shard (out = 0: nothing) or an empty input
// (in = 0: zeros)
template <typename T>
void shard_linear(kernels::Backend<T>& be, T* y, const T* x, const T* W, int N, int in, int out);

}  // namespace dflash::model
