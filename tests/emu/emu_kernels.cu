// Kernels of the emulator's self-tests (emu_kernels.h): small correct kernels and planted defects.
#include "kernels/cuda/kernel_launch.cuh"
#include "tests/emu/emu_kernels.h"

namespace emu_test {

namespace {

__global__ void add_one_kernel(float* y, const float* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = x[i] + 1.0f;
}

__global__ void block_sum_kernel(float* out, const float* x, bool missing_sync) {
  DFLASH_SHARED(float, s, [256]);
  const int t = threadIdx.x;
  s[t] = x[blockIdx.x * 256 + t];
  if (!missing_sync) __syncthreads();
  for (int stride = 128; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

__global__ void warp_sum_kernel(float* out, const float* x, bool wrong_mask) {
  const int lane = threadIdx.x % 32, warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  float v = x[warp * 32 + lane];
  if (wrong_mask && lane >= 16) return;  // the planted defect: half the warp leaves, the mask still names it
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) out[warp] = v;
}

__global__ void past_allocation_kernel(float* y, int n) { y[n + 64] = 1.0f; }

__global__ void shared_shift_kernel(float* out, const float* x, int offset) {
  DFLASH_DYNAMIC_SHARED(float, tile);
  tile[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = tile[threadIdx.x + offset];
}

__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void racy_neighbour_kernel(float* out, int n) {
  DFLASH_SHARED(float, slot, [32]);
  const int lane = threadIdx.x;
  slot[lane] = float(lane) * 3.0f;
  out[lane] = slot[(lane + 1) % 32];  // no __syncwarp: the neighbour may not have written yet
}

__global__ void nothing_kernel(int) {}

}  // namespace

void add_one(cudaStream_t st, float* y, const float* x, int n) { DFLASH_LAUNCH(4, 64, 0, st, add_one_kernel)(y, x, n); }
void block_sum(cudaStream_t st, float* out, const float* x, int blocks, bool missing_sync) {
  DFLASH_LAUNCH(blocks, 256, 0, st, block_sum_kernel)(out, x, missing_sync);
}
void warp_sum(cudaStream_t st, float* out, const float* x, int warps, bool wrong_mask) {
  DFLASH_LAUNCH(warps, 32, 0, st, warp_sum_kernel)(out, x, wrong_mask);
}
void shared_shift(cudaStream_t st, float* out, const float* x, int offset) {
  DFLASH_LAUNCH(1, 32, 32 * sizeof(float), st, shared_shift_kernel)(out, x, offset);
}
void past_allocation(cudaStream_t st, float* y, int n) { DFLASH_LAUNCH(1, 1, 0, st, past_allocation_kernel)(y, n); }
void divergent_barrier(cudaStream_t st, float* out) { DFLASH_LAUNCH(1, 32, 0, st, divergent_barrier_kernel)(out); }
void racy_neighbour(cudaStream_t st, float* out, int n) { DFLASH_LAUNCH(1, 32, 0, st, racy_neighbour_kernel)(out, n); }

cudaError_t launch_threads(cudaStream_t st, int threads) {
  try {
    DFLASH_LAUNCH(1, threads, 0, st, nothing_kernel)(0);
  } catch (...) {
    return cudaErrorInvalidConfiguration;
  }
  return cudaSuccess;
}
cudaError_t launch_dynamic_smem(cudaStream_t st, size_t bytes, bool raise_limit) {
  if (raise_limit) {
    const cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(&nothing_kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (e != cudaSuccess) return e;
  }
  try {
    DFLASH_LAUNCH(1, 32, bytes, st, nothing_kernel)(0);
  } catch (...) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace emu_test
