// Gated DeltaNet's kernels (forward only, the frozen target); the element formulas in kernels/math (gates.h, norm.h),
// the conv's tap rows and the delta rule's register slices in target_math.h. Unverified on GPU; simple over fast:
//   conv1d + SiLU   one thread per output element (t, c), its K taps in order; then one thread per channel moves
//                   the carried tail (rows in increasing order: each reads a row ahead of the ones it writes).
//   l2norm, gated RMSNorm   one block per row, a fixed-tree Σx² (deterministic), as rmsnorm_forward.
//   gates           one thread per (token, value head).
//   delta rule      the per-token recurrence, sequential over S: a block of kDeltaRowGroups warps per (value head,
//                   32 state columns); lane d owns column d, warp w rows [w·R, w·R + R) of it, held in registers
//                   (cm::delta_slice_*). Per token: k_t, q_t staged in shared memory (prefetched into registers
//                   during the previous token), the prediction's and the output's partials summed over the warps
//                   through shared memory: three block barriers per token. Still S sequential steps, on
//                   v_heads · ⌈dv/32⌉ blocks: fp32, decode steps (S = 1) and the bf16 shapes deltanet_chunked.cu
//                   does not take (bf16 with dk 64 / 128, dv a multiple of 64 and S ≥ 2 runs chunk-parallel there).
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/deltanet_chunked.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/target_math.h"
#include "kernels/delta_rule_chunks.h"
#include "kernels/math/gates.h"
#include "kernels/math/norm.h"

namespace dflash::kernels::cuda {

namespace {

namespace cm = cuda_math;

template <typename T>
__global__ void conv1d_silu_kernel(T* y, const T* x, const T* w, const T* tail, int S, int C, int K) {
  const size_t n = size_t(S) * C;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < n; idx += size_t(gridDim.x) * blockDim.x) {
    const int t = int(idx / C), c = int(idx % C);
    float acc = 0;
    for (int j = 0; j < K; ++j) {
      int row;
      const bool in_tail = cm::conv_tap_row(t, j, K, row);
      const float xv = in_tail ? (tail ? to_f(tail[size_t(row) * C + c]) : 0.0f) : to_f(x[size_t(row) * C + c]);
      acc = math::conv_tap(acc, to_f(w[size_t(c) * K + j]), xv);
    }
    y[idx] = from_f<T>(math::silu(acc));
  }
}

// tail[r, c] = row S + r of [tail ; x], r = 0 .. K−2 in order (S ≥ 1 reads rows after r; S = 0 rewrites r itself).
template <typename T>
__global__ void conv_tail_kernel(T* tail, const T* x, int S, int C, int K) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int r = 0; r < K - 1; ++r) {
    int row;
    const bool in_tail = cm::conv_tap_row(S, r, K, row);
    tail[size_t(r) * C + c] = in_tail ? tail[size_t(row) * C + c] : x[size_t(row) * C + c];
  }
}

template <typename T>
__global__ void l2norm_kernel(T* x, int dim, float eps, float scale) {
  const size_t base = size_t(blockIdx.x) * dim;
  SumF ss;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    const float xi = to_f(x[base + i]);
    ss.v += xi * xi;
  }
  const float f = math::l2norm_factor(block_merge(ss).v, eps, scale);
  for (int i = threadIdx.x; i < dim; i += kThreads) x[base + i] = from_f<T>(to_f(x[base + i]) * f);
}

template <typename T>
__global__ void gated_rmsnorm_kernel(T* y, const T* x, const T* z, const T* w, int dim, float eps) {
  const size_t base = size_t(blockIdx.x) * dim;
  SumF ss;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    const float xi = to_f(x[base + i]);
    ss.v += xi * xi;
  }
  const float rstd = math::rmsnorm_rstd(block_merge(ss).v, dim, eps);
  // y may alias x: every x is read above (before the merge's barriers), then read and written by one thread
  for (int i = threadIdx.x; i < dim; i += kThreads)
    y[base + i] = from_f<T>(math::gated_rmsnorm_y(to_f(x[base + i]), rstd, to_f(w[i]), to_f(z[base + i])));
}

template <typename T>
__global__ void deltanet_gates_kernel(float* g, float* beta, const T* a, const T* b, const T* a_log, const T* dt_bias,
                                      int rows, int heads) {
  const size_t n = size_t(rows) * heads;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int j = int(i % heads);
    beta[i] = math::deltanet_beta(to_f(b[i]));
    g[i] = math::deltanet_g(to_f(a[i]), to_f(dt_bias[j]), to_f(a_log[j]));
  }
}

