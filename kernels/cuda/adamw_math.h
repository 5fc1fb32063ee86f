#pragma once
// AdamW's element update, host and device: the CPU backend's adamw_step (kernels/cpu/backend_cpu.cpp) verbatim.
#include <math.h>

#include "kernels/attention_shape.h"  // DFLASH_HD
#include "kernels/backend.h"          // AdamWCoeffs

namespace dflash::kernels::cuda_math {

DFLASH_HD inline void adamw_update(float& param, float g, float& m, float& v, bool decay, const AdamWCoeffs& k) {
  m = k.beta1 * m + (1.0f - k.beta1) * g;
  v = k.beta2 * v + (1.0f - k.beta2) * g * g;
  if (k.decay != 0.0f && decay) param -= k.decay * param;
  param -= k.step_size * m / (sqrtf(v) * k.inv_sqrt_bc2 + k.eps);
}

}  // namespace dflash::kernels::cuda_math
