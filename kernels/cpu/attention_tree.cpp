#include "kernels/cpu/attention_tree.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dflash::cpu {

namespace {

// keys[]: the key rows node i sees, in increasing order: 0..past−1, then past + a for each ancestor a of i (and i)
void visible_keys(const int* parents, int i, int past, std::vector<int>& keys) {
  keys.clear();
  for (int j = 0; j < past; ++j) keys.push_back(j);
  const size_t first_node = keys.size();
  for (int a = i; a >= 0; a = parents[a]) keys.push_back(past + a);
  std::reverse(keys.begin() + long(first_node), keys.end());  // the walk gives i, parent, ..., root
}

}  // namespace

template <typename T>
void attention_tree_forward(T* out, const T* q, const T* k, const T* v, const int* parents, int n, int past,
                            int q_heads, int kv_heads, int head_dim) {
  const int g = q_heads / kv_heads;
  const T scale = T(1) / std::sqrt(T(head_dim));
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) {
    std::vector<int> keys;
    visible_keys(parents, i, past, keys);
    std::vector<T> p(keys.size());
    for (int h = 0; h < q_heads; ++h) {
      const int kvh = h / g;
      const T* qi = q + (size_t(i) * q_heads + h) * head_dim;
      T mx = -INFINITY;
      for (size_t j = 0; j < keys.size(); ++j) {
        const T* kj = k + (size_t(keys[j]) * kv_heads + kvh) * head_dim;
        T s = 0;
        for (int d = 0; d < head_dim; ++d) s += qi[d] * kj[d];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      T sum = 0;
      for (auto& x : p) sum += x = std::exp(x - mx);
      T* oi = out + (size_t(i) * q_heads + h) * head_dim;
      std::fill(oi, oi + head_dim, T(0));
      for (size_t j = 0; j < keys.size(); ++j) {
        const T w = p[j] / sum;
        const T* vj = v + (size_t(keys[j]) * kv_heads + kvh) * head_dim;
        for (int d = 0; d < head_dim; ++d) oi[d] += w * vj[d];
      }
    }
  }
}

template <typename T>
void attention_tree_reference(T* out, const T* q, const T* k, const T* v, const int* parents, int n, int past,
                              int q_heads, int kv_heads, int head_dim) {
  const int total = past + n, g = q_heads / kv_heads;
  // visible[i][j]: query node i may read key row j
  std::vector<std::vector<bool>> visible(size_t(n), std::vector<bool>(size_t(total), false));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < past; ++j) visible[size_t(i)][size_t(j)] = true;
    for (int j = 0; j < n; ++j) {
      bool ancestor = false;
      for (int a = i; a >= 0; a = parents[a]) ancestor |= a == j;
      visible[size_t(i)][size_t(past + j)] = ancestor;
    }
  }
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < q_heads; ++h) {
      const T* qi = q + (size_t(i) * q_heads + h) * head_dim;
      std::vector<T> s(size_t(total), T(0));
      T mx = -INFINITY;
      for (int j = 0; j < total; ++j) {
        if (!visible[size_t(i)][size_t(j)]) continue;
        const T* kj = k + (size_t(j) * kv_heads + h / g) * head_dim;
        for (int d = 0; d < head_dim; ++d) s[size_t(j)] += qi[d] * kj[d];
        s[size_t(j)] /= std::sqrt(T(head_dim));
        mx = std::max(mx, s[size_t(j)]);
      }
      T sum = 0;
      for (int j = 0; j < total; ++j) {
        s[size_t(j)] = visible[size_t(i)][size_t(j)] ? std::exp(s[size_t(j)] - mx) : T(0);
        sum += s[size_t(j)];
      }
      T* oi = out + (size_t(i) * q_heads + h) * head_dim;
      for (int d = 0; d < head_dim; ++d) {
        T acc = 0;
        for (int j = 0; j < total; ++j) acc += s[size_t(j)] / sum * v[(size_t(j) * kv_heads + h / g) * head_dim + d];
        oi[d] = acc;
      }
    }
}

#define DFLASH_TREE_INSTANTIATE(T)                                                                                  \
  template void attention_tree_forward<T>(T*, const T*, const T*, const T*, const int*, int, int, int, int, int);   \
  template void attention_tree_reference<T>(T*, const T*, const T*, const T*, const int*, int, int, int, int, int);
DFLASH_TREE_INSTANTIATE(float)
DFLASH_TREE_INSTANTIATE(double)
#undef DFLASH_TREE_INSTANTIATE

}  // namespace dflash::cpu
