// RMSNorm forward/backward, RoPE forward/backward (rotate-half) and partial RoPE forward, the formulas in
// kernels/math/norm.h (the copy the CPU kernels call).
// RMSNorm: one block per row (a fixed-tree Σ x²) for wide rows; for rows of at most kWarpRowDim (the per-head q/k
// norms, small hidden sizes) one warp per row, 8 rows a block, the Σ in a fixed xor-shuffle tree: a 256-thread block
// on a 128-wide row leaves half its threads idle at every barrier. dw without atomics: per-chunk column partials,
// then a fixed sum over chunks (deterministic). RoPE: one thread per (row, pair), cos/sin from the backend's table
// (RopeTable: computed once, in double as on the CPU) or, past its positions, evaluated in double.
// Fused per-head RMSNorm + RoPE (the q/k norms of attention): one warp per few (row, head) items, the head in
// registers, one read and one write of it (below).
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/math/norm.h"

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
  const float s = math::rmsnorm_rstd(block_merge(ss).v, dim, eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
  // y may alias x: every element is read above (the merge's barriers) and then read and written by one thread.
  for (int i = threadIdx.x; i < dim; i += kThreads) y[base + i] = from_f<T>(math::rmsnorm_y(to_f(x[base + i]), s, to_f(w[i])));
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
  const float s = math::rmsnorm_rstd(warp_sum(ss), dim, eps);
  if (lane == 0) rstd[row] = s;
  // y may alias x: each element is read and written by one lane, after the row's Σ
  for (int i = lane; i < dim; i += kWarp) y[base + i] = from_f<T>(math::rmsnorm_y(to_f(x[base + i]), s, to_f(w[i])));
}

template <typename T>
__global__ void rmsnorm_dx_warp_kernel(T* dx, const T* dy, const T* x, const T* w, const float* rstd, int rows,
                                       int dim) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const size_t base = size_t(row) * dim;
  const float s = rstd[row];
  float dot = 0;
  for (int i = lane; i < dim; i += kWarp) dot += math::rmsnorm_gn(to_f(dy[base + i]), to_f(w[i]), to_f(x[base + i]), s);
  const float mean_gn = warp_sum(dot) / float(dim);
  for (int i = lane; i < dim; i += kWarp)
    dx[base + i] = from_f<T>(to_f(dx[base + i]) +
                             math::rmsnorm_dx(to_f(dy[base + i]), to_f(w[i]), to_f(x[base + i]), s, mean_gn));
}

template <typename T>
__global__ void rmsnorm_dx_kernel(T* dx, const T* dy, const T* x, const T* w, const float* rstd, int dim) {
  const size_t base = size_t(blockIdx.x) * dim;
  const float s = rstd[blockIdx.x];
  SumF dot;
  for (int i = threadIdx.x; i < dim; i += kThreads)
    dot.v += math::rmsnorm_gn(to_f(dy[base + i]), to_f(w[i]), to_f(x[base + i]), s);
  const float mean_gn = block_merge(dot).v / float(dim);
  for (int i = threadIdx.x; i < dim; i += kThreads)
    dx[base + i] = from_f<T>(to_f(dx[base + i]) +
                             math::rmsnorm_dx(to_f(dy[base + i]), to_f(w[i]), to_f(x[base + i]), s, mean_gn));
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
    acc += math::rmsnorm_dw_term(to_f(dy[size_t(r) * dim + i]), to_f(x[size_t(r) * dim + i]), rstd[r]);
  partials[size_t(blockIdx.y) * dim + i] = acc;
}

__global__ void rmsnorm_dw_final_kernel(float* dw, const float* partials, int chunks, int dim) {
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= dim) return;
  float acc = 0;
  for (int c = 0; c < chunks; ++c) acc += partials[size_t(c) * dim + i];
  dw[i] += acc;
}

