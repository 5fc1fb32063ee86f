// Elementwise and row-copy kernels: gather/scatter rows (also the embedding gather), SwiGLU, residual, accumulate,
// scale, the attention's sigmoid output gate, the conversions to T from fp32 and back (contiguous, or a row block
// into strided columns). Grid-stride loops, arithmetic in float. The kernels that stream large arrays (SwiGLU,
// residual, accumulate, scale, the conversions) move 16 bytes a thread per access where the pointers allow
// (pack16.cuh); the row copies and the gate stay scalar.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pack16.cuh"
#include "kernels/math/gates.h"
#include "kernels/math/norm.h"

namespace dflash::kernels::cuda {

namespace {

// One block per row: out[i] = in[rows[i]] (gather) or out[rows[i]] = in[i] (scatter).
template <typename T, bool Scatter>
__global__ void copy_rows_kernel(T* out, const T* in, const int32_t* rows, int dim) {
  const size_t i = blockIdx.x;
  const size_t src = Scatter ? i : size_t(rows[i]);
  const size_t dst = Scatter ? size_t(rows[i]) : i;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) out[dst * dim + d] = in[src * dim + d];
}

// One block per row i: out[rows[i]] += weight[i] · in[i] in fp32, one rounding (rows distinct: one writer per row).
template <typename T>
__global__ void scatter_add_rows_kernel(T* out, const T* in, const int32_t* rows, const float* weight, int dim) {
  const size_t i = blockIdx.x, dst = size_t(rows[i]);
  const float w = weight[i];
  for (int d = threadIdx.x; d < dim; d += blockDim.x)
    out[dst * dim + d] = from_f<T>(to_f(out[dst * dim + d]) + w * to_f(in[i * dim + d]));
}

// One block per row i: x[i] *= weight[i] in fp32.
template <typename T>
__global__ void scale_rows_kernel(T* x, const float* weight, int dim) {
  const size_t i = blockIdx.x;
  const float w = weight[i];
  for (int d = threadIdx.x; d < dim; d += blockDim.x) x[i * dim + d] = from_f<T>(to_f(x[i * dim + d]) * w);
}

__device__ __forceinline__ size_t grid_first() { return blockIdx.x * size_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ size_t grid_stride() { return size_t(gridDim.x) * blockDim.x; }

// The streaming kernels below: packs of W = kPack<T> elements (16 bytes of T) per access when every pointer is
// pack-aligned, then the scalar tail (all of it when one is not); `op` is the one per-element formula of both loops.
// Outputs may alias inputs: a thread reads a pack before it writes the same pack.
template <typename T>
__global__ void swiglu_forward_kernel(T* h, const T* gate, const T* up, size_t n) {
  constexpr int W = kPack<T>;
  auto op = [](T g, T u) { return from_f<T>(math::swiglu(to_f(g), to_f(u))); };
  const size_t packs = pack_aligned<T, W>(h) && pack_aligned<T, W>(gate) && pack_aligned<T, W>(up) ? n / W : 0;
  for (size_t j = grid_first(); j < packs; j += grid_stride()) {
    const Pack<T, W> g = load_pack<W>(gate, j), u = load_pack<W>(up, j);
    Pack<T, W> o;
#pragma unroll
    for (int e = 0; e < W; ++e) o.v[e] = op(g.v[e], u.v[e]);
    store_pack<W>(h, j, o);
  }
  for (size_t i = packs * W + grid_first(); i < n; i += grid_stride()) h[i] = op(gate[i], up[i]);
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dh, const T* gate, const T* up, size_t n) {
  constexpr int W = kPack<T>;
  auto op = [](T dh_, T g, T u, T& dg, T& du) {
    float fg, fu;
    math::swiglu_grad(to_f(dh_), to_f(g), to_f(u), fg, fu);
    dg = from_f<T>(to_f(dg) + fg);
    du = from_f<T>(to_f(du) + fu);
  };
  const bool vec = pack_aligned<T, W>(dgate) && pack_aligned<T, W>(dup) && pack_aligned<T, W>(dh) &&
                   pack_aligned<T, W>(gate) && pack_aligned<T, W>(up);
  const size_t packs = vec ? n / W : 0;
  for (size_t j = grid_first(); j < packs; j += grid_stride()) {
    const Pack<T, W> d = load_pack<W>(dh, j), g = load_pack<W>(gate, j), u = load_pack<W>(up, j);
    Pack<T, W> dg = load_pack<W>(dgate, j), du = load_pack<W>(dup, j);
#pragma unroll
    for (int e = 0; e < W; ++e) op(d.v[e], g.v[e], u.v[e], dg.v[e], du.v[e]);
    store_pack<W>(dgate, j, dg);
    store_pack<W>(dup, j, du);
  }
  for (size_t i = packs * W + grid_first(); i < n; i += grid_stride()) op(dh[i], gate[i], up[i], dgate[i], dup[i]);
}

template <typename T>
__global__ void sigmoid_gate_kernel(T* x, const T* gate, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = from_f<T>(math::sigmoid_gate(to_f(x[i]), to_f(gate[i])));
}

template <typename T>
__global__ void residual_kernel(T* out, const T* a, const T* b, size_t n) {
  constexpr int W = kPack<T>;
  auto op = [](T x, T y) { return from_f<T>(to_f(x) + to_f(y)); };
  const size_t packs = pack_aligned<T, W>(out) && pack_aligned<T, W>(a) && pack_aligned<T, W>(b) ? n / W : 0;
  for (size_t j = grid_first(); j < packs; j += grid_stride()) {
    const Pack<T, W> pa = load_pack<W>(a, j), pb = load_pack<W>(b, j);
    Pack<T, W> o;
#pragma unroll
    for (int e = 0; e < W; ++e) o.v[e] = op(pa.v[e], pb.v[e]);
    store_pack<W>(out, j, o);
  }
  for (size_t i = packs * W + grid_first(); i < n; i += grid_stride()) out[i] = op(a[i], b[i]);
}

template <typename T>
__global__ void accumulate_kernel(T* y, const T* x, size_t n) {
  constexpr int W = kPack<T>;
  auto op = [](T a, T b) { return from_f<T>(to_f(a) + to_f(b)); };
  const size_t packs = pack_aligned<T, W>(y) && pack_aligned<T, W>(x) ? n / W : 0;
  for (size_t j = grid_first(); j < packs; j += grid_stride()) {
    const Pack<T, W> px = load_pack<W>(x, j);
    Pack<T, W> py = load_pack<W>(y, j);
#pragma unroll
    for (int e = 0; e < W; ++e) py.v[e] = op(py.v[e], px.v[e]);
    store_pack<W>(y, j, py);
  }
  for (size_t i = packs * W + grid_first(); i < n; i += grid_stride()) y[i] = op(y[i], x[i]);
}

template <typename T>
__global__ void scale_kernel(T* x, float s, size_t n) {
  constexpr int W = kPack<T>;
  auto op = [s](T a) { return from_f<T>(to_f(a) * s); };
  const size_t packs = pack_aligned<T, W>(x) ? n / W : 0;
  for (size_t j = grid_first(); j < packs; j += grid_stride()) {
    Pack<T, W> p = load_pack<W>(x, j);
#pragma unroll
    for (int e = 0; e < W; ++e) p.v[e] = op(p.v[e]);
    store_pack<W>(x, j, p);
  }
  for (size_t i = packs * W + grid_first(); i < n; i += grid_stride()) x[i] = op(x[i]);
}

// The conversions move W = kPack<T> elements a thread: 16 bytes of T and 4·W bytes of float.
template <typename T>
__global__ void convert_from_float_kernel(T* dst, const float* src, size_t n) {
  constexpr int W = kPack<T>;
  const size_t packs = pack_aligned<T, W>(dst) && pack_aligned<float, W>(src) ? n / W : 0;
  for (size_t j = grid_first(); j < packs; j += grid_stride()) {
    const Pack<float, W> p = load_pack<W>(src, j);
    Pack<T, W> o;
#pragma unroll
    for (int e = 0; e < W; ++e) o.v[e] = from_f<T>(p.v[e]);
    store_pack<W>(dst, j, o);
  }
  for (size_t i = packs * W + grid_first(); i < n; i += grid_stride()) dst[i] = from_f<T>(src[i]);
}

template <typename T>
__global__ void convert_to_float_kernel(float* dst, const T* src, size_t n) {
  constexpr int W = kPack<T>;
  const size_t packs = pack_aligned<float, W>(dst) && pack_aligned<T, W>(src) ? n / W : 0;
  for (size_t j = grid_first(); j < packs; j += grid_stride()) {
    const Pack<T, W> p = load_pack<W>(src, j);
    Pack<float, W> o;
#pragma unroll
    for (int e = 0; e < W; ++e) o.v[e] = to_f(p.v[e]);
    store_pack<W>(dst, j, o);
  }
  for (size_t i = packs * W + grid_first(); i < n; i += grid_stride()) dst[i] = to_f(src[i]);
}

// One block per row.
template <typename T>
__global__ void convert_to_float_strided_kernel(float* dst, int ld_dst, const T* src, int ld_src, int cols) {
  const size_t r = blockIdx.x;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) dst[r * ld_dst + j] = to_f(src[r * ld_src + j]);
}

template <typename T>
__global__ void scale_matrix_kernel(T* c, int cols, int ld, float beta) {
  T* row = c + size_t(blockIdx.x) * ld;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) row[j] = beta == 0.0f ? from_f<T>(0.0f) : from_f<T>(to_f(row[j]) * beta);
}

