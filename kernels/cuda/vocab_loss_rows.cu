// The vocab-loss row passes on logits in device memory (T = float or bf16; exponentials in float, sums over the
// vocabulary in double, as on the CPU). One thread block per row; the per-element and per-row math is
// kernels/math/loss_rows.h, the functions the CPU row passes call (the CPU being one thread). Reductions are fixed
// trees (deterministic). Unverified on GPU; simple over fast: up to four passes over the row from global memory,
// each in 16-byte loads where the row is aligned (for_row: V = 248,320 bf16 is 31,040 packs of 8).
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pack16.cuh"
#include "kernels/math/loss_rows.h"

namespace dflash::kernels::cuda {

namespace {

using RowMax = math::RowMax<float>;
using RowPass2In = math::RowPass2In<float>;
using RowSums = math::RowSums<float>;
using GradRow = math::GradRow<float>;

// f(v, z_v, u_v) for the elements of a row this thread owns: when both rows are 16-byte aligned, packs of
// W = kPack<T> elements (thread t takes packs t, t + kThreads, …: 16-byte loads), then the V mod W tail one
// element a thread; otherwise the plain strided loop. u_v = fill without u. The partition is fixed by the row's
// address and V, so the sums (in double) are the same bits from run to run, in any thread order.
template <typename T, typename F>
__device__ void for_row(const T* zr, const T* ur, int V, float fill, F&& f) {
  constexpr int W = kPack<T>;
  const int packs = pack_aligned<T, W>(zr) && (!ur || pack_aligned<T, W>(ur)) ? V / W : 0;
  for (int j = threadIdx.x; j < packs; j += kThreads) {
    const Pack<T, W> pz = load_pack<W>(zr, size_t(j));
    if (ur) {
      const Pack<T, W> pu = load_pack<W>(ur, size_t(j));
#pragma unroll
      for (int e = 0; e < W; ++e) f(j * W + e, to_f(pz.v[e]), to_f(pu.v[e]));
    } else {
#pragma unroll
      for (int e = 0; e < W; ++e) f(j * W + e, to_f(pz.v[e]), fill);
    }
  }
  for (int v = packs * W + threadIdx.x; v < V; v += kThreads) f(v, to_f(zr[v]), ur ? to_f(ur[v]) : fill);
}

template <typename T>
__global__ void row_stats_kernel(const T* z, const T* u, int V, const int32_t* labels, const float* weights,
                                 VocabLossCoeffs k, int top_k, VocabLossRow* rows, VocabLossRowValues* values) {
  const int row = blockIdx.x, tid = threadIdx.x;
  const double tau = k.tau;
  if (!(weights[row] > 0)) {  // rows with w = 0 are skipped: values zeroed, statistics untouched
    if (tid == 0) values[row] = VocabLossRowValues{};
    return;
  }
  const T* zr = z + size_t(row) * V;
  const T* ur = u ? u + size_t(row) * V : nullptr;
  const int y = labels[row];

  RowMax mx;
  for_row(zr, ur, V, -INFINITY, [&](int, float zv, float uv) { mx.add(zv, uv); });
  mx = block_merge(mx);

  const RowPass2In in = math::pass2_in(mx, to_f(zr[y]), y, tau, ur != nullptr);
  RowSums sums;
  if (isfinite(mx.z)) {  // block-uniform: every thread holds the same merged maximum
    for_row(zr, ur, V, 0.0f, [&](int v, float zv, float uv) { sums.add(in, v, zv, uv); });
    sums = block_merge(sums);
  }

  SumD excl;
  if (isfinite(mx.z) && math::needs_excl_pass(mx, sums, y)) {  // block-uniform as well
    const float second = sums.second(mx.z);
    const T* no_u = nullptr;  // this pass reads z only
    for_row(zr, no_u, V, 0.0f, [&](int v, float zv, float) { excl.v += math::excl_term(v, zv, sums.argmax, second); });
    excl = block_merge(excl);
  }

  const bool overlap = ur && math::uses_overlap(k);
  math::RowOverlap ov;
  if (overlap && isfinite(mx.z)) {  // block-uniform: the merged sums give every thread the same OverlapIn
    const math::OverlapIn<float> in4 = math::overlap_in(mx, sums);
    for_row(zr, ur, V, 0.0f, [&](int, float zv, float uv) { ov.add(in4, zv, uv); });
    ov = block_merge(ov);
  }

  if (tid == 0) {
    VocabLossRow s = rows[row];
    VocabLossRowValues out;
    math::finish_row_stats(mx, sums, excl.v, in.zy, y, tau, top_k, ur != nullptr, s, out);
    if (overlap && out.finite) math::finish_overlap(ov, k, s, out);
    out.scored = 1;
    rows[row] = s;
    values[row] = out;
  }
}

template <typename T>
__global__ void row_grad_kernel(T* z, const T* u, int V, const int32_t* labels, const float* weights,
                                const VocabLossRow* rows, double grad_scale, VocabLossCoeffs k) {
  // raw bytes: a __shared__ variable cannot have GradRow's member initialisers; thread 0 writes it whole
  DFLASH_SHARED_ALIGNED(alignof(GradRow), unsigned char, g_raw, [sizeof(GradRow)]);
  GradRow& g_sh = *reinterpret_cast<GradRow*>(g_raw);
  const int row = blockIdx.x, tid = threadIdx.x;
  T* zr = z + size_t(row) * V;
  const T* ur = u ? u + size_t(row) * V : nullptr;
  if (tid == 0) {
    const double c = grad_scale * double(weights[row]);
    const int y = labels[row];
    if (c == 0) {  // the statistics of a skipped row are not read (its argmax may be stale)
      GradRow g;
      g.zero = true;
      g_sh = g;
    } else {
      const VocabLossRow s = rows[row];
      const int m = s.argmax;
      g_sh = math::grad_row_coeffs(s, y, to_f(zr[y]), to_f(zr[m]), ur ? to_f(ur[y]) : 0.0f,
                                        ur ? to_f(ur[m]) : 0.0f, ur != nullptr, c, k);
    }
  }
  __syncthreads();
  const GradRow g = g_sh;
  // every element independently (the same bits in any partition): 16-byte packs when the rows allow, as for_row
  constexpr int W = kPack<T>;
  const int packs = pack_aligned<T, W>(zr) && (!ur || pack_aligned<T, W>(ur)) ? V / W : 0;
  for (int j = tid; j < packs; j += kThreads) {
    Pack<T, W> pz = load_pack<W>(zr, size_t(j));
    Pack<T, W> pu{};
    if (ur) pu = load_pack<W>(ur, size_t(j));
#pragma unroll
    for (int e = 0; e < W; ++e) pz.v[e] = from_f<T>(math::grad_element(g, to_f(pz.v[e]), ur ? to_f(pu.v[e]) : 0.0f));
    store_pack<W>(zr, size_t(j), pz);
  }
  for (int v = packs * W + tid; v < V; v += kThreads)
    zr[v] = from_f<T>(math::grad_element(g, to_f(zr[v]), ur ? to_f(ur[v]) : 0.0f));
  __syncthreads();
  if (tid == 0 && !g.zero) {
    zr[g.y] = from_f<T>(float(g.at_y));
    zr[g.m] = from_f<T>(float(g.at_m));
  }
}

}  // namespace

template <typename T>
void launch_vocab_loss_row_stats(cudaStream_t st, const T* z, const T* u, int n, int V, const int32_t* labels,
                                 const float* weights, const VocabLossCoeffs& coeffs, int top_k, VocabLossRow* rows,
                                 VocabLossRowValues* values) {
  if (n <= 0) return;
  DFLASH_LAUNCH(n, kThreads, 0, st, row_stats_kernel<T>)(z, u, V, labels, weights, coeffs, top_k, rows, values);
}

template <typename T>
void launch_vocab_loss_row_grad(cudaStream_t st, T* z, const T* u, int n, int V, const int32_t* labels,
                                const float* weights, const VocabLossRow* rows, double grad_scale,
                                const VocabLossCoeffs& coeffs) {
  if (n <= 0) return;
  DFLASH_LAUNCH(n, kThreads, 0, st, row_grad_kernel<T>)(z, u, V, labels, weights, rows, grad_scale, coeffs);
}

#define DFLASH_INSTANTIATE(T)                                                                                    \
  template void launch_vocab_loss_row_stats<T>(cudaStream_t, const T*, const T*, int, int, const int32_t*,       \
                                               const float*, const VocabLossCoeffs&, int, VocabLossRow*,         \
                                               VocabLossRowValues*);                                             \
  template void launch_vocab_loss_row_grad<T>(cudaStream_t, T*, const T*, int, int, const int32_t*, const float*, \
                                              const VocabLossRow*, double, const VocabLossCoeffs&);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(bf16)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::kernels::cuda
