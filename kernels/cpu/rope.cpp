#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "lib/core/error.h"

namespace dflash::cpu {

namespace {

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
        // angles in double: positions up to ~1e5 times frequencies near 1 lose digits in float
        const double angle = double(p) * std::pow(theta, -2.0 * i / head_dim);
        cos_sin[size_t(p) * head_dim + 2 * i] = std::cos(angle);
        cos_sin[size_t(p) * head_dim + 2 * i + 1] = std::sin(angle);
      }
    n_pos = grown;
  }
};

// out (= or +=) rotation of in by sign·angle, for every row and head.
template <typename T, bool Accumulate>
void rotate(T* out, const T* in, const int* pos, int rows, int heads, int head_dim, double theta, double sign) {
  const int half = head_dim / 2;
  static thread_local RopeTable table;
  int max_pos = 0;
  for (int r = 0; r < rows; ++r) {
    assert(pos[r] >= 0);  // kernels never throw: positions come from the orchestration, never from user input
    max_pos = std::max(max_pos, pos[r]);
  }
  table.ensure(theta, head_dim, max_pos);
  const RopeTable& tab = table;
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const double* cs = tab.at(pos[r]);
    for (int i = 0; i < half; ++i) {
      const T c = T(cs[2 * i]), s = T(sign * cs[2 * i + 1]);
      for (int h = 0; h < heads; ++h) {
        const size_t base = (size_t(r) * heads + h) * head_dim;
        const T a = in[base + i], b = in[base + i + half];
        const T ya = a * c - b * s, yb = b * c + a * s;
        if constexpr (Accumulate) {
          out[base + i] += ya;
          out[base + i + half] += yb;
        } else {
          out[base + i] = ya;
          out[base + i + half] = yb;
        }
      }
    }
  }
}

}  // namespace

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

}  // namespace dflash::cpu
