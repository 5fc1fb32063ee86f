#pragma once
// How the CUDA kernels of the target's forward walk their math, host and device (the element formulas themselves,
// silu, the conv tap, l2norm, gated RMSNorm, the gates, RoPE and the argmax rule, are kernels/math's, which the CPU
// kernels call too, and the kernels call them there):
//   causal attention over a cache   which keys a query row sees (causal_key_count)
//   causal conv1d + SiLU            where tap j of output row t reads in [tail ; x] (conv_tap_row)
//   gated delta rule                one token on a slice of rows of one value column (delta_slice_dot / _update)
// tests/unit/test_cuda_math_target.cpp runs these on the CPU, walked in the order the CUDA kernels walk them, against
// kernels/cpu.
#include "kernels/math/hd.h"  // DFLASH_HD

namespace dflash::kernels::cuda_math {

// Keys 0 .. past + i are visible to query row i of a call that continues a sequence of `past` cached positions.
DFLASH_HD inline int causal_key_count(int past, int i) { return past + i + 1; }

// The input of tap j (< K) of output row t sits at row t + j of [tail (K−1 rows) ; x (S rows)]: returns true with
// its tail row, or false with its x row. The new tail after S rows is rows S .. S + K − 2 of the same
// concatenation, so conv_tap_row(S, r, K, row) locates new tail row r.
DFLASH_HD inline bool conv_tap_row(int t, int j, int K, int& row) {
  const int m = t + j;
  if (m < K - 1) {
    row = m;
    return true;
  }
  row = m - (K - 1);
  return false;
}
// The taps are summed in tap order j = 0 .. K−1 (the CPU's order) with math::conv_tap (kernels/math/gates.h).

// The gated delta rule, split as deltanet.cu's kernel runs it: each value column's dk state rows are cut into
// kDeltaRowGroups consecutive slices of R rows (R ≥ ⌈dk / groups⌉, a multiple of 4; the last slices may hold
// fewer, or none), one thread per slice holding its rows in registers m[0 .. n). Per token, with decay = e^g:
//   pred = Σ_slices delta_slice_dot(m, k)           the prediction Σ_i M_i k_i of the state before the decay
//   u    = delta_u(pred, decay, v_d, β)              β (v_d − decay · pred)
//   o_d  = Σ_slices delta_slice_update(m, k, q, …)  M ← decay · M + k u, then Σ_i M_i q_i of the updated rows
// = the recurrence M ← e^g M; u = β (v − Mᵀk); M ← M + k uᵀ; o = Mᵀq (kernels/cpu/gated_deltanet.h). Sums: four
// interleaved accumulators within a slice (rows j ≡ 0, 1, 2, 3 mod 4, combined (a0 + a1) + (a2 + a3)), then the
// slices in order 0 .. groups − 1. The loops run to the compile-time R so that m stays in registers on the GPU.
constexpr int kDeltaRowGroups = 4;

#if defined(__CUDA_ARCH__)
#define DFLASH_UNROLL _Pragma("unroll")
#else
#define DFLASH_UNROLL
#endif

template <int R>
DFLASH_HD inline float delta_slice_dot(const float (&m)[R], const float* x, int n) {
  static_assert(R % 4 == 0, "slices hold a multiple of 4 rows");
  float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  DFLASH_UNROLL
  for (int j = 0; j < R; j += 4) {
    if (j < n) a0 += m[j] * x[j];
    if (j + 1 < n) a1 += m[j + 1] * x[j + 1];
    if (j + 2 < n) a2 += m[j + 2] * x[j + 2];
    if (j + 3 < n) a3 += m[j + 3] * x[j + 3];
  }
  return (a0 + a1) + (a2 + a3);
}

DFLASH_HD inline float delta_u(float pred, float decay, float v_d, float beta) { return beta * (v_d - decay * pred); }

template <int R>
DFLASH_HD inline float delta_slice_update(float (&m)[R], const float* k, const float* q, int n, float decay, float u) {
  static_assert(R % 4 == 0, "slices hold a multiple of 4 rows");
  float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  DFLASH_UNROLL
  for (int j = 0; j < R; j += 4) {
    if (j < n) a0 += (m[j] = decay * m[j] + k[j] * u) * q[j];
    if (j + 1 < n) a1 += (m[j + 1] = decay * m[j + 1] + k[j + 1] * u) * q[j + 1];
    if (j + 2 < n) a2 += (m[j + 2] = decay * m[j + 2] + k[j + 2] * u) * q[j + 2];
    if (j + 3 < n) a3 += (m[j + 3] = decay * m[j + 3] + k[j + 3] * u) * q[j + 3];
  }
  return (a0 + a1) + (a2 + a3);
}

// Rows per slice for key dimension dk: the smallest of 8, 16, 32, 64 that covers ⌈dk / kDeltaRowGroups⌉ (dk ≤ 256).
DFLASH_HD inline int delta_slice_rows(int dk) {
  const int need = (dk + kDeltaRowGroups - 1) / kDeltaRowGroups;
  return need <= 8 ? 8 : need <= 16 ? 16 : need <= 32 ? 32 : 64;
}

}  // namespace dflash::kernels::cuda_math
