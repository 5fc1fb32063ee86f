// The row argmax of greedy decoding: one block per row, a running (value, first index) per thread over the columns
// tid, tid + 256, ..., then a fixed-tree merge (math::ArgMax, kernels/math/argmax.h). Unverified on GPU.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/math/argmax.h"

namespace dflash::kernels::cuda {

namespace {

template <typename T>
__global__ void argmax_rows_kernel(int32_t* index, float* value, const T* x, int cols) {
  const T* row = x + size_t(blockIdx.x) * cols;
  math::ArgMax<float> best;
  for (int i = threadIdx.x; i < cols; i += kThreads) best.add(to_f(row[i]), i);
  const math::ArgMax<float> all = block_merge(best);
  if (threadIdx.x == 0) {
    index[blockIdx.x] = all.index;
    value[blockIdx.x] = all.value;
  }
}

}  // namespace

template <typename T>
void launch_argmax_rows(cudaStream_t st, int32_t* index, float* value, const T* x, int rows, int cols) {
  if (rows <= 0) return;
  DFLASH_LAUNCH(rows, kThreads, 0, st, argmax_rows_kernel<T>)(index, value, x, cols);
}

template void launch_argmax_rows<float>(cudaStream_t, int32_t*, float*, const float*, int, int);
template void launch_argmax_rows<bf16>(cudaStream_t, int32_t*, float*, const bf16*, int, int);

}  // namespace dflash::kernels::cuda