// grid (v_heads, ⌈dv/32⌉), kDeltaRowGroups warps: value head h, state column d = blockIdx.y·32 + lane, rows
// [w·R, w·R + n) of it in warp w (target_math.h). dk ≤ kMaxDeltaKeyDim = 2 · blockDim.x.
template <typename T, int R>
__global__ void __launch_bounds__(cm::kDeltaRowGroups * kWarp)
    delta_rule_kernel(T* out, const T* q, const T* k, const T* v, const float* g, const float* beta, float* state,
                      int S, int KH, int VH, int dk, int dv) {
  constexpr int kGroups = cm::kDeltaRowGroups, kThreads = kGroups * kWarp;
  DFLASH_SHARED(float, k_s, [kMaxDeltaKeyDim]);
  DFLASH_SHARED(float, q_s, [kMaxDeltaKeyDim]);
  DFLASH_SHARED(float, pred_s, [kGroups][kWarp]);
  DFLASH_SHARED(float, out_s, [kGroups][kWarp]);
  const int h = blockIdx.x, lane = threadIdx.x % kWarp, w = threadIdx.x / kWarp, tid = threadIdx.x;
  const int d = blockIdx.y * kWarp + lane, kh = h / (VH / KH), r0 = w * R;
  const int n = max(0, min(R, dk - r0));
  const bool active = d < dv;
  float m[R];
#pragma unroll
  for (int j = 0; j < R; ++j) m[j] = state && active && j < n ? state[(size_t(h) * dk + r0 + j) * dv + d] : 0.0f;

  // token t + 1's inputs load into registers while token t computes (global latency off the sequential path)
  float k_next[2] = {0, 0}, q_next[2] = {0, 0}, v_next = 0, g_next = 0, b_next = 0;
  auto prefetch = [&](int t) {
    const size_t kq = (size_t(t) * KH + kh) * dk, th = size_t(t) * VH + h;
    for (int e = 0; e < 2; ++e) {
      const int i = tid + e * kThreads;
      if (i < dk) {
        k_next[e] = to_f(k[kq + i]);
        q_next[e] = to_f(q[kq + i]);
      }
    }
    v_next = active ? to_f(v[th * dv + d]) : 0.0f;
    g_next = g[th];
    b_next = beta[th];
  };
  if (S > 0) prefetch(0);
  for (int t = 0; t < S; ++t) {
    for (int e = 0; e < 2; ++e) {
      const int i = tid + e * kThreads;
      if (i < dk) {
        k_s[i] = k_next[e];
        q_s[i] = q_next[e];
      }
    }
    const float v_d = v_next, decay = expf(g_next), b = b_next;
    __syncthreads();  // k_s, q_s hold token t (the last token's readers passed the barrier after its update)
    if (t + 1 < S) prefetch(t + 1);
    pred_s[w][lane] = cm::delta_slice_dot(m, k_s + r0, n);
    __syncthreads();
    float pred = 0;
#pragma unroll
    for (int i = 0; i < kGroups; ++i) pred += pred_s[i][lane];
    const float u = cm::delta_u(pred, decay, v_d, b);
    out_s[w][lane] = cm::delta_slice_update(m, k_s + r0, q_s + r0, n, decay, u);
    __syncthreads();  // every slice updated and its output partial written
    if (w == 0 && active) {
      float o = 0;
#pragma unroll
      for (int i = 0; i < kGroups; ++i) o += out_s[i][lane];
      out[(size_t(t) * VH + h) * dv + d] = from_f<T>(o);
    }
  }
  if (state && active)
#pragma unroll
    for (int j = 0; j < R; ++j)
      if (j < n) state[(size_t(h) * dk + r0 + j) * dv + d] = m[j];
}

}  // namespace

template <typename T>
void launch_causal_conv1d_silu(cudaStream_t st, T* y, const T* x, const T* w, T* tail, int S, int C, int K) {
  const size_t n = size_t(S) * C;
  if (n) {
    DFLASH_LAUNCH(grid_for(n), kThreads, 0, st, conv1d_silu_kernel<T>)(y, x, w, tail, S, C, K);
  }
  if (tail && C > 0 && K > 1) {  // after the conv, which reads the old tail (same stream: ordered)
    DFLASH_LAUNCH(unsigned((C + kThreads - 1) / kThreads), kThreads, 0, st, conv_tail_kernel<T>)(tail, x, S, C, K);
  }
}

