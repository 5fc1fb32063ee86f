#pragma once
// Element formulas of the target's Gated DeltaNet and gated attention, host and device: the only copy. The CPU
// kernels (kernels/cpu/gated_deltanet.cpp, elementwise.cpp; F = float or double) and the CUDA kernels
// (kernels/cuda/deltanet.cu, elementwise.cu; F = float) call these. The recurrence itself is not here: the CPU runs
// it per token or in chunks, CUDA in register slices (kernels/cuda/target_math.h), and the two are compared in
// tests/unit/test_cuda_math_target.cpp.
#include <math.h>

#include "kernels/math/hd.h"
#include "kernels/math/norm.h"  // sqrt_of, exp_of, sigmoid

namespace dflash::kernels::math {

DFLASH_HD inline float log1p_of(float x) { return log1pf(x); }
DFLASH_HD inline double log1p_of(double x) { return log1p(x); }

// silu(x) = x / (1 + e^−x)
template <typename F>
DFLASH_HD inline F silu(F x) {
  return x / (F(1) + exp_of(-x));
}
// One tap of the depthwise causal conv, accumulated in tap order j = 0 .. K−1.
template <typename F>
DFLASH_HD inline F conv_tap(F acc, F w, F x) {
  return acc + w * x;
}
// l2norm's row factor scale / sqrt(Σx² + eps).
template <typename F>
DFLASH_HD inline F l2norm_factor(F sum_sq, F eps, F scale) {
  return scale / sqrt_of(sum_sq + eps);
}
// Gated RMSNorm's element w · (x · rstd) · silu(z), rstd = rmsnorm_rstd(Σx², dim, eps).
template <typename F>
DFLASH_HD inline F gated_rmsnorm_y(F x, F rstd, F w, F z) {
  return w * (x * rstd) * silu(z);
}
// The attention output gate: x · sigmoid(gate).
template <typename F>
DFLASH_HD inline F sigmoid_gate(F x, F gate) {
  return x * sigmoid(gate);
}
// Gated DeltaNet's gates: β = sigmoid(b); g = −exp(a_log) · softplus(a + dt_bias), softplus linear above 20 (as
// torch).
template <typename F>
DFLASH_HD inline F deltanet_beta(F b) {
  return sigmoid(b);
}
template <typename F>
DFLASH_HD inline F deltanet_g(F a, F dt_bias, F a_log) {
  const F x = a + dt_bias;
  const F softplus = x > F(20) ? x : log1p_of(exp_of(x));
  return -exp_of(a_log) * softplus;
}

}  // namespace dflash::kernels::math
