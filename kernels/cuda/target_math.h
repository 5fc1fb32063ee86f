#pragma once
// Per-element / per-column math of the CUDA kernels of the target's forward, host and device (the formulas of
// kernels/cpu/gated_deltanet.cpp, rope_partial.cpp, elementwise.cpp and attention_decode.cpp):
//   causal attention over a cache   which keys a query row sees (causal_key_count)
//   causal conv1d + SiLU            where tap j of output row t reads in [tail ; x] (conv_tap_row), the tap sum
//   l2norm, gated RMSNorm, gates    the row factor / element formulas
//   gated delta rule                one token's update of one value column of a head's state (delta_rule_step)
//   argmax over a row               a mergeable running (value, first index) pair (ArgMax)
// tests/unit/test_cuda_math.cpp runs these on the CPU, walked in the order the CUDA kernels walk them, against
// kernels/cpu. Partial RoPE reuses rope_cos_sin / rope_rotate of norm_math.h with rot_dim in place of head_dim.
#include <math.h>

#include "kernels/attention_shape.h"  // DFLASH_HD
#include "kernels/cuda/norm_math.h"    // sigmoidf

namespace dflash::kernels::cuda_math {

// Keys 0 .. past + i are visible to query row i of a call that continues a sequence of `past` cached positions.
DFLASH_HD inline int causal_key_count(int past, int i) { return past + i + 1; }

// silu(x) = x / (1 + e^−x), the CPU's form (kernels/cpu/gated_deltanet.cpp).
DFLASH_HD inline float siluf(float x) { return x / (1.0f + expf(-x)); }

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
// One tap of the depthwise conv, accumulated in tap order j = 0 .. K−1 (the CPU's order).
DFLASH_HD inline float conv_tap(float acc, float w, float x) { return acc + w * x; }

// l2norm's row factor scale / sqrt(Σx² + eps).
DFLASH_HD inline float l2norm_factor(float sum_sq, float eps, float scale) { return scale / sqrtf(sum_sq + eps); }

// Gated RMSNorm's element w · (x · rstd) · silu(z), rstd = rmsnorm_rstd(Σx², dim, eps).
DFLASH_HD inline float gated_rmsnorm_y(float x, float rstd, float w, float z) { return w * (x * rstd) * siluf(z); }

// The attention output gate: x · sigmoid(gate).
DFLASH_HD inline float sigmoid_gate(float x, float gate) { return x * sigmoidf(gate); }

// Gated DeltaNet's gates: β = sigmoid(b); g = −exp(a_log) · softplus(a + dt_bias), softplus linear above 20.
DFLASH_HD inline float deltanet_beta(float b) { return 1.0f / (1.0f + expf(-b)); }
DFLASH_HD inline float deltanet_g(float a, float dt_bias, float a_log) {
  const float x = a + dt_bias;
  const float softplus = x > 20.0f ? x : log1pf(expf(x));
  return -expf(a_log) * softplus;
}

// One token of the gated delta rule for value column d of one head's state M [dk, dv], whose column is m[i·ld]
// (i < dk): M ← e^g M; u = β (v_d − Σ_i M_i k_i); M ← M + k u; returns o_d = Σ_i M_i q_i (the updated M).
// Two passes over the column, the sums in the reference's order (i = 0 .. dk−1).
DFLASH_HD inline float delta_rule_step(float* m, int ld, const float* k, const float* q, int dk, float v_d, float g,
                                       float beta) {
  const float decay = expf(g);
  float pred = 0;
  for (int i = 0; i < dk; ++i) {
    m[i * ld] *= decay;
    pred += m[i * ld] * k[i];
  }
  const float u = beta * (v_d - pred);
  float o = 0;
  for (int i = 0; i < dk; ++i) {
    m[i * ld] += k[i] * u;
    o += m[i * ld] * q[i];
  }
  return o;
}

// Running argmax of (part of) a row: the largest non-NaN value and its first index; index −1 while none. add()
// takes elements in increasing index order; merge() combines partials over any split (ties: the lower index).
struct ArgMax {
  float value = -INFINITY;
  int index = -1;
  DFLASH_HD void add(float x, int i) {
    if (x == x && (index < 0 || x > value)) {  // x == x: not NaN
      value = x;
      index = i;
    }
  }
  DFLASH_HD void merge(const ArgMax& o) {
    if (o.index < 0) return;
    if (index < 0 || o.value > value || (o.value == value && o.index < index)) {
      value = o.value;
      index = o.index;
    }
  }
};

}  // namespace dflash::kernels::cuda_math
