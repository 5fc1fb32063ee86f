#include "kernels/cpu/attention_causal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "lib/core/error.h"

namespace dflash::cpu {

namespace {

// p[0..n) (=) softmax(p[0..n)) in place
template <typename T>
void softmax_row(T* p, int n) {
  T m = -std::numeric_limits<T>::infinity();
  for (int j = 0; j < n; ++j) m = std::max(m, p[j]);
  T sum = 0;
  for (int j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - m);
    sum += p[j];
  }
  const T inv = T(1) / sum;
  for (int j = 0; j < n; ++j) p[j] *= inv;
}

void check_shape(int S, int q_heads, int kv_heads, int head_dim) {
  DFLASH_CHECK(S >= 0 && q_heads >= 1 && kv_heads >= 1 && head_dim >= 1 && q_heads % kv_heads == 0,
               "attention_causal: S={} q_heads={} kv_heads={} head_dim={}: need q_heads a multiple of kv_heads", S,
               q_heads, kv_heads, head_dim);
}

}  // namespace

template <typename T>
void attention_causal_forward(T* out, const T* q, const T* k, const T* v, int S, int q_heads, int kv_heads,
                              int head_dim, int block) {
  check_shape(S, q_heads, kv_heads, head_dim);
  DFLASH_CHECK(block >= 1, "attention_causal: block {} must be ≥ 1", block);
  if (S == 0) return;
  const int group = q_heads / kv_heads;
  const int ldq = q_heads * head_dim, ldk = kv_heads * head_dim;
  const T scale = T(1) / std::sqrt(T(head_dim));
  std::vector<T> scores(size_t(std::min(block, S)) * S);  // [block, keys]: the only score storage
  for (int h = 0; h < q_heads; ++h) {
    const int kvh = h / group;
    for (int i0 = 0; i0 < S; i0 += block) {
      const int rows = std::min(block, S - i0), keys = i0 + rows;  // rows i0..i0+rows-1 see keys < i+1 ≤ keys
      // scores[rows, keys] = scale · q_blk · kᵀ
      gemm<T>(false, true, rows, keys, head_dim, scale, q + size_t(i0) * ldq + size_t(h) * head_dim, ldq,
              k + size_t(kvh) * head_dim, ldk, T(0), scores.data(), keys);
      for (int r = 0; r < rows; ++r) {
        T* p = scores.data() + size_t(r) * keys;
        const int visible = i0 + r + 1;
        softmax_row(p, visible);
        std::fill(p + visible, p + keys, T(0));  // the causal mask, applied after the softmax of the visible part
      }
      // out_blk[rows, head_dim] = P · v
      gemm<T>(false, false, rows, head_dim, keys, T(1), scores.data(), keys, v + size_t(kvh) * head_dim, ldk, T(0),
              out + size_t(i0) * ldq + size_t(h) * head_dim, ldq);
    }
  }
}

template <typename T>
void attention_causal_reference(T* out, const T* q, const T* k, const T* v, int S, int q_heads, int kv_heads,
                                int head_dim) {
  check_shape(S, q_heads, kv_heads, head_dim);
  const int group = q_heads / kv_heads;
  const T scale = T(1) / std::sqrt(T(head_dim));
  std::vector<T> p(size_t(std::max(S, 1)));
  for (int h = 0; h < q_heads; ++h) {
    const int kvh = h / group;
    for (int i = 0; i < S; ++i) {
      const T* qi = q + (size_t(i) * q_heads + h) * head_dim;
      for (int j = 0; j <= i; ++j) {
        const T* kj = k + (size_t(j) * kv_heads + kvh) * head_dim;
        T dot = 0;
        for (int d = 0; d < head_dim; ++d) dot += qi[d] * kj[d];
        p[j] = dot * scale;
      }
      softmax_row(p.data(), i + 1);
      T* oi = out + (size_t(i) * q_heads + h) * head_dim;
      for (int d = 0; d < head_dim; ++d) oi[d] = 0;
      for (int j = 0; j <= i; ++j) {
        const T* vj = v + (size_t(j) * kv_heads + kvh) * head_dim;
        for (int d = 0; d < head_dim; ++d) oi[d] += p[j] * vj[d];
      }
    }
  }
}

template void attention_causal_forward<float>(float*, const float*, const float*, const float*, int, int, int, int,
                                              int);
template void attention_causal_forward<double>(double*, const double*, const double*, const double*, int, int, int,
                                               int, int);
template void attention_causal_reference<float>(float*, const float*, const float*, const float*, int, int, int,
                                                int);
template void attention_causal_reference<double>(double*, const double*, const double*, const double*, int, int,
                                                 int, int);

}  // namespace dflash::cpu
