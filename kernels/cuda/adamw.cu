// The optimizer's kernels on fp32 master weights: AdamW (math::adamw_update, the function the CPU backend calls),
// the deterministic Σ x² of the global gradient norm, and the gradient scale.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/math/adamw.h"

namespace dflash::kernels::cuda {

namespace {

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask,
                             size_t n, AdamWCoeffs k) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float p = params[i], mi = m[i], vi = v[i];
    math::adamw_update(p, grads[i], mi, vi, decay_mask[i] != 0, k);
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void scale_f32_kernel(float* x, float s, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) x[i] *= s;
}

// Deterministic: a fixed grid (kSumSquaresBlocks × kThreads, whatever n), each thread a fixed stride, each block a
// fixed tree, then one block reduces the partials in a fixed tree. Same bits on every run and every GPU.
__global__ void sum_squares_partial_kernel(const float* x, size_t n, double* partials) {
  SumD acc;
  for (size_t i = blockIdx.x * size_t(kThreads) + threadIdx.x; i < n; i += size_t(kSumSquaresBlocks) * kThreads)
    acc.v += double(x[i]) * double(x[i]);
  const SumD total = block_merge(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total.v;
}

__global__ void sum_squares_final_kernel(const double* partials, double* result) {
  SumD acc;
  for (int i = threadIdx.x; i < kSumSquaresBlocks; i += kThreads) acc.v += partials[i];
  const SumD total = block_merge(acc);
  if (threadIdx.x == 0) result[0] = total.v;
}

}  // namespace

void launch_adamw(cudaStream_t st, float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask,
                  size_t n, const AdamWCoeffs& k) {
  if (!n) return;
  DFLASH_LAUNCH(grid_for(n), kThreads, 0, st, adamw_kernel)(params, grads, m, v, decay_mask, n, k);
}

void launch_scale_f32(cudaStream_t st, float* x, float s, size_t n) {
  if (!n) return;
  DFLASH_LAUNCH(grid_for(n), kThreads, 0, st, scale_f32_kernel)(x, s, n);
}

void launch_sum_squares(cudaStream_t st, const float* x, size_t n, double* partials, double* result) {
  DFLASH_LAUNCH(kSumSquaresBlocks, kThreads, 0, st, sum_squares_partial_kernel)(x, n, partials);
  DFLASH_LAUNCH(1, kThreads, 0, st, sum_squares_final_kernel)(partials, result);
}

}  // namespace dflash::kernels::cuda