// The cos/sin table (RopeTable, launch.h): one thread per (position, pair), the angle in double as on the CPU.
__global__ void rope_table_kernel(float* cs, int positions, int rot_dim, double theta) {
  const int half = rot_dim / 2;
  const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (idx >= size_t(positions) * half) return;
  math::rope_cos_sin(int(idx / half), int(idx % half), rot_dim, theta, cs[2 * idx], cs[2 * idx + 1]);
}

// cos/sin of pair i (of rot_dim/2) at position p: from the table where it holds p (one 8-byte load instead of a
// double pow, cos and sin: slow on GPUs with little fp64), else evaluated; the same bits either way.
__device__ inline void rope_cos_sin_at(const RopeTable& table, int p, int i, int rot_dim, double theta, float& c,
                                       float& s) {
  if (p >= 0 && p < table.positions) {
    const float* e = table.cs + 2 * (size_t(p) * (rot_dim / 2) + i);
    c = e[0];
    s = e[1];
  } else {
    math::rope_cos_sin(p, i, rot_dim, theta, c, s);
  }
}

// One thread per (row, i < ⌈rot_dim/2⌉): for i < rot_dim/2 the pair (i, i + rot_dim/2) of every head at that row's
// position, angle pos · θ^(−2i/rot_dim); for an odd rot_dim, thread i = rot_dim/2 passes the last rotated dim
// (2·(rot_dim/2)) through unrotated, as the CPU does (its adjoint is the identity: backward accumulates it).
// rot_dim = head_dim is plain RoPE; the dims past rot_dim are not touched here.
template <typename T>
__global__ void rope_kernel(T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim, int rot_dim,
                            double theta, bool backward, RopeTable table) {
  const int half = rot_dim / 2, per_row = (rot_dim + 1) / 2;
  const size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (idx >= size_t(rows) * per_row) return;
  const int r = int(idx / per_row), i = int(idx % per_row);
  if (i == half) {  // odd rot_dim: the unpaired dim
    for (int h = 0; h < heads; ++h) {
      const size_t o = (size_t(r) * heads + h) * head_dim + 2 * half;
      y[o] = backward ? from_f<T>(to_f(y[o]) + to_f(x[o])) : x[o];
    }
    return;
  }
  float c, s;
  rope_cos_sin_at(table, pos[r], i, rot_dim, theta, c, s);
  if (backward) s = -s;  // Rᵀ = rotation by −angle
  for (int h = 0; h < heads; ++h) {
    const size_t base = (size_t(r) * heads + h) * head_dim;
    float ya, yb;
    math::rope_rotate(to_f(x[base + i]), to_f(x[base + i + half]), c, s, ya, yb);
    if (backward) {
      y[base + i] = from_f<T>(to_f(y[base + i]) + ya);
      y[base + i + half] = from_f<T>(to_f(y[base + i + half]) + yb);
    } else {
      y[base + i] = from_f<T>(ya);
      y[base + i + half] = from_f<T>(yb);
    }
  }
}

// ---- fused per-head RMSNorm + RoPE ----
// One warp per run of consecutive (row, head) items: lane l holds the pairs (i, i + D/2) for i = l + 32k < D/2,
// so the rotation never leaves its registers, and each lane takes the cos/sin of its pairs once per row (not per
// head), from the backend's table (an evaluation in double past its positions). Lane l sums its lower elements, then
// its upper ones: for D a multiple of 64 that is the order l, l + 32, … of the warp RMSNorm kernel above, so the
// Σ x² (and rstd) are the two-op path's bits.
constexpr int kPairsPerLane = kMaxNormRopeHeadDim / 2 / kWarp;
constexpr int kNormRopeMaxChunks = 4096;  // dw partial rows at most (4 MiB at D = 256)
constexpr int kNormRopeHeadsPerWarp = 8;   // a warp's items without dw: up to 8 heads of one row

