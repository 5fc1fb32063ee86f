#include "kernels/cpu/attention_dflash.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace dflash::cpu {

namespace {

// One (block, kv head) tile: the B·G queries of block b that read kv head g (G = NH / KVH query heads per kv
// head), packed as rows r = j·G + hh, against the keys they may see: context rows [ctx_lo, ctx_hi) — the union
// over the block's rows — followed by the block's own B rows. Scores are [B·G, n_keys]; per-row masking inside
// the tile handles the sliding window and causal-in-block cases. All products go through BLAS.
template <typename T>
struct Tile {
  const DFlashAttentionShape& s;
  int b, g, G, ctx_lo, ctx_hi, n_keys;
  std::vector<T>& qp;  // [B·G, D]      packed queries
  std::vector<T>& p;   // [B·G, n_keys] scores, then probabilities

  Tile(const DFlashAttentionShape& shape, const int* anchors, int b_, int g_, std::vector<T>& qp_,
       std::vector<T>& p_)
      : s(shape), b(b_), g(g_), G(shape.heads / shape.kv_heads), qp(qp_), p(p_) {
    dflash_ctx_range(s, anchors[b], 0, ctx_lo, ctx_hi);  // row 0 has the lowest window bound
    n_keys = (ctx_hi - ctx_lo) + s.block;
    qp.resize(size_t(s.block) * G * s.head_dim);
    p.resize(size_t(s.block) * G * n_keys);
  }
  int rows() const { return s.block * G; }
  int n_ctx() const { return ctx_hi - ctx_lo; }
  size_t kv_stride() const { return size_t(s.kv_heads) * s.head_dim; }
  // element (row r of the tile) ↔ [NB, NH, D] layout of q / out / dq / dout
  size_t head_offset(int r) const {
    return (size_t(b * s.block + r / G) * s.heads + size_t(g) * G + r % G) * s.head_dim;
  }
  const T* ctx_rows(const T* kv) const { return kv + size_t(ctx_lo) * kv_stride() + size_t(g) * s.head_dim; }
  const T* blk_rows(const T* kv) const { return kv + size_t(b) * s.block * kv_stride() + size_t(g) * s.head_dim; }
  T* ctx_rows(T* kv) const { return kv + size_t(ctx_lo) * kv_stride() + size_t(g) * s.head_dim; }
  T* blk_rows(T* kv) const { return kv + size_t(b) * s.block * kv_stride() + size_t(g) * s.head_dim; }

  void pack(std::vector<T>& dst, const T* src) const {
    for (int r = 0; r < rows(); ++r)
      for (int d = 0; d < s.head_dim; ++d) dst[size_t(r) * s.head_dim + d] = src[head_offset(r) + d];
  }
  // Tile row r sees key columns [first, n_ctx) of the context and [n_ctx, n_ctx + blk) of the block; the rest
  // of its row is masked (a sliding window raises `first`, causal-in-block lowers `blk`).
  void visible_columns(const int* anchors, int r, int& first, int& blk) const {
    const int j = r / G;
    int lo, hi;
    dflash_ctx_range(s, anchors[b], j, lo, hi);
    first = lo - ctx_lo;
    blk = dflash_blk_count(s, j);
  }
  // p (=) scale · Qp · [K_ctx ; K_blk]ᵀ
  void scores(const T* k_ctx, const T* k_blk, T scale) const {
    const int D = s.head_dim, ld = int(kv_stride());
    if (n_ctx() > 0) gemm<T>(false, true, rows(), n_ctx(), D, scale, qp.data(), D, ctx_rows(k_ctx), ld, T(0), p.data(), n_keys);
    gemm<T>(false, true, rows(), s.block, D, scale, qp.data(), D, blk_rows(k_blk), ld, T(0), p.data() + n_ctx(),
            n_keys);
  }
};

}  // namespace

template <typename T>
void dflash_attention_forward(T* out, T* lse, const T* q, const T* k_ctx, const T* v_ctx, const T* k_blk,
                              const T* v_blk, const int* anchors, const DFlashAttentionShape& s) {
  const int D = s.head_dim, KVH = s.kv_heads;
  const T scale = T(1) / std::sqrt(T(D));
#pragma omp parallel
  {
    std::vector<T> qp, p, op;  // this thread's tile buffers, reused tile after tile
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < s.n_blocks * KVH; ++task) {
      Tile<T> t(s, anchors, task / KVH, task % KVH, qp, p);
      t.pack(qp, q);
      t.scores(k_ctx, k_blk, scale);
      for (int r = 0; r < t.rows(); ++r) {  // masked softmax per row; lse saved for backward
        T* pr = p.data() + size_t(r) * t.n_keys;
        int first, blk;
        t.visible_columns(anchors, r, first, blk);
        const int end = t.n_ctx() + blk;
        T m = -INFINITY;
        for (int k = first; k < end; ++k) m = pr[k] > m ? pr[k] : m;
        T l = 0;
        for (int k = first; k < end; ++k) l += (pr[k] = std::exp(pr[k] - m));
        const T inv_l = T(1) / l;
        for (int k = 0; k < t.n_keys; ++k) pr[k] = (k >= first && k < end) ? pr[k] * inv_l : T(0);
        lse[t.head_offset(r) / D] = m + std::log(l);
      }
      op.assign(size_t(t.rows()) * D, T(0));  // Op = P · [V_ctx ; V_blk]
      const int ld = int(t.kv_stride());
      if (t.n_ctx() > 0)
        gemm<T>(false, false, t.rows(), D, t.n_ctx(), T(1), p.data(), t.n_keys, t.ctx_rows(v_ctx), ld, T(0),
                op.data(), D);
      gemm<T>(false, false, t.rows(), D, s.block, T(1), p.data() + t.n_ctx(), t.n_keys, t.blk_rows(v_blk), ld, T(1),
              op.data(), D);
      for (int r = 0; r < t.rows(); ++r)
        for (int d = 0; d < D; ++d) out[t.head_offset(r) + d] = op[size_t(r) * D + d];
    }
  }
}

