#include "kernels/cpu/attention_dflash.h"

#include <cmath>
#include <vector>

namespace dflash::cpu {

namespace {

template <typename T>
inline T dot(const T* a, const T* b, int n) {
  T s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

template <typename T>
inline void axpy(T* y, T a, const T* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// The keys one query row sees, as two contiguous runs: context rows [ctx_lo, ctx_hi) and block rows
// [blk_row0, blk_row0 + blk_n). Score index t < n_ctx is a context key, t >= n_ctx a block key.
struct VisibleKeys {
  int ctx_lo, ctx_hi, blk_row0, blk_n;
  int n_ctx() const { return ctx_hi - ctx_lo; }
  int count() const { return n_ctx() + blk_n; }
};

inline VisibleKeys visible_keys(const DFlashAttentionShape& s, const int* anchors, int b, int j) {
  VisibleKeys v;
  dflash_ctx_range(s, anchors[b], j, v.ctx_lo, v.ctx_hi);
  v.blk_row0 = b * s.block;
  v.blk_n = dflash_blk_count(s, j);
  return v;
}

}  // namespace

template <typename T>
void dflash_attention_forward(T* out, T* lse, const T* q, const T* k_ctx, const T* v_ctx, const T* k_blk,
                              const T* v_blk, const int* anchors, const DFlashAttentionShape& s) {
  const int D = s.head_dim, NH = s.heads, KVH = s.kv_heads, group = NH / KVH;
  const T scale = T(1) / std::sqrt(T(D));
  const long long rows = (long long)s.n_blocks * s.block;
#pragma omp parallel
  {
    std::vector<T> p(size_t(s.ctx_len) + s.block);  // this thread's scores, reused row after row
#pragma omp for schedule(static)
    for (long long rh = 0; rh < rows * NH; ++rh) {
      const int row = int(rh / NH), h = int(rh % NH), g = h / group;
      const int b = row / s.block, j = row % s.block;
      const VisibleKeys vk = visible_keys(s, anchors, b, j);
      const T* qv = q + (size_t(row) * NH + h) * D;
      T m = -INFINITY;
      for (int t = 0; t < vk.count(); ++t) {
        const T* kv = t < vk.n_ctx() ? k_ctx + (size_t(vk.ctx_lo + t) * KVH + g) * D
                                     : k_blk + (size_t(vk.blk_row0 + t - vk.n_ctx()) * KVH + g) * D;
        p[t] = scale * dot(qv, kv, D);
        m = p[t] > m ? p[t] : m;
      }
      T l = 0;
      for (int t = 0; t < vk.count(); ++t) l += (p[t] = std::exp(p[t] - m));
      T* o = out + (size_t(row) * NH + h) * D;
      for (int d = 0; d < D; ++d) o[d] = 0;
      for (int t = 0; t < vk.count(); ++t) {
        const T* vv = t < vk.n_ctx() ? v_ctx + (size_t(vk.ctx_lo + t) * KVH + g) * D
                                     : v_blk + (size_t(vk.blk_row0 + t - vk.n_ctx()) * KVH + g) * D;
        axpy(o, p[t] / l, vv, D);
      }
      lse[size_t(row) * NH + h] = m + std::log(l);
    }
  }
}

// With P = softmax(S), O = P V:  dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ⊙ (dP − rowsum(dO ⊙ O)),  dQ = scale·dS K,
// dK = scale·dSᵀ Q. Threads own whole kv heads, so every += below has a single writer (and a fixed order).
template <typename T>
void dflash_attention_backward(T* dq, T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk, const T* dout, const T* out,
                               const T* lse, const T* q, const T* k_ctx, const T* v_ctx, const T* k_blk,
                               const T* v_blk, const int* anchors, const DFlashAttentionShape& s) {
  const int D = s.head_dim, NH = s.heads, KVH = s.kv_heads, group = NH / KVH;
  const T scale = T(1) / std::sqrt(T(D));
  const int rows = s.n_blocks * s.block;
#pragma omp parallel for schedule(dynamic, 1)
  for (int g = 0; g < KVH; ++g) {
    for (int row = 0; row < rows; ++row) {
      const int b = row / s.block, j = row % s.block;
      const VisibleKeys vk = visible_keys(s, anchors, b, j);
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const size_t qi = (size_t(row) * NH + h) * D;
        const T* qv = q + qi;
        const T* dov = dout + qi;
        const T delta = dot(dov, out + qi, D);  // rowsum(dO ⊙ O)
        const T l = lse[size_t(row) * NH + h];
        T* dqv = dq + qi;
        for (int t = 0; t < vk.count(); ++t) {
          const bool is_ctx = t < vk.n_ctx();
          const size_t ki = is_ctx ? (size_t(vk.ctx_lo + t) * KVH + g) * D
                                   : (size_t(vk.blk_row0 + t - vk.n_ctx()) * KVH + g) * D;
          const T* kv = (is_ctx ? k_ctx : k_blk) + ki;
          const T* vv = (is_ctx ? v_ctx : v_blk) + ki;
          const T p = std::exp(scale * dot(qv, kv, D) - l);
          const T ds = p * (dot(dov, vv, D) - delta);
          axpy(dqv, scale * ds, kv, D);
          axpy((is_ctx ? dk_ctx : dk_blk) + ki, scale * ds, qv, D);
          axpy((is_ctx ? dv_ctx : dv_blk) + ki, p, dov, D);
        }
      }
    }
  }
}

long long dflash_attention_pairs(const int* anchors, const DFlashAttentionShape& s) {
  long long pairs = 0;
  for (int b = 0; b < s.n_blocks; ++b)
    for (int j = 0; j < s.block; ++j) pairs += visible_keys(s, anchors, b, j).count();
  return pairs * s.heads;
}

template void dflash_attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                              const float*, const float*, const int*, const DFlashAttentionShape&);
template void dflash_attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                               const double*, const double*, const int*,
                                               const DFlashAttentionShape&);
template void dflash_attention_backward<float>(float*, float*, float*, float*, float*, const float*, const float*,
                                               const float*, const float*, const float*, const float*,
                                               const float*, const float*, const int*, const DFlashAttentionShape&);
template void dflash_attention_backward<double>(double*, double*, double*, double*, double*, const double*,
                                                const double*, const double*, const double*, const double*,
                                                const double*, const double*, const double*, const int*,
                                                const DFlashAttentionShape&);

}  // namespace dflash::cpu
