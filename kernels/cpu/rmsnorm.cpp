#include "kernels/cpu/rmsnorm.h"

#include <cmath>

#include "kernels/math/norm.h"

namespace dflash::cpu {

template <typename T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, int rows, int dim, T eps) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const T* xr = x + size_t(r) * dim;
    T* yr = y + size_t(r) * dim;
    T ss = 0;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const T s = kernels::math::rmsnorm_rstd(ss, dim, eps);
    rstd[r] = s;
    for (int i = 0; i < dim; ++i) yr[i] = kernels::math::rmsnorm_y(xr[i], s, w[i]);
  }
}

// The row formulas are kernels/math/norm.h (shared with the CUDA kernels).
// With n = x·s (s = rstd), y = n ⊙ w:  dx = s · (g − n · mean(g ⊙ n)),  g = dy ⊙ w;  dw = Σ_rows dy ⊙ n.
template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int rows, int dim) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const T* xr = x + size_t(r) * dim;
    const T* dyr = dy + size_t(r) * dim;
    T* dxr = dx + size_t(r) * dim;
    const T s = rstd[r];
    T dot = 0;  // Σ g ⊙ n
    for (int i = 0; i < dim; ++i) dot += kernels::math::rmsnorm_gn(dyr[i], w[i], xr[i], s);
    const T mean_gn = dot / T(dim);
    for (int i = 0; i < dim; ++i) dxr[i] += kernels::math::rmsnorm_dx(dyr[i], w[i], xr[i], s, mean_gn);
  }
  if (!dw) return;
  // dw is reduced over rows column by column so the summation order never depends on the thread count.
#pragma omp parallel for schedule(static)
  for (int i = 0; i < dim; ++i) {
    T acc = 0;
    for (int r = 0; r < rows; ++r) acc += kernels::math::rmsnorm_dw_term(dy[size_t(r) * dim + i], x[size_t(r) * dim + i], rstd[r]);
    dw[i] += acc;
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, float);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int,
                                      int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*,
                                       const double*, int, int);

}  // namespace dflash::cpu
