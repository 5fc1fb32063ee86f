#pragma once
// Per-row / per-element math of the CUDA RMSNorm, RoPE and SwiGLU kernels, host and device (the formulas of
// kernels/cpu/rmsnorm.cpp, rope.cpp and elementwise.cpp). tests/unit/test_cuda_math.cpp checks them on the CPU.
#include <math.h>

#include "kernels/attention_shape.h"  // DFLASH_HD

namespace dflash::kernels::cuda_math {

// rstd of a row from its Σ x² (float, as the CPU's fp32 path).
DFLASH_HD inline float rmsnorm_rstd(float sum_sq, int dim, float eps) { return 1.0f / sqrtf(sum_sq / float(dim) + eps); }
// y_i = x_i · rstd · w_i
DFLASH_HD inline float rmsnorm_y(float x, float rstd, float w) { return x * rstd * w; }
// Backward, with n = x·rstd and g = dy ⊙ w: the row's Σ g ⊙ n term and dx_i = rstd · (g_i − n_i · mean(g ⊙ n)).
DFLASH_HD inline float rmsnorm_gn(float dy, float w, float x, float rstd) { return dy * w * x * rstd; }
DFLASH_HD inline float rmsnorm_dx(float dy, float w, float x, float rstd, float mean_gn) {
  return rstd * (dy * w - x * rstd * mean_gn);
}
// dw_i term of one row: dy_i · x_i · rstd
DFLASH_HD inline float rmsnorm_dw_term(float dy, float x, float rstd) { return dy * x * rstd; }

// cos and sin of pos · θ^(−2i/D), formed in double (positions up to ~1e5 times frequencies near 1 lose digits in
// float), rounded to float as the CPU's table is.
DFLASH_HD inline void rope_cos_sin(int pos, int i, int head_dim, double theta, float& c, float& s) {
  const double angle = double(pos) * pow(theta, -2.0 * i / head_dim);
  c = float(cos(angle));
  s = float(sin(angle));
}
// Rotate-half: the pair (x_i, x_{i+D/2}) rotated by the angle whose cos/sin are c, s (s negated for backward).
DFLASH_HD inline void rope_rotate(float a, float b, float c, float s, float& ya, float& yb) {
  ya = a * c - b * s;
  yb = b * c + a * s;
}

DFLASH_HD inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
DFLASH_HD inline float swiglu(float gate, float up) { return gate * sigmoidf(gate) * up; }
// silu'(g) = σ(g) (1 + g (1 − σ(g)))
DFLASH_HD inline void swiglu_grad(float dh, float gate, float up, float& dgate, float& dup) {
  const float s = sigmoidf(gate);
  dgate = dh * up * s * (1.0f + gate * (1.0f - s));
  dup = dh * gate * s;
}

}  // namespace dflash::kernels::cuda_math
