#pragma once
// Device-side helpers shared by the .cu files: float ↔ T conversion (T = float or bf16; all arithmetic is in
// float or double), launch geometry, warp reductions and a deterministic block reduction (a fixed tree over a
// fixed block size: the same inputs give the same bits on every run).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/kernel_launch.cuh"

namespace dflash::kernels::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

constexpr int kThreads = 256;  // block size of the row and elementwise kernels (the reductions assume it)
constexpr int kWarp = 32;

// Blocks for a grid-stride loop over n elements: enough to fill any current GPU, never more than needed.
inline unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 8192 ? (blocks > 0 ? blocks : 1) : 8192);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// Shared scratch of kThreads values of S (raw bytes: __shared__ variables cannot have constructors).
template <typename S>
__device__ S* merge_buffer() {
  DFLASH_SHARED_ALIGNED(alignof(S), unsigned char, raw, [sizeof(S) * kThreads]);
  return reinterpret_cast<S*>(raw);
}

// Merges one value per thread of a kThreads block with S::merge, in a fixed tree; every thread gets the result.
// Ends with a barrier so the shared scratch can be reused right away.
template <typename S>
__device__ S block_merge(S local) {
  S* buf = merge_buffer<S>();
  const int tid = threadIdx.x;
  buf[tid] = local;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (tid < stride) buf[tid].merge(buf[tid + stride]);
    __syncthreads();
  }
  const S out = buf[0];
  __syncthreads();
  return out;
}

struct SumF {
  float v = 0;
  __device__ void merge(const SumF& o) { v += o.v; }
};
struct SumD {
  double v = 0;
  __device__ void merge(const SumD& o) { v += o.v; }
};

}  // namespace dflash::kernels::cuda
