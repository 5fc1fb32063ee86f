// Kernels of test_emu_limits.cpp (limit_kernels.h): each sits over one per-block limit of a real GPU.
#include <exception>

#include "kernels/cuda/kernel_launch.cuh"
#include "tests/emu/limit_kernels.h"

namespace emu_limits {

namespace kc = dflash::kernels::cuda;

namespace {

constexpr int kLive = 96;

__global__ void register_hog_kernel(float* out, const float* x, int rounds) {
  float r[kLive];
#pragma unroll
  for (int i = 0; i < kLive; ++i) r[i] = x[(threadIdx.x + i) % 256];
  for (int k = 0; k < rounds; ++k) {
#pragma unroll
    for (int i = 0; i < kLive; ++i) r[i] = r[i] * 0.5f + r[(i + 1) % kLive] * 0.25f;
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kLive; ++i) s += r[i] * float(i + 1);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

__global__ void __launch_bounds__(128) bounded_kernel(float* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = float(threadIdx.x);
}

constexpr int kStaticFloats = 12 * 1024;  // 48 KiB: the most a block may declare statically

__global__ void static_plus_dynamic_kernel(float* out, int dynamic_floats) {
  DFLASH_SHARED(float, fixed, [kStaticFloats]);
  DFLASH_DYNAMIC_SHARED(float, extra);
  const int t = threadIdx.x;
  for (int i = t; i < kStaticFloats; i += blockDim.x) fixed[i] = 1.f;
  for (int i = t; i < dynamic_floats; i += blockDim.x) extra[i] = 2.f;
  __syncthreads();
  out[t] = float(t) + fixed[kStaticFloats - 1 - t] + (dynamic_floats > t ? extra[dynamic_floats - 1 - t] : 0.f);
}

__global__ void dynamic_only_kernel(float* out, int floats) {
  DFLASH_DYNAMIC_SHARED(float, tile);
  const int t = threadIdx.x;
  tile[floats - 1 - t] = float(t);
  __syncthreads();
  out[t] = tile[floats - 1 - t];
}

template <typename F>
std::string attempt(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace

std::string register_hog(cudaStream_t st, float* out, const float* x, int blocks, int threads, int rounds) {
  return attempt([&] { DFLASH_LAUNCH(blocks, threads, 0, st, register_hog_kernel)(out, x, rounds); });
}
cudaFuncAttributes register_hog_attributes() { return kc::kernel_attributes<register_hog_kernel>("register_hog"); }

std::string bounded(cudaStream_t st, float* out, int threads) {
  return attempt([&] { DFLASH_LAUNCH(1, threads, 0, st, bounded_kernel)(out); });
}
cudaFuncAttributes bounded_attributes() { return kc::kernel_attributes<bounded_kernel>("bounded"); }

std::string static_plus_dynamic(cudaStream_t st, float* out, size_t dynamic) {
  return attempt([&] {
    kc::allow_dynamic_smem<static_plus_dynamic_kernel>(dynamic, "static_plus_dynamic");
    DFLASH_LAUNCH(1, 64, dynamic, st, static_plus_dynamic_kernel)(out, int(dynamic / sizeof(float)));
  });
}
cudaFuncAttributes static_plus_dynamic_attributes() {
  return kc::kernel_attributes<static_plus_dynamic_kernel>("static_plus_dynamic");
}

std::string dynamic_only(cudaStream_t st, float* out, size_t bytes) {
  return attempt([&] {
    kc::allow_dynamic_smem<dynamic_only_kernel>(bytes, "dynamic_only");
    DFLASH_LAUNCH(1, 32, bytes, st, dynamic_only_kernel)(out, int(bytes / sizeof(float)));
  });
}

}  // namespace emu_limits
