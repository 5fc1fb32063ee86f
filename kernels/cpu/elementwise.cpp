#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <cassert>
#include <cstring>

#include "kernels/math/argmax.h"
#include "kernels/math/gates.h"
#include "kernels/math/norm.h"
#include "lib/core/error.h"

namespace dflash::cpu {

// The element formulas are kernels/math/norm.h and gates.h, shared with the CUDA kernels.

template <typename T>
void swiglu_forward(T* h, const T* gate, const T* up, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) h[i] = kernels::math::swiglu(gate[i], up[i]);
}

// silu(g) = g·σ(g);  silu'(g) = σ(g) · (1 + g · (1 − σ(g)))
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    T dg, du;
    kernels::math::swiglu_grad(dh[i], gate[i], up[i], dg, du);
    dgate[i] += dg;
    dup[i] += du;
  }
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void accumulate(T* y, const T* x, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

template <typename T>
void embedding_forward(T* out, const T* table, const int32_t* ids, int rows, int dim, int vocab) {
  for (int r = 0; r < rows; ++r) {
    assert(ids[r] >= 0 && ids[r] < vocab);  // kernels never throw: the caller validated the ids
    std::memcpy(out + size_t(r) * dim, table + size_t(ids[r]) * dim, sizeof(T) * dim);
  }
}

template <typename T>
void sigmoid_gate(T* x, const T* gate, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] = kernels::math::sigmoid_gate(x[i], gate[i]);
}

template <typename T>
void argmax_rows(int32_t* index, T* value, const T* x, int rows, int cols) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const T* row = x + size_t(r) * cols;
    kernels::math::ArgMax<T> best;  // the first of equal values, NaNs never (kernels/math/argmax.h)
    for (int i = 0; i < cols; ++i) best.add(row[i], i);
    index[r] = best.index;
    value[r] = best.value;
  }
}

#define DFLASH_INSTANTIATE(T)                                                       \
  template void sigmoid_gate<T>(T*, const T*, size_t);                              \
  template void argmax_rows<T>(int32_t*, T*, const T*, int, int);                   \
  template void swiglu_forward<T>(T*, const T*, const T*, size_t);                  \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, size_t);   \
  template void residual_forward<T>(T*, const T*, const T*, size_t);                \
  template void accumulate<T>(T*, const T*, size_t);                                \
  template void embedding_forward<T>(T*, const T*, const int32_t*, int, int, int);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(double)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::cpu
