// DFlash drafter attention (mask and shapes: kernels/attention_shape.h), flash style: no score matrix beyond one
// 32-key tile in registers. Unverified on GPU; simple over fast (CUDA cores, warp per query / per key).
//   forward:   one warp per (query row, head): online softmax over its visible keys (attention_common.cuh);
//              out (=), lse (=).
//   backward:  recomputes p = exp(score − lse); no atomics, every output element has one writer:
//              (1) one warp per (query row, head): delta = dO·O (saved), dq (+=) scale · Σ_k dS k;
//              (2) one warp per (key, kv head), context keys and block keys: walks the queries that see the key
//                  (cuda_math::dflash_rows_seeing_*), dk (+=) scale · Σ_q dS q, dv (+=) Σ_q p dO.
//              Deterministic: fixed visiting order, fixed warp reductions.
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/check.h"

#include <type_traits>

namespace dflash::kernels::cuda {

namespace {

using cuda_math::DFlashKeys;

struct QueryRef {  // one (query row, head) of a warp
  int r, b, j, h, g;
};

__device__ __forceinline__ bool query_of_warp(const DFlashAttentionShape& s, QueryRef& q) {
  const long long query = (long long)blockIdx.x * kAttnWarps + threadIdx.x / kWarp;  // = r·NH + h
  if (query >= (long long)s.n_blocks * s.block * s.heads) return false;
  q.r = int(query / s.heads);
  q.h = int(query % s.heads);
  q.b = q.r / s.block;
  q.j = q.r % s.block;
  q.g = q.h / (s.heads / s.kv_heads);
  return true;
}

template <typename T>
struct KeyRows {  // visible key t of one query → its k and v rows
  const T *k_ctx, *v_ctx, *k_blk, *v_blk;
  DFlashKeys keys;
  int b, block, g, KVH, D;
  __device__ void operator()(int t, const T*& k, const T*& v) const {
    int row;
    const bool ctx = cuda_math::dflash_key_row(keys, b, block, t, row);
    const size_t off = (size_t(row) * KVH + g) * D;
    k = (ctx ? k_ctx : k_blk) + off;
    v = (ctx ? v_ctx : v_blk) + off;
  }
};

template <typename T>
__global__ void dflash_forward_kernel(T* out, float* lse, const T* q, const T* k_ctx, const T* v_ctx, const T* k_blk,
                                      const T* v_blk, const int32_t* anchors, DFlashAttentionShape s) {
  DFLASH_SHARED(float, q_sh, [kAttnWarps][kMaxHeadDim]);
  QueryRef qr;
  if (!query_of_warp(s, qr)) return;  // whole warps exit together; no block barriers below
  const int D = s.head_dim, lane = threadIdx.x % kWarp;
  const size_t qoff = (size_t(qr.r) * s.heads + qr.h) * D;
  float* q_s = q_sh[threadIdx.x / kWarp];
  load_shared(q_s, q + qoff, D);
  const KeyRows<T> key{k_ctx, v_ctx, k_blk, v_blk, cuda_math::dflash_query_keys(s, anchors[qr.b], qr.j),
                       qr.b, s.block, qr.g, s.kv_heads, D};
  float o[kDimPerLane];
  cuda_math::OnlineSoftmax sm;
  attend_query<T>(q_s, D, 1.0f / sqrtf(float(D)), key.keys.count(), key, o, sm);
  const float inv_l = 1.0f / sm.l;
  for (int c = 0; c < kDimPerLane; ++c) {
    const int d = lane + kWarp * c;
    if (d < D) out[qoff + d] = from_f<T>(o[c] * inv_l);
  }
  if (lane == 0) lse[size_t(qr.r) * s.heads + qr.h] = sm.lse();
}

// (1) dq and delta.
template <typename T>
__global__ void dflash_backward_dq_kernel(T* dq, float* delta_out, const T* dout, const T* out, const float* lse,
                                          const T* q, const T* k_ctx, const T* v_ctx, const T* k_blk, const T* v_blk,
                                          const int32_t* anchors, DFlashAttentionShape s) {
  DFLASH_SHARED(float, q_sh, [kAttnWarps][kMaxHeadDim]);
  DFLASH_SHARED(float, do_sh, [kAttnWarps][kMaxHeadDim]);
  QueryRef qr;
  if (!query_of_warp(s, qr)) return;
  const int D = s.head_dim, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const size_t qoff = (size_t(qr.r) * s.heads + qr.h) * D;
  float* q_s = q_sh[warp];
  float* do_s = do_sh[warp];
  load_shared(q_s, q + qoff, D);
  load_shared(do_s, dout + qoff, D);
  float part = 0;
  for (int d = lane; d < D; d += kWarp) part += do_s[d] * to_f(out[qoff + d]);
  const float delta = warp_sum(part);
  const float l = lse[size_t(qr.r) * s.heads + qr.h];
  if (lane == 0) delta_out[size_t(qr.r) * s.heads + qr.h] = delta;
  const float scale = 1.0f / sqrtf(float(D));
  const KeyRows<T> key{k_ctx, v_ctx, k_blk, v_blk, cuda_math::dflash_query_keys(s, anchors[qr.b], qr.j),
                       qr.b, s.block, qr.g, s.kv_heads, D};
  const int n_keys = key.keys.count();
  float acc[kDimPerLane] = {};
  DFLASH_SHARED(float, ds_sh, [kAttnWarps][kWarp]);
  WarpRow ds_row{ds_sh[warp]};
  for (int t0 = 0; t0 < n_keys; t0 += kWarp) {
    const int t = t0 + lane;
    float ds = 0;
    if (t < n_keys) {
      const T *kp, *vp;
      key(t, kp, vp);
      const float p = expf(dot_shared(q_s, kp, D) * scale - l);
      ds = cuda_math::attention_dscore(p, dot_shared(do_s, vp, D), delta) * scale;
    }
    const int nt = n_keys - t0 < kWarp ? n_keys - t0 : kWarp;
    ds_row.publish(ds);
    for (int kk = 0; kk < nt; ++kk) {
      const float dsk = ds_row[kk];
      const T *kp, *vp;
      key(t0 + kk, kp, vp);
      for (int c = 0; c < kDimPerLane; ++c) {
        const int d = lane + kWarp * c;
        if (d < D) acc[c] += dsk * to_f(kp[d]);
      }
    }
    ds_row.release();
  }
  for (int c = 0; c < kDimPerLane; ++c) {
    const int d = lane + kWarp * c;
    if (d < D) dq[qoff + d] = from_f<T>(to_f(dq[qoff + d]) + acc[c]);
  }
}

// (2) dk, dv of one key: warps [0, S·KVH) own context keys, then [S·KVH, (S + NB)·KVH) own block keys.
template <typename T>
__global__ void dflash_backward_dkv_kernel(T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk, const T* dout,
                                           const float* lse, const float* delta, const T* q, const T* k_ctx,
                                           const T* v_ctx, const T* k_blk, const T* v_blk, const int32_t* anchors,
                                           DFlashAttentionShape s) {
  DFLASH_SHARED(float, k_sh, [kAttnWarps][kMaxHeadDim]);
  DFLASH_SHARED(float, v_sh, [kAttnWarps][kMaxHeadDim]);
  const long long w = (long long)blockIdx.x * kAttnWarps + threadIdx.x / kWarp;
  const long long n_ctx_warps = (long long)s.ctx_len * s.kv_heads;
  const long long n_warps = n_ctx_warps + (long long)s.n_blocks * s.block * s.kv_heads;
  if (w >= n_warps) return;
  const bool is_ctx = w < n_ctx_warps;
  const long long kw = is_ctx ? w : w - n_ctx_warps;
  const int key_row = int(kw / s.kv_heads), g = int(kw % s.kv_heads);
  const int D = s.head_dim, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int G = s.heads / s.kv_heads, NH = s.heads;
  const size_t koff = (size_t(key_row) * s.kv_heads + g) * D;
  float* k_s = k_sh[warp];
  float* v_s = v_sh[warp];
  load_shared(k_s, (is_ctx ? k_ctx : k_blk) + koff, D);
  load_shared(v_s, (is_ctx ? v_ctx : v_blk) + koff, D);
  const float scale = 1.0f / sqrtf(float(D));
  float dk[kDimPerLane] = {}, dv[kDimPerLane] = {};
  DFLASH_SHARED(float, p_sh, [kAttnWarps][kWarp]);
  DFLASH_SHARED(float, ds_sh, [kAttnWarps][kWarp]);
  WarpRow p_row{p_sh[warp]}, ds_row{ds_sh[warp]};
  // Blocks whose queries may see this key: every block for a context key, its own block for a block key.
  const int b_first = is_ctx ? 0 : key_row / s.block;
  const int b_last = is_ctx ? s.n_blocks : b_first + 1;
  for (int b = b_first; b < b_last; ++b) {
    int j_lo, j_hi;
    if (is_ctx)
      cuda_math::dflash_rows_seeing_ctx(s, anchors[b], key_row, j_lo, j_hi);
    else
      cuda_math::dflash_rows_seeing_blk(s, key_row % s.block, j_lo, j_hi);
    const int n_q = (j_hi - j_lo) * G;  // queries (j, hh), j-major
    for (int t0 = 0; t0 < n_q; t0 += kWarp) {
      const int t = t0 + lane;
      float p = 0, ds = 0;
      if (t < n_q) {
        const int r = b * s.block + j_lo + t / G, h = g * G + t % G;
        const size_t qoff = (size_t(r) * NH + h) * D;
        float qk = 0, dov = 0;
        for (int d = 0; d < D; ++d) {
          qk += to_f(q[qoff + d]) * k_s[d];
          dov += to_f(dout[qoff + d]) * v_s[d];
        }
        p = expf(qk * scale - lse[size_t(r) * NH + h]);
        ds = cuda_math::attention_dscore(p, dov, delta[size_t(r) * NH + h]) * scale;
      }
      const int nt = n_q - t0 < kWarp ? n_q - t0 : kWarp;
      p_row.v[lane] = p;
      ds_row.publish(ds);  // one __syncwarp publishes both rows
      for (int kk = 0; kk < nt; ++kk) {
        const float pk = p_row[kk];
        const float dsk = ds_row[kk];
        const int tk = t0 + kk;
        const int r = b * s.block + j_lo + tk / G, h = g * G + tk % G;
        const size_t qoff = (size_t(r) * NH + h) * D;
        for (int c = 0; c < kDimPerLane; ++c) {
          const int d = lane + kWarp * c;
          if (d < D) {
            dk[c] += dsk * to_f(q[qoff + d]);
            dv[c] += pk * to_f(dout[qoff + d]);
          }
        }
      }
      ds_row.release();
    }
  }
  T* dk_out = (is_ctx ? dk_ctx : dk_blk) + koff;
  T* dv_out = (is_ctx ? dv_ctx : dv_blk) + koff;
  for (int c = 0; c < kDimPerLane; ++c) {
    const int d = lane + kWarp * c;
    if (d < D) {
      dk_out[d] = from_f<T>(to_f(dk_out[d]) + dk[c]);
      dv_out[d] = from_f<T>(to_f(dv_out[d]) + dv[c]);
    }
  }
}

unsigned blocks_for_warps(long long warps) { return unsigned((warps + kAttnWarps - 1) / kAttnWarps); }

}  // namespace

template <typename T>
void launch_dflash_attention_forward_cores(cudaStream_t st, T* out, float* lse, const T* q, const T* k_ctx, const T* v_ctx,
                                     const T* k_blk, const T* v_blk, const int32_t* anchors,
                                     const DFlashAttentionShape& s) {
  const long long queries = (long long)s.n_blocks * s.block * s.heads;
  if (queries <= 0) return;
  DFLASH_LAUNCH(blocks_for_warps(queries), kAttnWarps * kWarp, 0, st, dflash_forward_kernel<T>)(out, lse, q, k_ctx, v_ctx, k_blk,
                                                                                      v_blk, anchors, s);
}

template <typename T>
void launch_dflash_attention_backward_cores(cudaStream_t st, T* dq, T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk,
                                      const T* dout, const T* out, const float* lse, const T* q, const T* k_ctx,
                                      const T* v_ctx, const T* k_blk, const T* v_blk, const int32_t* anchors,
                                      const DFlashAttentionShape& s, float* delta) {
  const long long queries = (long long)s.n_blocks * s.block * s.heads;
  if (queries <= 0) return;
  DFLASH_LAUNCH(blocks_for_warps(queries), kAttnWarps * kWarp, 0, st, dflash_backward_dq_kernel<T>)(
      dq, delta, dout, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, s);
  const long long key_warps = ((long long)s.ctx_len + (long long)s.n_blocks * s.block) * s.kv_heads;
  DFLASH_LAUNCH(blocks_for_warps(key_warps), kAttnWarps * kWarp, 0, st, dflash_backward_dkv_kernel<T>)(
      dk_ctx, dv_ctx, dk_blk, dv_blk, dout, lse, delta, q, k_ctx, v_ctx, k_blk, v_blk, anchors, s);
}

template <typename T>
void launch_dflash_attention_forward(cudaStream_t st, T* out, float* lse, const T* q, const T* k_ctx, const T* v_ctx,
                                     const T* k_blk, const T* v_blk, const int32_t* anchors,
                                     const DFlashAttentionShape& s) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (dflash_attention_tc_supports(s, {out, q, k_ctx, v_ctx, k_blk, v_blk}))
      return launch_dflash_attention_forward_tc(st, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, s);
  }
  launch_dflash_attention_forward_cores(st, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, s);
}

