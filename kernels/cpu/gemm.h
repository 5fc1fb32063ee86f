#pragma once
// Dense matrix products through cblas (OpenBLAS): sgemm for float, dgemm for double. Row-major throughout.
//
// Backward convention for every kernel in kernels/cpu: gradient outputs are ACCUMULATED (`+=`) unless the
// comment on the parameter says `=`; callers zero them once per step.

namespace dflash::cpu {

// C[M, N] = alpha * op(A) * op(B) + beta * C, op(X) = Xᵀ when trans_x; lda/ldb/ldc are row strides.
template <typename T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
          T beta, T* C, int ldc);

// Linear layer without bias, PyTorch weight layout: y[N, out] (=) x[N, in] · Wᵀ, W [out, in].
template <typename T>
void linear_forward(T* y, const T* x, const T* W, int N, int in, int out);

// dx[N, in] (+=) dy[N, out] · W; skipped when dx is null.
// dW[out, in] (+=) dyᵀ · x; skipped when dW is null (frozen weight).
template <typename T>
void linear_backward(T* dx, T* dW, const T* dy, const T* x, const T* W, int N, int in, int out);

}  // namespace dflash::cpu