// cos/sin of the lane's pairs at position p; (1, 0) past the pairs.
__device__ void lane_cos_sin(const RopeTable& table, int p, int lane, int half, int head_dim, double theta,
                             float (&c)[kPairsPerLane], float (&s)[kPairsPerLane]) {
#pragma unroll
  for (int k = 0; k < kPairsPerLane; ++k) {
    const int i = lane + k * kWarp;
    c[k] = 1.0f;
    s[k] = 0.0f;
    if (i < half) rope_cos_sin_at(table, p, i, head_dim, theta, c[k], s[k]);
  }
}

// y (=) rope(rmsnorm(x)) for items [warp·per_warp, +per_warp); rstd[item] (=). y may alias x: a lane writes only
// the elements it read, after the warp's Σ.
template <typename T>
__global__ void head_norm_rope_forward_kernel(T* y, float* rstd, const T* x, const T* w, const int32_t* pos,
                                              int items, int heads, int head_dim, int per_warp, float eps,
                                              double theta, RopeTable table) {
  const int warp = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int first = warp * per_warp;
  if (first >= items) return;  // whole warps: no block barriers below
  const int last = first + per_warp < items ? first + per_warp : items;
  const int half = head_dim / 2;
  float wa[kPairsPerLane], wb[kPairsPerLane], c[kPairsPerLane], s[kPairsPerLane];
#pragma unroll
  for (int k = 0; k < kPairsPerLane; ++k) {
    const int i = lane + k * kWarp;
    wa[k] = i < half ? to_f(w[i]) : 0.0f;
    wb[k] = i < half ? to_f(w[half + i]) : 0.0f;
  }
  int row = -1;
  for (int item = first; item < last; ++item) {
    if (item / heads != row) {  // warp-uniform
      row = item / heads;
      lane_cos_sin(table, pos[row], lane, half, head_dim, theta, c, s);
    }
    const size_t base = size_t(item) * head_dim;
    float a[kPairsPerLane], b[kPairsPerLane];
    float ss = 0;
#pragma unroll
    for (int k = 0; k < kPairsPerLane; ++k) {
      const int i = lane + k * kWarp;
      a[k] = i < half ? to_f(x[base + i]) : 0.0f;
      ss += a[k] * a[k];
    }
#pragma unroll
    for (int k = 0; k < kPairsPerLane; ++k) {
      const int i = lane + k * kWarp;
      b[k] = i < half ? to_f(x[base + half + i]) : 0.0f;
      ss += b[k] * b[k];
    }
    const float sr = math::rmsnorm_rstd(warp_sum(ss), head_dim, eps);
    if (lane == 0) rstd[item] = sr;
#pragma unroll
    for (int k = 0; k < kPairsPerLane; ++k) {
      const int i = lane + k * kWarp;
      if (i >= half) continue;
      float ya, yb;
      math::rope_rotate(math::rmsnorm_y(a[k], sr, wa[k]), math::rmsnorm_y(b[k], sr, wb[k]), c[k], s[k],
                             ya, yb);
      y[base + i] = from_f<T>(ya);  // one rounding to T: the normed value stays in float
      y[base + half + i] = from_f<T>(yb);
    }
  }
}

