#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "kernels/math/norm.h"
#include "lib/core/error.h"

namespace dflash::cpu {

namespace {

namespace km = kernels::math;  // the row formulas, shared with the CUDA kernels

// cos/sin of pos · inv_freq_i for positions [0, n_pos), computed in double once per (theta, head_dim) and kept
// per thread: recomputing them per call costs more than the rotation itself for few heads.
struct RopeTable {
  double theta = 0;
  int head_dim = 0, n_pos = 0;
  std::vector<double> cos_sin;  // [n_pos, head_dim/2, 2]

  const double* at(int pos) const { return cos_sin.data() + size_t(pos) * head_dim; }
  void ensure(double theta_, int head_dim_, int max_pos) {
    if (theta_ != theta || head_dim_ != head_dim) n_pos = 0, cos_sin.clear();
    theta = theta_;
    head_dim = head_dim_;
    if (max_pos < n_pos) return;
    const int half = head_dim / 2, grown = std::max(max_pos + 1, 2 * n_pos);
    cos_sin.resize(size_t(grown) * head_dim);
    for (int p = n_pos; p < grown; ++p)
      for (int i = 0; i < half; ++i) {
        const double angle = km::rope_angle(p, i, head_dim, theta);  // in double (kernels/math/norm.h)
        cos_sin[size_t(p) * head_dim + 2 * i] = std::cos(angle);
        cos_sin[size_t(p) * head_dim + 2 * i + 1] = std::sin(angle);
      }
    n_pos = grown;
  }
};

// The calling thread's table, covering every position of pos[rows] (called outside parallel regions: the OpenMP
// threads read the caller's table).
const RopeTable& rope_table(const int* pos, int rows, int head_dim, double theta) {
  static thread_local RopeTable table;
  int max_pos = 0;
  for (int r = 0; r < rows; ++r) {
    assert(pos[r] >= 0);  // kernels never throw: positions come from the orchestration, never from user input
    max_pos = std::max(max_pos, pos[r]);
  }
  table.ensure(theta, head_dim, max_pos);
  return table;
}

// out (= or +=) rotation of in by sign·angle, for every row and head.
template <typename T, bool Accumulate>
void rotate(T* out, const T* in, const int* pos, int rows, int heads, int head_dim, double theta, double sign) {
  const int half = head_dim / 2;
  const RopeTable& tab = rope_table(pos, rows, head_dim, theta);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const double* cs = tab.at(pos[r]);
    for (int i = 0; i < half; ++i) {
      const T c = T(cs[2 * i]), s = T(sign * cs[2 * i + 1]);
      for (int h = 0; h < heads; ++h) {
        const size_t base = (size_t(r) * heads + h) * head_dim;
        T ya, yb;
        km::rope_rotate(in[base + i], in[base + i + half], c, s, ya, yb);
        if constexpr (Accumulate) {
          out[base + i] += ya;
          out[base + i + half] += yb;
        } else {
          out[base + i] = ya;
          out[base + i + half] = yb;
        }
      }
    }
    // an odd head_dim's last dim has no partner: it passes through unrotated (the identity, in both directions), as
    // in the fused head_norm_rope
    if (head_dim % 2)
      for (int h = 0; h < heads; ++h) {
        const size_t last = (size_t(r) * heads + h) * head_dim + 2 * half;
        if constexpr (Accumulate)
          out[last] += in[last];
        else
          out[last] = in[last];
      }
  }
}

// Component i of Rᵀ g for one head (cs: the row's table entry), as rope_backward accumulates it into zeros:
// T(0) + the rotated value, the same expressions as rotate's.
template <typename T>
T rotated_back(const T* g, const double* cs, int i, int half) {
  // an odd head_dim's last dim passes through unrotated: its adjoint is the identity (as rope_backward's)
  if (i >= 2 * half) return T(0) + g[i];
  const int p = i < half ? i : i - half;
  const T c = T(cs[2 * p]), s = T(-1.0 * cs[2 * p + 1]);
  T ya, yb;
  km::rope_rotate(g[p], g[p + half], c, s, ya, yb);
  return i < half ? T(0) + ya : T(0) + yb;
}

}  // namespace

