#pragma once
// The CUDA kernels' names (fp32) for the RMSNorm, RoPE and SwiGLU math of kernels/math/norm.h, the one copy the CPU
// kernels call too. Thin fp32 entry points only: no formula lives here.
#include "kernels/attention_shape.h"  // DFLASH_HD, as the kernels including this header expect
#include "kernels/math/norm.h"

namespace dflash::kernels::cuda_math {

DFLASH_HD inline float rmsnorm_rstd(float sum_sq, int dim, float eps) { return math::rmsnorm_rstd(sum_sq, dim, eps); }
DFLASH_HD inline float rmsnorm_y(float x, float rstd, float w) { return math::rmsnorm_y(x, rstd, w); }
DFLASH_HD inline float rmsnorm_gn(float dy, float w, float x, float rstd) { return math::rmsnorm_gn(dy, w, x, rstd); }
DFLASH_HD inline float rmsnorm_dx(float dy, float w, float x, float rstd, float mean_gn) {
  return math::rmsnorm_dx(dy, w, x, rstd, mean_gn);
}
DFLASH_HD inline float rmsnorm_dw_term(float dy, float x, float rstd) { return math::rmsnorm_dw_term(dy, x, rstd); }
DFLASH_HD inline void rope_cos_sin(int pos, int i, int head_dim, double theta, float& c, float& s) {
  math::rope_cos_sin(pos, i, head_dim, theta, c, s);
}
DFLASH_HD inline void rope_rotate(float a, float b, float c, float s, float& ya, float& yb) {
  math::rope_rotate(a, b, c, s, ya, yb);
}
DFLASH_HD inline float sigmoidf(float x) { return math::sigmoid(x); }
DFLASH_HD inline float swiglu(float gate, float up) { return math::swiglu(gate, up); }
DFLASH_HD inline void swiglu_grad(float dh, float gate, float up, float& dgate, float& dup) {
  math::swiglu_grad(dh, gate, up, dgate, dup);
}

}  // namespace dflash::kernels::cuda_math