template <typename T>
void launch_dflash_attention_backward(cudaStream_t st, T* dq, T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk,
                                      const T* dout, const T* out, const float* lse, const T* q, const T* k_ctx,
                                      const T* v_ctx, const T* k_blk, const T* v_blk, const int32_t* anchors,
                                      const DFlashAttentionShape& s, float* delta) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (dflash_attention_tc_supports(s, {dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, q, k_ctx, v_ctx, k_blk, v_blk}))
      return launch_dflash_attention_backward_tc(st, dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx,
                                                 v_ctx, k_blk, v_blk, anchors, s, delta);
  }
  launch_dflash_attention_backward_cores(st, dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx,
                                         k_blk, v_blk, anchors, s, delta);
}

#define DFLASH_INSTANTIATE_AS(T, NAME)                                                                             \
  template void NAME<T>(cudaStream_t, T*, float*, const T*, const T*, const T*, const T*, const T*, const int32_t*, \
                        const DFlashAttentionShape&);
#define DFLASH_INSTANTIATE_BWD_AS(T, NAME)                                                                         \
  template void NAME<T>(cudaStream_t, T*, T*, T*, T*, T*, const T*, const T*, const float*, const T*, const T*,     \
                        const T*, const T*, const T*, const int32_t*, const DFlashAttentionShape&, float*);
#define DFLASH_INSTANTIATE(T)                                              \
  DFLASH_INSTANTIATE_AS(T, launch_dflash_attention_forward)                \
  DFLASH_INSTANTIATE_AS(T, launch_dflash_attention_forward_cores)          \
  DFLASH_INSTANTIATE_BWD_AS(T, launch_dflash_attention_backward)           \
  DFLASH_INSTANTIATE_BWD_AS(T, launch_dflash_attention_backward_cores)
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(bf16)
#undef DFLASH_INSTANTIATE
#undef DFLASH_INSTANTIATE_AS
#undef DFLASH_INSTANTIATE_BWD_AS

}  // namespace dflash::kernels::cuda
