#pragma once
// The gated delta rule in the chunked WY / UT form of flash-linear-attention's chunk_gated_delta_rule (and
// transformers' torch_chunk_gated_delta_rule): the CPU twin of kernels/cuda/deltanet_chunked.cu, in straight loops,
// float or double. Same contract as cpu::gated_delta_rule_reference (kernels/cpu/gated_deltanet.h): q, k already
// L2-normed and q already scaled by 1/sqrt(dk) (no further scale here), g the natural-log decay per (token, value
// head), state [v_heads, dk, dv] (row = key dim) before position 0 on entry (null: zero) and after S−1 on return.
//
// Per value head, per chunk of n ≤ chunk positions with state S₀ at its start, γ_i = Σ_{s≤i} g_s (in the chunk):
//   L  = strictly-lower(diag(β) K Kᵀ ⊙ D),  D_ij = e^{γ_i − γ_j}         [n, n]
//   T  = (I + L)⁻¹                          by forward substitution (unit lower-triangular)
//   W  = T diag(β e^γ) K                    [n, dk]   U = T diag(β) V   [n, dv]
//   V' = U − W S₀                           the deltas u of the recurrence
//   O  = diag(e^γ) Q S₀ + (Q Kᵀ ⊙ D ⊙ causal(j ≤ i)) V'
//   S  ← e^{γ_{n−1}} S₀ + (diag(e^{γ_{n−1} − γ}) K)ᵀ V'
// Exactly the recurrence M ← e^g M; u = β (v − Mᵀ k); M ← M + k uᵀ; o = Mᵀ q, reassociated; every exponent ≤ 0.
#include <cstddef>

namespace dflash::cpu {

// out[S, v_heads, dv] (=); q, k [S, k_heads, dk]; v [S, v_heads, dv]; g, beta [S, v_heads]; value head h reads key
// head h / (v_heads / k_heads). Chunks of `chunk` positions (the last may be shorter).
template <typename T>
void gated_delta_rule_chunked_ut(T* out, const T* q, const T* k, const T* v, const T* g, const T* beta, int S,
                                 int k_heads, int v_heads, int dk, int dv, int chunk = 64, T* state = nullptr);

}  // namespace dflash::cpu
