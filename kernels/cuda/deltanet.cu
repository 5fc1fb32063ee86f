// Gated DeltaNet's kernels (forward only, the frozen target); math in cuda_math (target_math.h). Unverified on GPU; simple over fast:
//   conv1d + SiLU   one thread per output element (t, c), its K taps in order; then one thread per channel moves
//                   the carried tail (rows in increasing order: each reads a row ahead of the ones it writes).
//   l2norm, gated RMSNorm   one block per row, a fixed-tree Σx² (deterministic), as rmsnorm_forward.
//   gates           one thread per (token, value head).
//   delta rule      the per-token recurrence, sequential over S: one warp per (value head, 32 state columns),
//                   the [dk, 32] slice of the state in shared memory (32 KiB at dk 256), lane d owning column d;
//                   each token reads k_t and q_t once into shared memory and makes two passes over the column.
//                   Cost: S steps of ~2·dk dependent shared-memory multiply-adds per lane, on only
//                   v_heads · ⌈dv/32⌉ warps (48 at 12 value heads of dv 128): latency-bound and far below the
//                   GPU's throughput. The chunked form of kernels/cpu/gated_deltanet.cpp (GEMMs per chunk of 64
//                   tokens) is the known next step.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/target_math.h"

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
      acc = cm::conv_tap(acc, to_f(w[size_t(c) * K + j]), xv);
    }
    y[idx] = from_f<T>(cm::siluf(acc));
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
  const float f = cm::l2norm_factor(block_merge(ss).v, eps, scale);
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
  const float rstd = cm::rmsnorm_rstd(block_merge(ss).v, dim, eps);
  // y may alias x: every x is read above (before the merge's barriers), then read and written by one thread
  for (int i = threadIdx.x; i < dim; i += kThreads)
    y[base + i] = from_f<T>(cm::gated_rmsnorm_y(to_f(x[base + i]), rstd, to_f(w[i]), to_f(z[base + i])));
}

template <typename T>
__global__ void deltanet_gates_kernel(float* g, float* beta, const T* a, const T* b, const T* a_log, const T* dt_bias,
                                      int rows, int heads) {
  const size_t n = size_t(rows) * heads;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int j = int(i % heads);
    beta[i] = cm::deltanet_beta(to_f(b[i]));
    g[i] = cm::deltanet_g(to_f(a[i]), to_f(dt_bias[j]), to_f(a_log[j]));
  }
}

// grid (v_heads, ⌈dv/32⌉), one warp: value head h, state columns blockIdx.y·32 + lane.
template <typename T>
__global__ void delta_rule_kernel(T* out, const T* q, const T* k, const T* v, const float* g, const float* beta,
                                  float* state, int S, int KH, int VH, int dk, int dv) {
  __shared__ float m_s[kMaxDeltaKeyDim * kWarp];  // [dk, 32]: column lane at m_s[i·32 + lane]
  __shared__ float k_s[kMaxDeltaKeyDim], q_s[kMaxDeltaKeyDim];
  const int h = blockIdx.x, lane = threadIdx.x, d = blockIdx.y * kWarp + lane, kh = h / (VH / KH);
  const bool active = d < dv;
  float* col = m_s + lane;
  for (int i = 0; i < dk; ++i) col[i * kWarp] = state && active ? state[(size_t(h) * dk + i) * dv + d] : 0.0f;
  for (int t = 0; t < S; ++t) {
    __syncwarp();  // every lane is done with the previous token's k_s, q_s
    const size_t kq = (size_t(t) * KH + kh) * dk;
    for (int i = lane; i < dk; i += kWarp) {
      k_s[i] = to_f(k[kq + i]);
      q_s[i] = to_f(q[kq + i]);
    }
    __syncwarp();
    const size_t th = size_t(t) * VH + h;
    if (active) {
      const float o = cm::delta_rule_step(col, kWarp, k_s, q_s, dk, to_f(v[th * dv + d]), g[th], beta[th]);
      out[th * dv + d] = from_f<T>(o);
    }
  }
  if (state && active)
    for (int i = 0; i < dk; ++i) state[(size_t(h) * dk + i) * dv + d] = col[i * kWarp];
}

}  // namespace

template <typename T>
void launch_causal_conv1d_silu(cudaStream_t st, T* y, const T* x, const T* w, T* tail, int S, int C, int K) {
  const size_t n = size_t(S) * C;
  if (n) {
    conv1d_silu_kernel<T><<<grid_for(n), kThreads, 0, st>>>(y, x, w, tail, S, C, K);
    DFLASH_CUDA_LAUNCHED("conv1d_silu_kernel");
  }
  if (tail && C > 0 && K > 1) {  // after the conv, which reads the old tail (same stream: ordered)
    conv_tail_kernel<T><<<unsigned((C + kThreads - 1) / kThreads), kThreads, 0, st>>>(tail, x, S, C, K);
    DFLASH_CUDA_LAUNCHED("conv_tail_kernel");
  }
}

template <typename T>
void launch_l2norm(cudaStream_t st, T* x, int rows, int dim, float eps, float scale) {
  if (rows <= 0 || dim <= 0) return;
  l2norm_kernel<T><<<rows, kThreads, 0, st>>>(x, dim, eps, scale);
  DFLASH_CUDA_LAUNCHED("l2norm_kernel");
}

template <typename T>
void launch_gated_rmsnorm(cudaStream_t st, T* y, const T* x, const T* z, const T* w, int rows, int dim, float eps) {
  if (rows <= 0 || dim <= 0) return;
  gated_rmsnorm_kernel<T><<<rows, kThreads, 0, st>>>(y, x, z, w, dim, eps);
  DFLASH_CUDA_LAUNCHED("gated_rmsnorm_kernel");
}

template <typename T>
void launch_deltanet_gates(cudaStream_t st, float* g, float* beta, const T* a, const T* b, const T* a_log,
                           const T* dt_bias, int rows, int heads) {
  const size_t n = size_t(rows) * heads;
  if (!n) return;
  deltanet_gates_kernel<T><<<grid_for(n), kThreads, 0, st>>>(g, beta, a, b, a_log, dt_bias, rows, heads);
  DFLASH_CUDA_LAUNCHED("deltanet_gates_kernel");
}

template <typename T>
void launch_gated_delta_rule(cudaStream_t st, T* out, const T* q, const T* k, const T* v, const float* g,
                             const float* beta, float* state, int S, int k_heads, int v_heads, int dk, int dv) {
  if (v_heads <= 0 || dv <= 0) return;
  const dim3 grid(unsigned(v_heads), unsigned((dv + kWarp - 1) / kWarp));
  delta_rule_kernel<T><<<grid, kWarp, 0, st>>>(out, q, k, v, g, beta, state, S, k_heads, v_heads, dk, dv);
  DFLASH_CUDA_LAUNCHED("delta_rule_kernel");
}

#define DFLASH_INSTANTIATE(T)                                                                                        \
  template void launch_causal_conv1d_silu<T>(cudaStream_t, T*, const T*, const T*, T*, int, int, int);               \
  template void launch_l2norm<T>(cudaStream_t, T*, int, int, float, float);                                          \
  template void launch_gated_rmsnorm<T>(cudaStream_t, T*, const T*, const T*, const T*, int, int, float);            \
  template void launch_deltanet_gates<T>(cudaStream_t, float*, float*, const T*, const T*, const T*, const T*, int,  \
                                         int);                                                                       \
  template void launch_gated_delta_rule<T>(cudaStream_t, T*, const T*, const T*, const T*, const float*,             \
                                           const float*, float*, int, int, int, int, int);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(bf16)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::kernels::cuda
