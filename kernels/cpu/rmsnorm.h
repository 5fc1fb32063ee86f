#pragma once
// RMSNorm over the last dimension, Qwen3 style: y = x · rsqrt(mean(x²) + eps) · w, statistics in T.
// Per-head q_norm / k_norm use the same kernel with rows = tokens × heads and dim = head_dim.

namespace dflash::cpu {

// y[rows, dim] (=), rstd[rows] (=) saved for backward. y may alias x.
template <typename T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, int rows, int dim, T eps);

// dx[rows, dim] (+=), dw[dim] (+=, skipped when null). x is the forward input (not y).
template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int rows, int dim);

}  // namespace dflash::cpu
