#pragma once
// The gated delta rule in the chunked WY / UT form of flash-linear-attention's chunk_gated_delta_rule (and
// transformers' torch_chunk_gated_delta_rule): the CPU twin of kernels/cuda/deltanet_chunked.cu, in straight loops,
// float or double, in the kernel's order of operations. Same contract as cpu::gated_delta_rule_reference
// (kernels/cpu/gated_deltanet.h): q, k already L2-normed and q already scaled by 1/sqrt(dk) (no further scale here),
// g the natural-log decay per (token, value head), state [v_heads, dk, dv] (row = key dim) before position 0 on
// entry (null: zero) and after S−1 on return.
//
// Per value head, per chunk of n ≤ chunk positions with state S₀ at its start, in the kernel's three passes:
//  (1) per chunk, independent of the state:
//   γ  = the decays' cumulative sum inside the chunk, in the kernel's warp-scan order (below)
//   A  = strictly-lower(diag(β) K Kᵀ ⊙ D),  D_ij = e^{γ_i − γ_j}         [n, n]
//   T  = (I + A)⁻¹ in 16×16 blocks: the diagonal blocks by forward substitution (column j: T_ij = −(A_ij +
//        Σ_{j<m<i} A_im T_mj)), then the blocks below them by distance d = 1, 2, …: T_ij = −T_ii Σ_{j≤m<i} A_im T_mj
//   W  = T diag(β e^γ) K   [n, dk]            U = T diag(β) V   [n, dv]
//  (2) the serial pass that carries the state:
//   V' = U − W S₀                               the deltas of the recurrence
//   S  ← e^{γ_{n−1}} S₀ + Kᵀ (diag(e^{γ_{n−1} − γ}) V')
//  (3) per chunk again:
//   O  = diag(e^γ) Q S₀ + (Q Kᵀ ⊙ D ⊙ causal(j ≤ i)) V'
// Exactly the recurrence M ← e^g M; u = β (v − Mᵀ k); M ← M + k uᵀ; o = Mᵀ q, reassociated; every exponent ≤ 0.
//
// γ's scan (the kernel's: two warps of 32 lanes, Hillis–Steele): within each run of 32 positions, for offset 1, 2,
// 4, 8, 16, x_i ← x_i + x_{i−offset} where i − offset stays in the run (all from the previous round's values); then
// each later run adds the finished last value of the run before it. Positions past n carry g = 0 (γ_{n−1}, up to the grouping of its sums).
//
// kernel_roundings: round to bf16 where the CUDA kernel does (fla's places: β e^γ K, β V, T, W, U, the state S₀ as
// the mma operand, V', e^{γ_{n−1} − γ} V', the decayed scores Q Kᵀ ⊙ D, the output), computing in T elsewhere: the
// kernel's arithmetic but for the order of its fp32 sums, its exponentials and its bf16x3 products in T's merge.
#include <cstddef>
#include <vector>

namespace dflash::cpu {

// The kernel's scratch as the twin computes it, for a line-by-line comparison (chunk = 64 gives the kernel's
// layout, kernels/delta_rule_chunks.h; P = chunk · ⌈S / chunk⌉ rows, a partial last chunk padded).
template <typename T>
struct ChunkedTrace {
  std::vector<T> gamma;   // [v_heads, P]             γ (padding: the scan over g = 0, ≈ γ_{n−1})
  std::vector<T> w;       // [v_heads, P, dk]          W (padding: 0)
  std::vector<T> states;  // [v_heads, chunks, dk, dv] S₀ of each chunk, rounded as the mma operand with roundings
};

// out[S, v_heads, dv] (=); q, k [S, k_heads, dk]; v [S, v_heads, dv]; g, beta [S, v_heads]; value head h reads key
// head h / (v_heads / k_heads). Chunks of `chunk` positions (the last may be shorter). trace: null, or filled.
template <typename T>
void gated_delta_rule_chunked_ut(T* out, const T* q, const T* k, const T* v, const T* g, const T* beta, int S,
                                 int k_heads, int v_heads, int dk, int dv, int chunk = 64, T* state = nullptr,
                                 bool kernel_roundings = false, ChunkedTrace<T>* trace = nullptr);

// γ of one chunk: gam[0, chunk) (=) the scan above of g[0, n) (g_i = 0 for i ≥ n).
template <typename T>
void chunk_decay_scan(T* gam, const T* g, int n, int chunk);

}  // namespace dflash::cpu
