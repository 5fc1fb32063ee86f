#pragma once
// Per-row / per-element math of RMSNorm, RoPE and SwiGLU, host and device: the only copy. The CPU kernels
// (kernels/cpu/rmsnorm.cpp, rope.cpp, elementwise.cpp; F = float or double) and the CUDA kernels
// (kernels/cuda/norm_rope.cu, elementwise.cu, deltanet.cu; F = float) call these, so the two
// differ only in the order of their row sums and in nvcc's fused multiply-adds.
#include <math.h>

#include "kernels/math/hd.h"

namespace dflash::kernels::math {

// sqrt and exp in the argument's type (sqrtf / expf for float, on the host as on the device)
DFLASH_HD inline float sqrt_of(float x) { return sqrtf(x); }
DFLASH_HD inline double sqrt_of(double x) { return sqrt(x); }
DFLASH_HD inline float exp_of(float x) { return expf(x); }
DFLASH_HD inline double exp_of(double x) { return exp(x); }

// ---- RMSNorm: y = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps) ----
// rstd of a row from its Σ x².
template <typename F>
DFLASH_HD inline F rmsnorm_rstd(F sum_sq, int dim, F eps) {
  return F(1) / sqrt_of(sum_sq / F(dim) + eps);
}
template <typename F>
DFLASH_HD inline F rmsnorm_y(F x, F rstd, F w) {
  return x * rstd * w;
}
// Backward, with n = x·rstd and g = dy ⊙ w: the row's Σ g ⊙ n term and dx_i = rstd · (g_i − n_i · mean(g ⊙ n)).
template <typename F>
DFLASH_HD inline F rmsnorm_gn(F dy, F w, F x, F rstd) {
  return dy * w * x * rstd;
}
template <typename F>
DFLASH_HD inline F rmsnorm_dx(F dy, F w, F x, F rstd, F mean_gn) {
  return rstd * (dy * w - x * rstd * mean_gn);
}
// dw_i term of one row: dy_i · x_i · rstd
template <typename F>
DFLASH_HD inline F rmsnorm_dw_term(F dy, F x, F rstd) {
  return dy * x * rstd;
}

// ---- RoPE, rotate-half: dimension i pairs with i + D/2 ----
// pos · θ^(−2i/D) in double: positions up to ~1e5 times frequencies near 1 lose digits in float.
DFLASH_HD inline double rope_angle(int pos, int i, int head_dim, double theta) {
  return double(pos) * pow(theta, -2.0 * i / head_dim);
}
// cos and sin of that angle, formed in double and rounded to F once.
template <typename F>
DFLASH_HD inline void rope_cos_sin(int pos, int i, int head_dim, double theta, F& c, F& s) {
  const double angle = rope_angle(pos, i, head_dim, theta);
  c = F(cos(angle));
  s = F(sin(angle));
}
// The pair (x_i, x_{i+D/2}) rotated by the angle whose cos/sin are c, s (s negated for backward).
template <typename F>
DFLASH_HD inline void rope_rotate(F a, F b, F c, F s, F& ya, F& yb) {
  ya = a * c - b * s;
  yb = b * c + a * s;
}

// ---- SwiGLU: h = silu(gate) · up ----
template <typename F>
DFLASH_HD inline F sigmoid(F x) {
  return F(1) / (F(1) + exp_of(-x));
}
template <typename F>
DFLASH_HD inline F swiglu(F gate, F up) {
  return gate * sigmoid(gate) * up;
}
// silu'(g) = σ(g) (1 + g (1 − σ(g)))
template <typename F>
DFLASH_HD inline void swiglu_grad(F dh, F gate, F up, F& dgate, F& dup) {
  const F s = sigmoid(gate);
  dgate = dh * up * s * (F(1) + gate * (F(1) - s));
  dup = dh * gate * s;
}

}  // namespace dflash::kernels::math
