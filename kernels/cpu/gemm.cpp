#include "kernels/cpu/gemm.h"

#include <cblas.h>

namespace dflash::cpu {

template <>
void gemm<float>(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
                  const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void linear_forward(T* y, const T* x, const T* W, int N, int in, int out) {
  gemm<T>(false, true, N, out, in, T(1), x, in, W, in, T(0), y, out);
}

template <typename T>
void linear_backward(T* dx, T* dW, const T* dy, const T* x, const T* W, int N, int in, int out) {
  if (dx) gemm<T>(false, false, N, in, out, T(1), dy, out, W, in, T(1), dx, in);
  if (dW) gemm<T>(true, false, out, in, N, T(1), dy, out, x, in, T(1), dW, in);
}

template void linear_forward<float>(float*, const float*, const float*, int, int, int);
template void linear_forward<double>(double*, const double*, const double*, int, int, int);
template void linear_backward<float>(float*, float*, const float*, const float*, const float*, int, int, int);
template void linear_backward<double>(double*, double*, const double*, const double*, const double*, int, int,
                                      int);

}  // namespace dflash::cpu
