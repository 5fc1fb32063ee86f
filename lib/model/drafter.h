#pragma once
// The DFlash drafter's hand-coded forward and backward over one sequence's anchors (see docs/drafter.md), written
// once over the kernel contracts of kernels/backend.h (CPU or CUDA).
//
//   ctx      = hidden_norm(fc(taps))                                  [S, H]
//   x_0      = embed([token[a_b], MASK × (B-1)] for each anchor b)     [N*B, H]
//   x_{l+1}  = decoder_layer_l(x_l, ctx)   (Q from the block; K/V from [ctx ; block]; DFlash mask)
//   out      = norm(x_L)                                               [N*B, H]
// Embedding and lm_head are the target's, frozen: inputs, never trained.
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "lib/core/buffer.h"
#include "lib/model/drafter_params.h"

namespace dflash::model {

using kernels::DFlashAttentionShape;

// Where the drafter's kernels run: a backend, its execution context, and the arena that holds the activations
// (one per drafter rank, sized up front by drafter_arena_bytes for the largest sequence of the run).
template <typename T>
struct DrafterRuntime {
  kernels::Backend<T>& backend;
  ExecContext& exec;
};

template <typename T>
struct DrafterInputs {
  const T* taps = nullptr;          // [S, n_taps*H]  target hidden states at the tap layers (backend memory)
  const int32_t* tokens = nullptr;  // [S]            the sequence (host)
  int seq_len = 0;                  // S
  const int* anchors = nullptr;     // [N]            block starts, each in [0, S); may overlap, any order (host)
  int n_anchors = 0;                // N
  const T* embed = nullptr;         // [V, H]         frozen target embedding (backend memory)
};

// What one decoder layer's backward needs, saved by forward. Views into the activation arena.
template <typename T>
struct DrafterLayerActs {
  using A = kernels::acc_t<T>;
  const T* x_in = nullptr;  // [NB, H]      residual stream entering the layer (the previous layer's x_out)
  A* rstd_in = nullptr;     // [NB]
  T* xn = nullptr;          // [NB, H]      input_layernorm(x_in)
  T* q_raw = nullptr;       // [NB, NH*D]   q_proj(xn) before q_norm
  A* q_rstd = nullptr;      // [NB*NH]
  T* q = nullptr;           // [NB, NH*D]   after q_norm and RoPE
  T* kb_raw = nullptr;      // [NB, KVH*D]  block keys before k_norm
  A* kb_rstd = nullptr;     // [NB*KVH]
  T* kb = nullptr;          // [NB, KVH*D]  after k_norm and RoPE
  T* vb = nullptr;          // [NB, KVH*D]
  T* kc_raw = nullptr;      // [S, KVH*D]   context keys before k_norm
  A* kc_rstd = nullptr;     // [S*KVH]
  T* kc = nullptr;          // [S, KVH*D]   after k_norm and RoPE
  T* vc = nullptr;          // [S, KVH*D]
  T* attn = nullptr;        // [NB, NH*D]   attention output before o_proj
  A* lse = nullptr;         // [NB*NH]
  T* x_mid = nullptr;       // [NB, H]      x_in + o_proj(attn)
  A* rstd_post = nullptr;   // [NB]
  T* xn2 = nullptr;         // [NB, H]      post_attention_layernorm(x_mid)
  T* gate = nullptr;        // [NB, I]
  T* up = nullptr;          // [NB, I]
  T* h = nullptr;           // [NB, I]      silu(gate) * up
  T* x_out = nullptr;       // [NB, H]      x_mid + down_proj(h): the next layer's x_in
};

// The forward context: everything backward needs, plus the output. Owns the activation arena (backend memory).
template <typename T>
struct DrafterActivations {
  using A = kernels::acc_t<T>;
  Arena arena;                     // every array below lives here; forward resets it
  int seq_len = 0, n_blocks = 0;
  std::vector<int> anchors;        // [N]     host copies of the block bookkeeping
  std::vector<int32_t> blk_tokens; // [NB]    token[anchor_b], then mask_token_id
  int32_t* anchors_dev = nullptr;  // [N]     the same in backend memory
  int32_t* ctx_pos = nullptr;      // [S]     0..S-1
  int32_t* blk_pos = nullptr;      // [NB]    anchor_b + j
  int32_t* blk_tokens_dev = nullptr;  // [NB]
  T* fc_out = nullptr;             // [S, H]
  A* ctx_rstd = nullptr;           // [S]
  T* ctx = nullptr;                // [S, H]  hidden_norm(fc(taps))
  T* x_embed = nullptr;            // [NB, H] embedded block tokens: layer 0's input
  T* proj_out = nullptr;           // [NB, H] o_proj / down_proj output before the residual add (forward scratch)
  std::vector<DrafterLayerActs<T>> layer;  // [L]
  A* rstd_final = nullptr;         // [NB]
  T* out = nullptr;                // [NB, H] final hidden = norm(x_L)

  // Sizes the arena for sequences up to max_seq_len with n_anchors anchors (the run plan's maximum), in the
  // backend's memory. forward grows it when a call needs more (tests, tools); the trainer never does.
  void reserve(MemoryKind kind, const DrafterConfig& cfg, int max_seq_len, int n_anchors);
};

// Bytes of arena one forward + backward on S positions and N anchors takes (alignment included): the peak, metered
// over the same array lists (drafter.cpp, bind_*) the forward and backward take their pointers from. elem_bytes /
// acc_bytes pick the instantiation: 4/4 float, 8/8 double, 2/4 bf16; anything else is a dflash::Error.
size_t drafter_arena_bytes(const DrafterConfig& cfg, int seq_len, int n_anchors, size_t elem_bytes,
                           size_t acc_bytes);

// Runs the drafter on one sequence's anchors; acts.out holds the final hidden [N*B, H] (backend memory).
// Throws dflash::Error on an anchor outside [0, S) or a token outside the vocabulary (validated on the host).
template <typename T>
void drafter_forward(const DrafterConfig& cfg, const DrafterWeights<T>& w, const DrafterInputs<T>& in,
                     DrafterActivations<T>& acts, const DrafterRuntime<T>& rt);

// grads (+=) d(loss)/d(every trainable tensor), given d_out = d(loss)/d(acts.out) [N*B, H] (backend memory).
template <typename T>
void drafter_backward(const DrafterConfig& cfg, const DrafterWeights<T>& w, const DrafterInputs<T>& in,
                      DrafterActivations<T>& acts, const T* d_out, DrafterWeights<kernels::acc_t<T>>& grads,
                      const DrafterRuntime<T>& rt);

// The same on the host CPU backend, over host parameters (tests, tools, benchmarks).
template <typename T>
void drafter_forward(const DrafterConfig& cfg, const DrafterParams<T>& w, const DrafterInputs<T>& in,
                     DrafterActivations<T>& acts);
template <typename T>
void drafter_backward(const DrafterConfig& cfg, const DrafterParams<T>& w, const DrafterInputs<T>& in,
                      DrafterActivations<T>& acts, const T* d_out, DrafterParams<T>& grads);

// The attention shape of layer l for this forward.
DFlashAttentionShape drafter_attention_shape(const DrafterConfig& cfg, int layer, int seq_len, int n_blocks);

// FLOPs of one forward (GEMMs + attention) and of one backward, for benchmarks.
struct DrafterFlops {
  double forward = 0, backward = 0;
};
DrafterFlops drafter_flops(const DrafterConfig& cfg, int seq_len, const std::vector<int>& anchors);

}  // namespace dflash::model