// Threads a grid-stride loop over n elements in packs of w needs (one per pack).
size_t packed(size_t n, int w) { return (n + size_t(w) - 1) / size_t(w); }

}  // namespace

template <typename T>
void launch_gather_rows(cudaStream_t st, T* out, const T* in, const int32_t* rows, int n, int dim) {
  if (n <= 0 || dim <= 0) return;
  DFLASH_LAUNCH(n, kThreads, 0, st, copy_rows_kernel<T, false>)(out, in, rows, dim);
}
template <typename T>
void launch_scatter_rows(cudaStream_t st, T* out, const T* in, const int32_t* rows, int n, int dim) {
  if (n <= 0 || dim <= 0) return;
  DFLASH_LAUNCH(n, kThreads, 0, st, copy_rows_kernel<T, true>)(out, in, rows, dim);
}
template <typename T>
void launch_scatter_add_rows(cudaStream_t st, T* out, const T* in, const int32_t* rows, const float* weight, int n,
                             int dim) {
  if (n <= 0 || dim <= 0) return;
  DFLASH_LAUNCH(n, kThreads, 0, st, scatter_add_rows_kernel<T>)(out, in, rows, weight, dim);
}
template <typename T>
void launch_scale_rows(cudaStream_t st, T* x, const float* weight, int n, int dim) {
  if (n <= 0 || dim <= 0) return;
  DFLASH_LAUNCH(n, kThreads, 0, st, scale_rows_kernel<T>)(x, weight, dim);
}
template <typename T>
void launch_swiglu_forward(cudaStream_t st, T* h, const T* gate, const T* up, size_t n) {
  if (!n) return;
  DFLASH_LAUNCH(grid_for(packed(n, kPack<T>)), kThreads, 0, st, swiglu_forward_kernel<T>)(h, gate, up, n);
}
template <typename T>
void launch_swiglu_backward(cudaStream_t st, T* dgate, T* dup, const T* dh, const T* gate, const T* up, size_t n) {
  if (!n) return;
  DFLASH_LAUNCH(grid_for(packed(n, kPack<T>)), kThreads, 0, st, swiglu_backward_kernel<T>)(dgate, dup, dh, gate, up, n);
}
template <typename T>
void launch_sigmoid_gate(cudaStream_t st, T* x, const T* gate, size_t n) {
  if (!n) return;
  DFLASH_LAUNCH(grid_for(n), kThreads, 0, st, sigmoid_gate_kernel<T>)(x, gate, n);
}
template <typename T>
void launch_residual(cudaStream_t st, T* out, const T* a, const T* b, size_t n) {
  if (!n) return;
  DFLASH_LAUNCH(grid_for(packed(n, kPack<T>)), kThreads, 0, st, residual_kernel<T>)(out, a, b, n);
}
template <typename T>
void launch_accumulate(cudaStream_t st, T* y, const T* x, size_t n) {
  if (!n) return;
  DFLASH_LAUNCH(grid_for(packed(n, kPack<T>)), kThreads, 0, st, accumulate_kernel<T>)(y, x, n);
}
template <typename T>
void launch_scale(cudaStream_t st, T* x, float s, size_t n) {
  if (!n) return;
  DFLASH_LAUNCH(grid_for(packed(n, kPack<T>)), kThreads, 0, st, scale_kernel<T>)(x, s, n);
}
template <typename T>
void launch_convert_from_float(cudaStream_t st, T* dst, const float* src, size_t n) {
  if (!n) return;
  DFLASH_LAUNCH(grid_for(packed(n, kPack<T>)), kThreads, 0, st, convert_from_float_kernel<T>)(dst, src, n);
}
template <typename T>
void launch_convert_to_float(cudaStream_t st, float* dst, const T* src, size_t n) {
  if (!n) return;
  DFLASH_LAUNCH(grid_for(packed(n, kPack<T>)), kThreads, 0, st, convert_to_float_kernel<T>)(dst, src, n);
}
template <typename T>
void launch_convert_to_float_strided(cudaStream_t st, float* dst, int ld_dst, const T* src, int ld_src, int rows,
                                     int cols) {
  if (rows <= 0 || cols <= 0) return;
  DFLASH_LAUNCH(rows, kThreads, 0, st, convert_to_float_strided_kernel<T>)(dst, ld_dst, src, ld_src, cols);
}
template <typename T>
void launch_scale_matrix(cudaStream_t st, T* c, int rows, int cols, int ld, float beta) {
  if (rows <= 0 || cols <= 0 || beta == 1.0f) return;
  DFLASH_LAUNCH(rows, kThreads, 0, st, scale_matrix_kernel<T>)(c, cols, ld, beta);
}

