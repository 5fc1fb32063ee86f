#pragma once
// The per-block limits of the device the kernels launch on (the calling thread's current device), asked of the
// runtime once per device: what the launchers check before they choose a kernel variant, so that no launch is
// refused mid-run (kernels/gpu_arch.h has the rule; cudaFuncGetAttributes, through kernel_launch.cuh's
// kernel_attributes, the kernel's side).
#include <cstddef>
#include <string>

#include "kernels/gpu_arch.h"

namespace dflash::kernels::cuda {

struct DeviceLimits {
  int device = 0;
  int sm = 0;                       // compute capability × 10
  int sms = 0;                      // multiprocessors
  size_t smem_per_block_optin = 0;  // static + dynamic shared memory a block may have
  int regs_per_block = 0;
  const GpuArch* arch = nullptr;    // kernels/gpu_arch.h's entry, null for an architecture it does not list
  std::string name;                 // "NVIDIA H200" (cudaDeviceProp::name)
};

// The current device's limits (cached per device). Throws a dflash::Error when there is no device.
const DeviceLimits& current_device_limits();

}  // namespace dflash::kernels::cuda
