#pragma once
// The DFlash drafter's hand-coded forward and backward over one sequence's anchors (see docs/drafter.md).
//
//   ctx      = hidden_norm(fc(taps))                                  [S, H]
//   x_0      = embed([token[a_b], MASK × (B-1)] for each anchor b)     [N*B, H]
//   x_{l+1}  = decoder_layer_l(x_l, ctx)   (Q from the block; K/V from [ctx ; block]; DFlash mask)
//   out      = norm(x_L)                                               [N*B, H]
// Embedding and lm_head are the target's, frozen: inputs, never trained.
#include <cstdint>
#include <vector>

#include "kernels/cpu/attention_dflash.h"
#include "lib/model/drafter_params.h"

namespace dflash {

template <typename T>
struct DrafterInputs {
  const T* taps = nullptr;          // [S, n_taps*H]  target hidden states at the tap layers
  const int32_t* tokens = nullptr;  // [S]            the sequence
  int seq_len = 0;                  // S
  const int* anchors = nullptr;     // [N]            block starts, each in [0, S); may overlap, any order
  int n_anchors = 0;                // N
  const T* embed = nullptr;         // [V, H]         frozen target embedding
};

// What one decoder layer's backward needs, saved by forward.
template <typename T>
struct DrafterLayerActs {
  std::vector<T> x_in;     // [NB, H]      residual stream entering the layer
  std::vector<T> rstd_in;  // [NB]
  std::vector<T> xn;       // [NB, H]      input_layernorm(x_in)
  std::vector<T> q_raw;    // [NB, NH*D]   q_proj(xn) before q_norm
  std::vector<T> q_rstd;   // [NB*NH]
  std::vector<T> q;        // [NB, NH*D]   after q_norm and RoPE
  std::vector<T> kb_raw;   // [NB, KVH*D]  block keys before k_norm
  std::vector<T> kb_rstd;  // [NB*KVH]
  std::vector<T> kb;       // [NB, KVH*D]  after k_norm and RoPE
  std::vector<T> vb;       // [NB, KVH*D]
  std::vector<T> kc_raw;   // [S, KVH*D]   context keys before k_norm
  std::vector<T> kc_rstd;  // [S*KVH]
  std::vector<T> kc;       // [S, KVH*D]   after k_norm and RoPE
  std::vector<T> vc;       // [S, KVH*D]
  std::vector<T> attn;     // [NB, NH*D]   attention output before o_proj
  std::vector<T> lse;      // [NB*NH]
  std::vector<T> x_mid;    // [NB, H]      x_in + o_proj(attn)
  std::vector<T> rstd_post;// [NB]
  std::vector<T> xn2;      // [NB, H]      post_attention_layernorm(x_mid)
  std::vector<T> gate;     // [NB, I]
  std::vector<T> up;       // [NB, I]
  std::vector<T> h;        // [NB, I]      silu(gate) * up
};

// The forward context: everything backward needs, plus the output.
template <typename T>
struct DrafterActivations {
  int seq_len = 0, n_blocks = 0;
  std::vector<int> anchors;        // [N]
  std::vector<int> ctx_pos;        // [S]     0..S-1
  std::vector<int> blk_pos;        // [NB]    anchor_b + j
  std::vector<int32_t> blk_tokens; // [NB]    token[anchor_b], then mask_token_id
  std::vector<T> fc_out;           // [S, H]
  std::vector<T> ctx_rstd;         // [S]
  std::vector<T> ctx;              // [S, H]  hidden_norm(fc(taps))
  std::vector<DrafterLayerActs<T>> layer;  // [L]
  std::vector<T> x_last;           // [NB, H] residual stream after the last layer
  std::vector<T> rstd_final;       // [NB]
  std::vector<T> out;              // [NB, H] final hidden = norm(x_last)
};

// Runs the drafter on one sequence's anchors; acts.out holds the final hidden [N*B, H].
// Throws dflash::Error on an anchor outside [0, S) or a token outside the vocabulary.
template <typename T>
void drafter_forward(const DrafterConfig& cfg, const DrafterParams<T>& w, const DrafterInputs<T>& in,
                     DrafterActivations<T>& acts);

// grads (+=) d(loss)/d(every trainable tensor), given d_out = d(loss)/d(acts.out) [N*B, H].
template <typename T>
void drafter_backward(const DrafterConfig& cfg, const DrafterParams<T>& w, const DrafterInputs<T>& in,
                      const DrafterActivations<T>& acts, const T* d_out, DrafterParams<T>& grads);

// The attention shape of layer l for this forward.
cpu::DFlashAttentionShape drafter_attention_shape(const DrafterConfig& cfg, int layer, int seq_len, int n_blocks);

// FLOPs of one forward (GEMMs + attention) and of one backward, for benchmarks.
struct DrafterFlops {
  double forward = 0, backward = 0;
};
DrafterFlops drafter_flops(const DrafterConfig& cfg, int seq_len, const std::vector<int>& anchors);

}  // namespace dflash