template <typename T>
void head_norm_rope_forward(T* y, T* rstd, const T* x, const T* w, const int* pos, int rows, int heads,
                            int head_dim, T eps, double theta) {
  const int half = head_dim / 2, dim = head_dim;
  const RopeTable& tab = rope_table(pos, rows, head_dim, theta);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const double* cs = tab.at(pos[r]);
    for (int h = 0; h < heads; ++h) {
      const size_t row = size_t(r) * heads + h;
      const T* xr = x + row * dim;
      T* yr = y + row * dim;
      // rmsnorm_forward's row
      T ss = 0;
      for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
      const T s = km::rmsnorm_rstd(ss, dim, eps);
      rstd[row] = s;
      for (int i = 0; i < dim; ++i) yr[i] = km::rmsnorm_y(xr[i], s, w[i]);
      // rotate's pairs, in place on the normed head
      for (int i = 0; i < half; ++i) {
        const T c = T(cs[2 * i]), sn = T(1.0 * cs[2 * i + 1]);
        km::rope_rotate(T(yr[i]), T(yr[i + half]), c, sn, yr[i], yr[i + half]);
      }
    }
  }
}

template <typename T>
void head_norm_rope_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, const int* pos,
                             int rows, int heads, int head_dim, double theta) {
  const int half = head_dim / 2, dim = head_dim;
  const RopeTable& tab = rope_table(pos, rows, head_dim, theta);
#pragma omp parallel
  {
    std::vector<T> g(static_cast<size_t>(dim));  // Rᵀ dy of one head
#pragma omp for schedule(static)
    for (int r = 0; r < rows; ++r) {
      const double* cs = tab.at(pos[r]);
      for (int h = 0; h < heads; ++h) {
        const size_t row = size_t(r) * heads + h;
        const T* xr = x + row * dim;
        T* dxr = dx + row * dim;
        for (int i = 0; i < dim; ++i) g[size_t(i)] = rotated_back(dy + row * dim, cs, i, half);
        // rmsnorm_backward's row
        const T s = rstd[row];
        T dot = 0;
        for (int i = 0; i < dim; ++i) dot += km::rmsnorm_gn(g[size_t(i)], w[i], xr[i], s);
        const T mean_gn = dot / T(dim);
        for (int i = 0; i < dim; ++i) dxr[i] += km::rmsnorm_dx(g[size_t(i)], w[i], xr[i], s, mean_gn);
      }
    }
  }
  if (!dw) return;
  // rmsnorm_backward's dw: column by column over the rows·heads rows in order, Rᵀ dy recomputed per element
  const size_t n_rows = size_t(rows) * heads;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < dim; ++i) {
    T acc = 0;
    for (size_t row = 0; row < n_rows; ++row) {
      const T gi = rotated_back(dy + row * dim, tab.at(pos[row / size_t(heads)]), i, half);
      acc += km::rmsnorm_dw_term(gi, x[row * dim + i], rstd[row]);
    }
    dw[i] += acc;
  }
}

template <typename T>
void rope_forward(T* y, const T* x, const int* pos, int rows, int heads, int head_dim, double theta) {
  rotate<T, false>(y, x, pos, rows, heads, head_dim, theta, +1.0);
}

template <typename T>
void rope_backward(T* dx, const T* dy, const int* pos, int rows, int heads, int head_dim, double theta) {
  rotate<T, true>(dx, dy, pos, rows, heads, head_dim, theta, -1.0);
}

template void rope_forward<float>(float*, const float*, const int*, int, int, int, double);
template void rope_forward<double>(double*, const double*, const int*, int, int, int, double);
template void rope_backward<float>(float*, const float*, const int*, int, int, int, double);
template void rope_backward<double>(double*, const double*, const int*, int, int, int, double);
template void head_norm_rope_forward<float>(float*, float*, const float*, const float*, const int*, int, int, int,
                                            float, double);
template void head_norm_rope_forward<double>(double*, double*, const double*, const double*, const int*, int, int,
                                             int, double, double);
template void head_norm_rope_backward<float>(float*, float*, const float*, const float*, const float*, const float*,
                                             const int*, int, int, int, double);
template void head_norm_rope_backward<double>(double*, double*, const double*, const double*, const double*,
                                              const double*, const int*, int, int, int, double);

}  // namespace dflash::cpu
