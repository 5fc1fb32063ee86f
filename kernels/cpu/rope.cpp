#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace dflash::cpu {

namespace {

// out (= or +=) rotation of in by sign·angle, for every row and head.
template <typename T, bool Accumulate>
void rotate(T* out, const T* in, const int* pos, int rows, int heads, int head_dim, double theta, double sign) {
  const int half = head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = std::pow(theta, -2.0 * i / head_dim);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < half; ++i) {
      // angles in double: positions up to ~1e5 times frequencies near 1 lose digits in float
      const double angle = double(pos[r]) * inv_freq[i];
      const T c = T(std::cos(angle)), s = T(sign * std::sin(angle));
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
