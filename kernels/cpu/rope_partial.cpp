#include "kernels/cpu/rope_partial.h"

#include <cmath>
#include <vector>

#include "kernels/math/norm.h"
#include "lib/core/error.h"

namespace dflash::cpu {

template <typename T>
void rope_partial_forward(T* x, const int* pos, int rows, int heads, int head_dim, int rot_dim, double theta) {
  DFLASH_CHECK(rot_dim % 2 == 0 && rot_dim > 0 && rot_dim <= head_dim,
               "rope_partial: rotary dims {} must be even and in (0, head_dim {}]", rot_dim, head_dim);
  const int half = rot_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv_freq[size_t(i)] = kernels::math::rope_angle(1, i, rot_dim, theta);
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < half; ++i) {
      // angle in double: positions times frequencies near 1 lose digits in float (the frequencies are
      // kernels/math/norm.h's rope_angle at pos 1, computed once per call)
      const double angle = double(pos[r]) * inv_freq[size_t(i)];
      const T c = T(std::cos(angle)), s = T(std::sin(angle));
      for (int h = 0; h < heads; ++h) {
        T* base = x + (size_t(r) * heads + h) * head_dim;
        kernels::math::rope_rotate(T(base[i]), T(base[i + half]), c, s, base[i], base[i + half]);
      }
    }
  }
}

template void rope_partial_forward<float>(float*, const int*, int, int, int, int, double);
template void rope_partial_forward<double>(double*, const int*, int, int, int, int, double);

}  // namespace dflash::cpu