// dx (+=) rmsnorm_backward(Rᵀ dy) for the warp's items; partials[warp, :] (=) the warp's Σ of dw terms, items in
// order (when partials is non-null).
template <typename T>
__global__ void head_norm_rope_backward_kernel(T* dx, float* partials, const T* dy, const T* x, const T* w,
                                               const float* rstd, const int32_t* pos, int items, int heads,
                                               int head_dim, int per_warp, double theta, RopeTable table) {
  const int warp = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int first = warp * per_warp;
  if (first >= items) return;
  const int last = first + per_warp < items ? first + per_warp : items;
  const int half = head_dim / 2;
  float wa[kPairsPerLane], wb[kPairsPerLane], c[kPairsPerLane], s[kPairsPerLane];
  float dwa[kPairsPerLane], dwb[kPairsPerLane];
#pragma unroll
  for (int k = 0; k < kPairsPerLane; ++k) {
    const int i = lane + k * kWarp;
    wa[k] = i < half ? to_f(w[i]) : 0.0f;
    wb[k] = i < half ? to_f(w[half + i]) : 0.0f;
    dwa[k] = dwb[k] = 0.0f;
  }
  int row = -1;
  for (int item = first; item < last; ++item) {
    if (item / heads != row) {
      row = item / heads;
      lane_cos_sin(table, pos[row], lane, half, head_dim, theta, c, s);
    }
    const size_t base = size_t(item) * head_dim;
    const float sr = rstd[item];
    float ga[kPairsPerLane], gb[kPairsPerLane], xa[kPairsPerLane], xb[kPairsPerLane];
#pragma unroll
    for (int k = 0; k < kPairsPerLane; ++k) {
      const int i = lane + k * kWarp;
      ga[k] = gb[k] = xa[k] = xb[k] = 0.0f;
      if (i >= half) continue;
      // Rᵀ = rotation by −angle
      math::rope_rotate(to_f(dy[base + i]), to_f(dy[base + half + i]), c[k], -s[k], ga[k], gb[k]);
      xa[k] = to_f(x[base + i]);
      xb[k] = to_f(x[base + half + i]);
    }
    float dot = 0;  // lower elements, then upper: the warp RMSNorm kernel's order for D a multiple of 64
#pragma unroll
    for (int k = 0; k < kPairsPerLane; ++k) dot += math::rmsnorm_gn(ga[k], wa[k], xa[k], sr);
#pragma unroll
    for (int k = 0; k < kPairsPerLane; ++k) dot += math::rmsnorm_gn(gb[k], wb[k], xb[k], sr);
    const float mean_gn = warp_sum(dot) / float(head_dim);
#pragma unroll
    for (int k = 0; k < kPairsPerLane; ++k) {
      const int i = lane + k * kWarp;
      if (i >= half) continue;
      dx[base + i] = from_f<T>(to_f(dx[base + i]) + math::rmsnorm_dx(ga[k], wa[k], xa[k], sr, mean_gn));
      dx[base + half + i] =
          from_f<T>(to_f(dx[base + half + i]) + math::rmsnorm_dx(gb[k], wb[k], xb[k], sr, mean_gn));
      dwa[k] += math::rmsnorm_dw_term(ga[k], xa[k], sr);
      dwb[k] += math::rmsnorm_dw_term(gb[k], xb[k], sr);
    }
  }
  if (!partials) return;
#pragma unroll
  for (int k = 0; k < kPairsPerLane; ++k) {
    const int i = lane + k * kWarp;
    if (i >= half) continue;
    partials[size_t(warp) * head_dim + i] = dwa[k];
    partials[size_t(warp) * head_dim + half + i] = dwb[k];
  }
}