// With P = softmax(S), O = P V:  dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ⊙ (dP − rowsum(dO ⊙ O)),  dQ = scale·dS K,
// dK = scale·dSᵀ Q. Threads own whole kv heads (blocks run in order inside), so every += has one writer in a
// fixed order: results are identical run to run.
template <typename T>
void dflash_attention_backward(T* dq, T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk, const T* dout, const T* out,
                               const T* lse, const T* q, const T* k_ctx, const T* v_ctx, const T* k_blk,
                               const T* v_blk, const int* anchors, const DFlashAttentionShape& s) {
  const int D = s.head_dim, KVH = s.kv_heads;
  const T scale = T(1) / std::sqrt(T(D));
#pragma omp parallel
  {
    std::vector<T> qp, p, dop, dp, dqp;
#pragma omp for schedule(dynamic, 1)
    for (int g = 0; g < KVH; ++g) {
      for (int b = 0; b < s.n_blocks; ++b) {
        Tile<T> t(s, anchors, b, g, qp, p);
        const int R = t.rows(), NK = t.n_keys, nc = t.n_ctx(), ld = int(t.kv_stride());
        t.pack(qp, q);
        dop.resize(size_t(R) * D);
        t.pack(dop, dout);
        t.scores(k_ctx, k_blk, scale);
        dp.resize(size_t(R) * NK);  // dP = dOp · [V_ctx ; V_blk]ᵀ
        if (nc > 0) gemm<T>(false, true, R, nc, D, T(1), dop.data(), D, t.ctx_rows(v_ctx), ld, T(0), dp.data(), NK);
        gemm<T>(false, true, R, s.block, D, T(1), dop.data(), D, t.blk_rows(v_blk), ld, T(0), dp.data() + nc, NK);
        for (int r = 0; r < R; ++r) {  // p ← P (from lse), dp ← scale · dS
          const size_t o = t.head_offset(r);
          T delta = 0;
          for (int d = 0; d < D; ++d) delta += dout[o + d] * out[o + d];
          const T l = lse[o / D];
          T* pr = p.data() + size_t(r) * NK;
          T* dpr = dp.data() + size_t(r) * NK;
          int first, blk;
          t.visible_columns(anchors, r, first, blk);
          const int end = nc + blk;
          for (int k = 0; k < NK; ++k) {
            pr[k] = (k >= first && k < end) ? std::exp(pr[k] - l) : T(0);
            dpr[k] = scale * pr[k] * (dpr[k] - delta);
          }
        }
        dqp.resize(size_t(R) * D);  // dQp = dS · [K_ctx ; K_blk]
        if (nc > 0) gemm<T>(false, false, R, D, nc, T(1), dp.data(), NK, t.ctx_rows(k_ctx), ld, T(0), dqp.data(), D);
        gemm<T>(false, false, R, D, s.block, T(1), dp.data() + nc, NK, t.blk_rows(k_blk), ld, nc > 0 ? T(1) : T(0),
                dqp.data(), D);
        for (int r = 0; r < R; ++r)
          for (int d = 0; d < D; ++d) dq[t.head_offset(r) + d] += dqp[size_t(r) * D + d];
        // dK += dSᵀ · Qp,  dV += Pᵀ · dOp
        if (nc > 0) {
          gemm<T>(true, false, nc, D, R, T(1), dp.data(), NK, qp.data(), D, T(1), t.ctx_rows(dk_ctx), ld);
          gemm<T>(true, false, nc, D, R, T(1), p.data(), NK, dop.data(), D, T(1), t.ctx_rows(dv_ctx), ld);
        }
        gemm<T>(true, false, s.block, D, R, T(1), dp.data() + nc, NK, qp.data(), D, T(1), t.blk_rows(dk_blk), ld);
        gemm<T>(true, false, s.block, D, R, T(1), p.data() + nc, NK, dop.data(), D, T(1), t.blk_rows(dv_blk), ld);
      }
    }
  }
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
