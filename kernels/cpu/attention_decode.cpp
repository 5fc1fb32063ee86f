#include "kernels/cpu/attention_decode.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dflash::cpu {

template <typename T>
void attention_decode_forward(T* out, const T* q, const T* k, const T* v, int n, int past, int q_heads, int kv_heads,
                              int head_dim) {
  const int g = q_heads / kv_heads;
  const T scale = T(1) / std::sqrt(T(head_dim));
#pragma omp parallel for collapse(2) schedule(static)
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < q_heads; ++h) {
      const int kvh = h / g, keys = past + i + 1;
      const T* qi = q + (size_t(i) * q_heads + h) * head_dim;
      std::vector<T> p(static_cast<size_t>(keys));
      T mx = -INFINITY;
      for (int j = 0; j < keys; ++j) {
        const T* kj = k + (size_t(j) * kv_heads + kvh) * head_dim;
        T s = 0;
        for (int d = 0; d < head_dim; ++d) s += qi[d] * kj[d];
        p[size_t(j)] = s * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      T sum = 0;
      for (auto& x : p) sum += x = std::exp(x - mx);
      T* oi = out + (size_t(i) * q_heads + h) * head_dim;
      std::fill(oi, oi + head_dim, T(0));
      for (int j = 0; j < keys; ++j) {
        const T w = p[size_t(j)] / sum;
        const T* vj = v + (size_t(j) * kv_heads + kvh) * head_dim;
        for (int d = 0; d < head_dim; ++d) oi[d] += w * vj[d];
      }
    }
  }
}

template void attention_decode_forward<float>(float*, const float*, const float*, const float*, int, int, int, int,
                                              int);
template void attention_decode_forward<double>(double*, const double*, const double*, const double*, int, int, int,
                                               int, int);

}  // namespace dflash::cpu