#define DFLASH_INSTANTIATE(T)                                                                             \
  template void launch_gather_rows<T>(cudaStream_t, T*, const T*, const int32_t*, int, int);               \
  template void launch_scatter_rows<T>(cudaStream_t, T*, const T*, const int32_t*, int, int);              \
  template void launch_scatter_add_rows<T>(cudaStream_t, T*, const T*, const int32_t*, const float*, int, int); \
  template void launch_scale_rows<T>(cudaStream_t, T*, const float*, int, int);                            \
  template void launch_swiglu_forward<T>(cudaStream_t, T*, const T*, const T*, size_t);                    \
  template void launch_swiglu_backward<T>(cudaStream_t, T*, T*, const T*, const T*, const T*, size_t);     \
  template void launch_residual<T>(cudaStream_t, T*, const T*, const T*, size_t);                          \
  template void launch_sigmoid_gate<T>(cudaStream_t, T*, const T*, size_t);                                \
  template void launch_accumulate<T>(cudaStream_t, T*, const T*, size_t);                                  \
  template void launch_scale<T>(cudaStream_t, T*, float, size_t);                                          \
  template void launch_scale_matrix<T>(cudaStream_t, T*, int, int, int, float);                           \
  template void launch_convert_from_float<T>(cudaStream_t, T*, const float*, size_t);                    \
  template void launch_convert_to_float<T>(cudaStream_t, float*, const T*, size_t);                      \
  template void launch_convert_to_float_strided<T>(cudaStream_t, float*, int, const T*, int, int, int);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(bf16)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::kernels::cuda
