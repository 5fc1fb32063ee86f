#pragma once
// The CUDA backend's own declarations beyond kernels/backend.h: the bf16 backend (bf16 activations and weights,
// fp32 accumulation, fp32 statistics / weight gradients / optimizer state: A = acc_t<bf16> = float).
// make_cuda_backend<float>() (kernels/backend.h) is the fp32 path the twin tests compare with the CPU.
#include <cuda_bf16.h>

#include <memory>

#include "kernels/backend.h"

namespace dflash::kernels {

static_assert(std::is_same_v<acc_t<__nv_bfloat16>, float>, "bf16 statistics and weight gradients are fp32");

// Throws dflash::Error when no CUDA device is visible. Uses the calling thread's current device.
std::unique_ptr<Backend<__nv_bfloat16>> make_cuda_backend_bf16();

}  // namespace dflash::kernels
