// The current device's per-block limits, asked once per device (kernels/cuda/device_limits.h).
#include "kernels/cuda/device_limits.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "kernels/cuda/check.h"

namespace dflash::kernels::cuda {

const DeviceLimits& current_device_limits() {
  static std::mutex mu;
  static std::map<int, DeviceLimits> cache;
  int dev = 0;
  DFLASH_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lk(mu);
  auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  cudaDeviceProp p{};
  DFLASH_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  DeviceLimits d;
  d.device = dev;
  d.sm = p.major * 10 + p.minor;
  d.sms = p.multiProcessorCount;
  d.smem_per_block_optin = p.sharedMemPerBlockOptin;
  d.regs_per_block = p.regsPerBlock;
  d.arch = find_gpu_arch(d.sm);
  d.name = p.name;
  return cache.emplace(dev, d).first->second;
}

}  // namespace dflash::kernels::cuda
