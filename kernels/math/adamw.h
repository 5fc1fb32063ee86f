#pragma once
// AdamW's element update on fp32 master weights, host and device: the CPU backend's adamw_step and the CUDA
// adamw kernel both call it (kernels/cpu/backend_cpu.cpp, kernels/cuda/adamw.cu), so the two give the same bits
// wherever nvcc does not fuse the multiply-adds.
#include <math.h>

#include "kernels/math/hd.h"

namespace dflash::kernels {

// AdamW's constants for one update (bias corrections folded in by the caller).
struct AdamWCoeffs {
  float beta1 = 0.9f, beta2 = 0.95f;
  float step_size = 0;     // lr / (1 − β1^t)
  float inv_sqrt_bc2 = 1;  // 1 / sqrt(1 − β2^t)
  float eps = 1e-8f;
  float decay = 0;         // lr · weight_decay (decoupled), applied where decay_mask is 1
};

namespace math {

DFLASH_HD inline void adamw_update(float& param, float g, float& m, float& v, bool decay, const AdamWCoeffs& k) {
  m = k.beta1 * m + (1.0f - k.beta1) * g;
  v = k.beta2 * v + (1.0f - k.beta2) * g * g;
  if (k.decay != 0.0f && decay) param -= k.decay * param;
  param -= k.step_size * m / (sqrtf(v) * k.inv_sqrt_bc2 + k.eps);
}

}  // namespace math

}  // namespace dflash::kernels