// Items a warp takes: up to 8 heads of a row (so the cos/sin are shared), more when dw needs its partial rows
// capped at kNormRopeMaxChunks.
int norm_rope_items_per_warp(int rows, int heads, bool dw) {
  const long long items = (long long)rows * heads;
  long long per = heads < kNormRopeHeadsPerWarp ? heads : kNormRopeHeadsPerWarp;
  if (per < 1) per = 1;
  if (dw && (items + per - 1) / per > kNormRopeMaxChunks) per = (items + kNormRopeMaxChunks - 1) / kNormRopeMaxChunks;
  return int(per);
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

void launch_rope_table(cudaStream_t st, float* cs, int positions, int rot_dim, double theta) {
  const size_t n = size_t(positions) * (rot_dim / 2);
  if (!n) return;
  DFLASH_LAUNCH(unsigned((n + kThreads - 1) / kThreads), kThreads, 0, st, rope_table_kernel)(cs, positions, rot_dim,
                                                                                           theta);
}

template <typename T>
void launch_rope(cudaStream_t st, T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim,
                 double theta, bool backward, RopeTable table) {
  const size_t n = size_t(rows) * ((head_dim + 1) / 2);
  if (!n) return;
  DFLASH_LAUNCH(unsigned((n + kThreads - 1) / kThreads), kThreads, 0, st, rope_kernel<T>)(y, x, pos, rows, heads, head_dim,
                                                                               head_dim, theta, backward, table);
}

template <typename T>
void launch_rope_partial(cudaStream_t st, T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim,
                         int rot_dim, double theta, RopeTable table) {
  const size_t n = size_t(rows) * ((rot_dim + 1) / 2);
  if (n) {
    DFLASH_LAUNCH(unsigned((n + kThreads - 1) / kThreads), kThreads, 0, st, rope_kernel<T>)(y, x, pos, rows, heads, head_dim,
                                                                                 rot_dim, theta, false, table);
  }
  const size_t head_rows = size_t(rows) * heads;
  if (y == x || rot_dim >= head_dim || head_rows == 0) return;
  DFLASH_LAUNCH(grid_for(head_rows * (head_dim - rot_dim)), kThreads, 0, st, copy_unrotated_kernel<T>)(y, x, head_rows,
                                                                                          head_dim, rot_dim);
}

int head_norm_rope_dw_chunks(int rows, int heads) {
  const long long items = (long long)rows * heads, per = norm_rope_items_per_warp(rows, heads, true);
  return items > 0 ? int((items + per - 1) / per) : 1;
}

template <typename T>
void launch_head_norm_rope_forward(cudaStream_t st, T* y, float* rstd, const T* x, const T* w, const int32_t* pos,
                                   int rows, int heads, int head_dim, float eps, double theta, RopeTable table) {
  const int items = rows * heads;
  if (items <= 0 || head_dim <= 0) return;
  const int per = norm_rope_items_per_warp(rows, heads, false), warps = (items + per - 1) / per;
  DFLASH_LAUNCH((warps + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, st, head_norm_rope_forward_kernel<T>)(
      y, rstd, x, w, pos, items, heads, head_dim, per, eps, theta, table);
}

template <typename T>
void launch_head_norm_rope_backward(cudaStream_t st, T* dx, float* dw, const T* dy, const T* x, const T* w,
                                    const float* rstd, const int32_t* pos, int rows, int heads, int head_dim,
                                    double theta, float* partials, RopeTable table) {
  const int items = rows * heads;
  if (items <= 0 || head_dim <= 0) return;
  const int per = norm_rope_items_per_warp(rows, heads, dw != nullptr), warps = (items + per - 1) / per;
  DFLASH_LAUNCH((warps + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, st, head_norm_rope_backward_kernel<T>)(
      dx, dw ? partials : nullptr, dy, x, w, rstd, pos, items, heads, head_dim, per, theta, table);
  if (!dw) return;
  // the warps' partial rows summed in warp order: deterministic, no atomics
  DFLASH_LAUNCH(unsigned((head_dim + kThreads - 1) / kThreads), kThreads, 0, st, rmsnorm_dw_final_kernel)(
      dw, partials, warps, head_dim);
}

#define DFLASH_INSTANTIATE(T)                                                                                  \
  template void launch_head_norm_rope_forward<T>(cudaStream_t, T*, float*, const T*, const T*, const int32_t*, \
                                                 int, int, int, float, double, RopeTable);                     \
  template void launch_head_norm_rope_backward<T>(cudaStream_t, T*, float*, const T*, const T*, const T*,      \
                                                  const float*, const int32_t*, int, int, int, double, float*, \
                                                  RopeTable);                                                  \
  template void launch_rmsnorm_forward<T>(cudaStream_t, T*, float*, const T*, const T*, int, int, float);      \
  template void launch_rmsnorm_backward<T>(cudaStream_t, T*, float*, const T*, const T*, const T*, const float*, \
                                           int, int, float*);                                                  \
  template void launch_rope<T>(cudaStream_t, T*, const T*, const int32_t*, int, int, int, double, bool,      \
                               RopeTable);                                                                   \
  template void launch_rope_partial<T>(cudaStream_t, T*, const T*, const int32_t*, int, int, int, int, double, \
                                       RopeTable);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(bf16)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::kernels::cuda