template <typename T>
void launch_l2norm(cudaStream_t st, T* x, int rows, int dim, float eps, float scale) {
  if (rows <= 0 || dim <= 0) return;
  DFLASH_LAUNCH(rows, kThreads, 0, st, l2norm_kernel<T>)(x, dim, eps, scale);
}

template <typename T>
void launch_gated_rmsnorm(cudaStream_t st, T* y, const T* x, const T* z, const T* w, int rows, int dim, float eps) {
  if (rows <= 0 || dim <= 0) return;
  DFLASH_LAUNCH(rows, kThreads, 0, st, gated_rmsnorm_kernel<T>)(y, x, z, w, dim, eps);
}

template <typename T>
void launch_deltanet_gates(cudaStream_t st, float* g, float* beta, const T* a, const T* b, const T* a_log,
                           const T* dt_bias, int rows, int heads) {
  const size_t n = size_t(rows) * heads;
  if (!n) return;
  DFLASH_LAUNCH(grid_for(n), kThreads, 0, st, deltanet_gates_kernel<T>)(g, beta, a, b, a_log, dt_bias, rows, heads);
}

template <typename T>
void launch_gated_delta_rule_per_token(cudaStream_t st, T* out, const T* q, const T* k, const T* v, const float* g,
                                       const float* beta, float* state, int S, int k_heads, int v_heads, int dk,
                                       int dv) {
  if (v_heads <= 0 || dv <= 0) return;
  const dim3 grid(unsigned(v_heads), unsigned((dv + kWarp - 1) / kWarp));
  const int threads = cm::kDeltaRowGroups * kWarp;
  switch (cm::delta_slice_rows(dk)) {
    case 8:
      DFLASH_LAUNCH(grid, threads, 0, st, delta_rule_kernel<T, 8>)(out, q, k, v, g, beta, state, S, k_heads, v_heads, dk, dv);
      break;
    case 16:
      DFLASH_LAUNCH(grid, threads, 0, st, delta_rule_kernel<T, 16>)(out, q, k, v, g, beta, state, S, k_heads, v_heads, dk, dv);
      break;
    case 32:
      DFLASH_LAUNCH(grid, threads, 0, st, delta_rule_kernel<T, 32>)(out, q, k, v, g, beta, state, S, k_heads, v_heads, dk, dv);
      break;
    default:
      DFLASH_LAUNCH(grid, threads, 0, st, delta_rule_kernel<T, 64>)(out, q, k, v, g, beta, state, S, k_heads, v_heads, dk, dv);
  }
}

// bf16 goes to the chunk-parallel tensor-core kernels (deltanet_chunked.cu) where they take the call (dk 64 or 128,
// dv a multiple of 64, S ≥ 2: kernels/delta_rule_chunks.h); fp32, decode steps and the other shapes to the per-token
// kernel above.
template <typename T>
void launch_gated_delta_rule(cudaStream_t st, T* out, const T* q, const T* k, const T* v, const float* g,
                             const float* beta, float* state, int S, int k_heads, int v_heads, int dk, int dv,
                             void* scratch) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (delta_rule_chunked_takes(S, k_heads, v_heads, dk, dv)) {
      launch_gated_delta_rule_chunked(st, out, q, k, v, g, beta, state, S, k_heads, v_heads, dk, dv, scratch);
      return;
    }
  }
  launch_gated_delta_rule_per_token(st, out, q, k, v, g, beta, state, S, k_heads, v_heads, dk, dv);
}

#define DFLASH_INSTANTIATE(T)                                                                                        \
  template void launch_gated_delta_rule_per_token<T>(cudaStream_t, T*, const T*, const T*, const T*, const float*,   \
                                                     const float*, float*, int, int, int, int, int);                 \
  template void launch_causal_conv1d_silu<T>(cudaStream_t, T*, const T*, const T*, T*, int, int, int);               \
  template void launch_l2norm<T>(cudaStream_t, T*, int, int, float, float);                                          \
  template void launch_gated_rmsnorm<T>(cudaStream_t, T*, const T*, const T*, const T*, int, int, float);            \
  template void launch_deltanet_gates<T>(cudaStream_t, float*, float*, const T*, const T*, const T*, const T*, int,  \
                                         int);                                                                       \
  template void launch_gated_delta_rule<T>(cudaStream_t, T*, const T*, const T*, const T*, const float*,             \
                                           const float*, float*, int, int, int, int, int, void*);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(bf16)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::kernels::cuda
