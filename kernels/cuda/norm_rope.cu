// RMSNorm forward/backward, RoPE forward/backward (rotate-half) and partial RoPE forward, math in cuda_math
// (norm_math.h).
// RMSNorm: one block per row (a fixed-tree Σ x²) for wide rows; for rows of at most kWarpRowDim (the per-head q/k
// norms, small hidden sizes) one warp per row, 8 rows a block, the Σ in a fixed xor-shuffle tree: a 256-thread block
// on a 128-wide row leaves half its threads idle at every barrier. dw without atomics: per-chunk column partials,
// then a fixed sum over chunks (deterministic). RoPE: one thread per (row, pair), angles in double as on the CPU.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/norm_math.h"

namespace dflash::kernels::cuda {

namespace {

template <typename T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* w, int dim, float eps) {
  const size_t base = size_t(blockIdx.x) * dim;
  SumF ss;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    const float xi = to_f(x[base + i]);
    ss.v += xi * xi;
  }
  const float s = cuda_math::rmsnorm_rstd(block_merge(ss).v, dim, eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
  // y may alias x: every element is read above (the merge's barriers) and then read and written by one thread.
  for (int i = threadIdx.x; i < dim; i += kThreads) y[base + i] = from_f<T>(cuda_math::rmsnorm_y(to_f(x[base + i]), s, to_f(w[i])));
}

constexpr int kWarpRowDim = 512;                    // rows up to this width: one warp each
constexpr int kRowsPerBlock = kThreads / kWarp;     // 8 warps, 8 rows

// One warp per row: lane-strided Σ x², then a fixed xor tree (every lane gets the same sum).
template <typename T>
__global__ void rmsnorm_forward_warp_kernel(T* y, float* rstd, const T* x, const T* w, int rows, int dim, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;  // whole warps: no block barriers below
  const size_t base = size_t(row) * dim;
  float ss = 0;
  for (int i = lane; i < dim; i += kWarp) {
    const float xi = to_f(x[base + i]);
    ss += xi * xi;
  }
  const float s = cuda_math::rmsnorm_rstd(warp_sum(ss), dim, eps);
  if (lane == 0) rstd[row] = s;
  // y may alias x: each element is read and written by one lane, after the row's Σ
  for (int i = lane; i < dim; i += kWarp) y[base + i] = from_f<T>(cuda_math::rmsnorm_y(to_f(x[base + i]), s, to_f(w[i])));
}

template <typename T>
__global__ void rmsnorm_dx_warp_kernel(T* dx, const T* dy, const T* x, const T* w, const float* rstd, int rows,
                                       int dim) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const size_t base = size_t(row) * dim;
  const float s = rstd[row];
  float dot = 0;
  for (int i = lane; i < dim; i += kWarp) dot += cuda_math::rmsnorm_gn(to_f(dy[base + i]), to_f(w[i]), to_f(x[base + i]), s);
  const float mean_gn = warp_sum(dot) / float(dim);
  for (int i = lane; i < dim; i += kWarp)
    dx[base + i] = from_f<T>(to_f(dx[base + i]) +
                             cuda_math::rmsnorm_dx(to_f(dy[base + i]), to_f(w[i]), to_f(x[base + i]), s, mean_gn));
}

template <typename T>
__global__ void rmsnorm_dx_kernel(T* dx, const T* dy, const T* x, const T* w, const float* rstd, int dim) {
  const size_t base = size_t(blockIdx.x) * dim;
  const float s = rstd[blockIdx.x];
  SumF dot;
  for (int i = threadIdx.x; i < dim; i += kThreads)
    dot.v += cuda_math::rmsnorm_gn(to_f(dy[base + i]), to_f(w[i]), to_f(x[base + i]), s);
  const float mean_gn = block_merge(dot).v / float(dim);
  for (int i = threadIdx.x; i < dim; i += kThreads)
    dx[base + i] = from_f<T>(to_f(dx[base + i]) +
                             cuda_math::rmsnorm_dx(to_f(dy[base + i]), to_f(w[i]), to_f(x[base + i]), s, mean_gn));
}

// partials[c, i] = Σ_{r in chunk c} dy[r, i] x[r, i] rstd[r], rows in order. grid (column tiles, chunks).
template <typename T>
__global__ void rmsnorm_dw_partial_kernel(float* partials, const T* dy, const T* x, const float* rstd, int rows,
                                          int dim, int chunk_rows) {
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= dim) return;
  const int r0 = blockIdx.y * chunk_rows;
  const int r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float acc = 0;
  for (int r = r0; r < r1; ++r)
    acc += cuda_math::rmsnorm_dw_term(to_f(dy[size_t(r) * dim + i]), to_f(x[size_t(r) * dim + i]), rstd[r]);
  partials[size_t(blockIdx.y) * dim + i] = acc;
}

__global__ void rmsnorm_dw_final_kernel(float* dw, const float* partials, int chunks, int dim) {
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= dim) return;
  float acc = 0;
  for (int c = 0; c < chunks; ++c) acc += partials[size_t(c) * dim + i];
  dw[i] += acc;
}

