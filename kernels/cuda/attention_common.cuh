#pragma once
// The warp-per-query attention core shared by the DFlash and causal kernels: one warp owns one (query, head); its
// 32 lanes score a tile of 32 keys (one key per lane, a full dot product each), merge the tile into the query's
// online softmax (cuda_math::OnlineSoftmax) and accumulate the output with lane-owned dimensions (d = lane + 32·i).
// No [queries, keys] matrix exists anywhere: scores live in one register per lane for one tile.
// Simple over fast: CUDA cores, no tensor cores, K/V rows read from global (L1/L2) by every query that sees them.
#include "kernels/cuda/attention_math.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace dflash::kernels::cuda {

constexpr int kAttnWarps = 4;                        // warps (queries) per thread block
constexpr int kDimPerLane = kMaxHeadDim / kWarp;     // output dimensions one lane keeps

// One score (or score gradient) per lane, read back by every lane of the warp key by key: through a per-warp row of
// shared memory rather than 32 shuffles per tile (one __syncwarp publishes the row; one more before it is rewritten).
struct WarpRow {
  float* v;  // this warp's kWarp slots
  __device__ void publish(float x) {
    v[threadIdx.x % kWarp] = x;
    __syncwarp();
  }
  __device__ float operator[](int k) const { return v[k]; }
  __device__ void release() const { __syncwarp(); }  // every lane has read the row
};

template <typename T>
__device__ __forceinline__ float dot_shared(const float* a_s, const T* b, int D) {
  float acc = 0;
  for (int d = 0; d < D; ++d) acc += a_s[d] * to_f(b[d]);
  return acc;
}

// Forward of one query whose (float) vector is in shared memory q_s[D]. key(t, k, v) gives the rows of visible
// key t < n_keys. Leaves o[i] = Σ p v (unnormalised, dimension lane + 32·i) and the softmax state in sm.
template <typename T, typename KeyFn>
__device__ void attend_query(const float* q_s, int D, float scale, int n_keys, KeyFn key, float (&o)[kDimPerLane],
                             cuda_math::OnlineSoftmax& sm) {
  const int lane = threadIdx.x % kWarp;
  DFLASH_SHARED(float, p_sh, [kAttnWarps][kWarp]);
  WarpRow p_row{p_sh[threadIdx.x / kWarp]};
  for (int i = 0; i < kDimPerLane; ++i) o[i] = 0;
  for (int t0 = 0; t0 < n_keys; t0 += kWarp) {
    const int t = t0 + lane;
    float s = -INFINITY;
    if (t < n_keys) {
      const T *k, *v;
      key(t, k, v);
      s = dot_shared(q_s, k, D) * scale;
    }
    // Every lane holds the same state and applies the same merge: the state stays identical across the warp.
    const float alpha = sm.rescale(warp_max(s));
    const float p = t < n_keys ? expf(s - sm.m) : 0.0f;
    sm.add(warp_sum(p));
    for (int i = 0; i < kDimPerLane; ++i) o[i] *= alpha;
    const int nt = n_keys - t0 < kWarp ? n_keys - t0 : kWarp;
    p_row.publish(p);
    for (int kk = 0; kk < nt; ++kk) {
      const float pk = p_row[kk];
      const T *k, *v;
      key(t0 + kk, k, v);
      for (int i = 0; i < kDimPerLane; ++i) {
        const int d = lane + kWarp * i;
        if (d < D) o[i] += pk * to_f(v[d]);
      }
    }
    p_row.release();
  }
}

// Loads a [D] vector of T into this warp's shared floats.
template <typename T>
__device__ __forceinline__ void load_shared(float* dst, const T* src, int D) {
  for (int d = threadIdx.x % kWarp; d < D; d += kWarp) dst[d] = to_f(src[d]);
  __syncwarp();
}

}  // namespace dflash::kernels::cuda
