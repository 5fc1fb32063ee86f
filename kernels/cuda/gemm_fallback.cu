// The GEMM cuBLASLt cannot do: when its heuristic returns no algorithm for a layout (odd leading dimensions, e.g.
// the DeltaNet b/a projections of a TP-5 shard with rows of 9 or 12 bf16 values, or alignments it will not
// assume), gemm_lt.cpp runs this instead of failing the job. One thread per C element, the K products in order
// with fp32 accumulation (the twin tests' fp32 bound holds), C = alpha·acc + beta·C (beta = 0: C is not read).
// Row-major operands as in gemm_lt.h. Slow by design and only ever on the shapes cuBLASLt refuses.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace dflash::kernels::cuda {

namespace {

constexpr int kTile = 16;  // 16 × 16 threads per block, one C element each

template <typename AB, typename C>
__global__ void gemm_fallback_kernel(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const AB* a,
                                     int lda, const AB* b, int ldb, float beta, C* c, int ldc) {
  const int i = blockIdx.y * kTile + threadIdx.y, j = blockIdx.x * kTile + threadIdx.x;
  if (i >= M || j >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) {
    const float av = to_f(trans_a ? a[size_t(k) * lda + i] : a[size_t(i) * lda + k]);
    const float bv = to_f(trans_b ? b[size_t(j) * ldb + k] : b[size_t(k) * ldb + j]);
    acc = fmaf(av, bv, acc);
  }
  C& out = c[size_t(i) * ldc + j];
  out = from_f<C>(beta == 0.0f ? alpha * acc : alpha * acc + beta * to_f(out));
}

}  // namespace

template <typename AB, typename C>
void launch_gemm_fallback(cudaStream_t st, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const AB* a,
                          int lda, const AB* b, int ldb, float beta, C* c, int ldc) {
  if (M <= 0 || N <= 0) return;
  const dim3 grid(unsigned((N + kTile - 1) / kTile), unsigned((M + kTile - 1) / kTile)), block(kTile, kTile);
  DFLASH_LAUNCH(grid, block, 0, st, gemm_fallback_kernel<AB, C>)(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb,
                                                                 beta, c, ldc);
}

#define DFLASH_INSTANTIATE(AB, C)                                                                           \
  template void launch_gemm_fallback<AB, C>(cudaStream_t, bool, bool, int, int, int, float, const AB*, int, \
                                            const AB*, int, float, C*, int);
DFLASH_INSTANTIATE(float, float)
DFLASH_INSTANTIATE(bf16, bf16)
DFLASH_INSTANTIATE(bf16, float)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::kernels::cuda