// One thread per (row, i < rot_dim/2): the pair (i, i + rot_dim/2) of every head at that row's position, angle
// pos · θ^(−2i/rot_dim). rot_dim = head_dim is plain RoPE; the dims past rot_dim are not touched here.
template <typename T>
__global__ void rope_kernel(T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim, int rot_dim,
                            double theta, bool backward) {
  const int half = rot_dim / 2;
  const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (idx >= size_t(rows) * half) return;
  const int r = int(idx / half), i = int(idx % half);
  float c, s;
  cuda_math::rope_cos_sin(pos[r], i, rot_dim, theta, c, s);
  if (backward) s = -s;  // Rᵀ = rotation by −angle
  for (int h = 0; h < heads; ++h) {
    const size_t base = (size_t(r) * heads + h) * head_dim;
    float ya, yb;
    cuda_math::rope_rotate(to_f(x[base + i]), to_f(x[base + i + half]), c, s, ya, yb);
    if (backward) {
      y[base + i] = from_f<T>(to_f(y[base + i]) + ya);
      y[base + i + half] = from_f<T>(to_f(y[base + i + half]) + yb);
    } else {
      y[base + i] = from_f<T>(ya);
      y[base + i + half] = from_f<T>(yb);
    }
  }
}

// Partial RoPE out of place: y[·, rot_dim:] = x[·, rot_dim:] (the dims that do not rotate). Grid-stride over
// rows·heads·(head_dim − rot_dim).
template <typename T>
__global__ void copy_unrotated_kernel(T* y, const T* x, size_t head_rows, int head_dim, int rot_dim) {
  const int pass = head_dim - rot_dim;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < head_rows * pass;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t o = (idx / pass) * head_dim + rot_dim + idx % pass;
    y[o] = x[o];
  }
}

}  // namespace

template <typename T>
void launch_rmsnorm_forward(cudaStream_t st, T* y, float* rstd, const T* x, const T* w, int rows, int dim, float eps) {
  if (rows <= 0) return;
  if (dim <= kWarpRowDim) {
    DFLASH_LAUNCH((rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, st, rmsnorm_forward_warp_kernel<T>)(
        y, rstd, x, w, rows, dim, eps);
    return;
  }
  DFLASH_LAUNCH(rows, kThreads, 0, st, rmsnorm_forward_kernel<T>)(y, rstd, x, w, dim, eps);
}

int rmsnorm_dw_chunks(int rows) { return rows < 64 ? (rows > 0 ? rows : 1) : 64; }

template <typename T>
void launch_rmsnorm_backward(cudaStream_t st, T* dx, float* dw, const T* dy, const T* x, const T* w,
                             const float* rstd, int rows, int dim, float* partials) {
  if (rows <= 0 || dim <= 0) return;
  if (dim <= kWarpRowDim)
    DFLASH_LAUNCH((rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, st, rmsnorm_dx_warp_kernel<T>)(
        dx, dy, x, w, rstd, rows, dim);
  else
    DFLASH_LAUNCH(rows, kThreads, 0, st, rmsnorm_dx_kernel<T>)(dx, dy, x, w, rstd, dim);
  if (!dw) return;
  const int chunks = rmsnorm_dw_chunks(rows), chunk_rows = (rows + chunks - 1) / chunks;
  const unsigned col_tiles = unsigned((dim + kThreads - 1) / kThreads);
  DFLASH_LAUNCH(dim3(col_tiles, chunks), kThreads, 0, st, rmsnorm_dw_partial_kernel<T>)(partials, dy, x, rstd, rows, dim, chunk_rows);
  DFLASH_LAUNCH(col_tiles, kThreads, 0, st, rmsnorm_dw_final_kernel)(dw, partials, chunks, dim);
}

template <typename T>
void launch_rope(cudaStream_t st, T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim,
                 double theta, bool backward) {
  const size_t n = size_t(rows) * (head_dim / 2);
  if (!n) return;
  DFLASH_LAUNCH(unsigned((n + kThreads - 1) / kThreads), kThreads, 0, st, rope_kernel<T>)(y, x, pos, rows, heads, head_dim,
                                                                               head_dim, theta, backward);
}

template <typename T>
void launch_rope_partial(cudaStream_t st, T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim,
                         int rot_dim, double theta) {
  const size_t n = size_t(rows) * (rot_dim / 2);
  if (n) {
    DFLASH_LAUNCH(unsigned((n + kThreads - 1) / kThreads), kThreads, 0, st, rope_kernel<T>)(y, x, pos, rows, heads, head_dim,
                                                                                 rot_dim, theta, false);
  }
  const size_t head_rows = size_t(rows) * heads;
  if (y == x || rot_dim >= head_dim || head_rows == 0) return;
  DFLASH_LAUNCH(grid_for(head_rows * (head_dim - rot_dim)), kThreads, 0, st, copy_unrotated_kernel<T>)(y, x, head_rows,
                                                                                          head_dim, rot_dim);
}

#define DFLASH_INSTANTIATE(T)                                                                                  \
  template void launch_rmsnorm_forward<T>(cudaStream_t, T*, float*, const T*, const T*, int, int, float);      \
  template void launch_rmsnorm_backward<T>(cudaStream_t, T*, float*, const T*, const T*, const T*, const float*, \
                                           int, int, float*);                                                  \
  template void launch_rope<T>(cudaStream_t, T*, const T*, const int32_t*, int, int, int, double, bool);     \
  template void launch_rope_partial<T>(cudaStream_t, T*, const T*, const int32_t*, int, int, int, int, double);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(bf16)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::kernels::cuda
