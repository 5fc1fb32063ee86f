#pragma once
// Gated DeltaNet (Qwen3.5 / Qwen3.6 linear attention), forward only, in pieces:
//   causal_conv1d_silu  short depthwise causal convolution over the fused q|k|v channels, then SiLU
//   l2norm              q and k per head: x · rsqrt(Σx² + eps)
//   gated_delta_rule    the recurrence, chunked (and a plain per-token reference)
//   deltanet_gates      the decay g and the write strength β of every token and value head
//   gated_rmsnorm       per value head: w · x · rsqrt(mean(x²) + eps) · silu(z)   (plain w, not 1 + w)
//
// The recurrence, per value head with state M [dk, dv] (zero at position 0), key head = value head / (v_heads /
// k_heads) (each key head serves that many consecutive value heads):
//   M ← exp(g_t) · M                       decay, g_t ≤ 0
//   u_t = β_t · (v_t − Mᵀ k_t)             the delta: what the decayed state mispredicts for k_t, scaled by β_t
//   M ← M + k_t u_tᵀ
//   o_t = Mᵀ q_t
// Chunked form over a chunk of n positions starting with state M₀, γ_i = Σ_{s≤i} g_s (within the chunk):
//   u_i + Σ_{j<i} β_i e^{γ_i−γ_j} (k_i·k_j) u_j = β_i (v_i − e^{γ_i} M₀ᵀ k_i)    (unit lower-triangular solve)
//   o_i = e^{γ_i} M₀ᵀ q_i + Σ_{j≤i} e^{γ_i−γ_j} (q_i·k_j) u_j
//   M_end = e^{γ_{n−1}} M₀ + Σ_j e^{γ_{n−1}−γ_j} k_j u_jᵀ
// Every exponent is ≤ 0, so nothing overflows.
#include <cstddef>

namespace dflash::cpu {

// y[S, C] (=) silu(Σ_{j<K} w[c, j] · x[t − (K−1) + j, c]) with x = 0 before position 0; x[S, C], w[C, K].
template <typename T>
void causal_conv1d_silu_forward(T* y, const T* x, const T* w, int S, int C, int K);

// x[rows, dim] (=, in place) x · rsqrt(Σ x² + eps) · scale
template <typename T>
void l2norm_forward(T* x, int rows, int dim, T eps, T scale);

// Per-token gates from the projections a, b [rows, heads] and per-head a_log, dt_bias [heads]:
// beta (=) sigmoid(b), g (=) −exp(a_log) · softplus(a + dt_bias), softplus linear above 20 (as torch's).
// g may alias a, beta may alias b.
template <typename T>
void deltanet_gates_forward(T* g, T* beta, const T* a, const T* b, const T* a_log, const T* dt_bias, int rows,
                            int heads);

// y[rows, dim] (=) w · x · rsqrt(mean(x²) + eps) · silu(z); x, z [rows, dim], w [dim]. y may alias x.
template <typename T>
void gated_rmsnorm_forward(T* y, const T* x, const T* z, const T* w, int rows, int dim, T eps);

// out[S, v_heads, dv] (=). q, k [S, k_heads, dk] (already L2-normed, q scaled by 1/sqrt(dk)), v [S, v_heads, dv],
// g, beta [S, v_heads]. state [v_heads, dk, dv]: the state before position 0 on entry (null: zero) and after
// position S−1 on return. Chunks of `chunk` positions; the last may be shorter.
template <typename T>
void gated_delta_rule_forward(T* out, const T* q, const T* k, const T* v, const T* g, const T* beta, int S,
                              int k_heads, int v_heads, int dk, int dv, int chunk = 64, T* state = nullptr);

// Plain reference of the same contract: one position at a time, straight loops (the recurrence above).
template <typename T>
void gated_delta_rule_reference(T* out, const T* q, const T* k, const T* v, const T* g, const T* beta, int S,
                                int k_heads, int v_heads, int dk, int dv, T* state = nullptr);

}  // namespace dflash::cpu
