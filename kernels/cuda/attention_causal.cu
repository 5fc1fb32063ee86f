// Causal GQA attention of the target, forward only, with or without a KV cache: out[n, NH, D] (=), query row i at
// position past + i seeing keys 0 .. past + i (past = 0: a prefill). A block takes kCausalRows consecutive query
// rows of one head (4 warps, 4 rows each) and walks the keys the last of them sees in tiles of 32, each tile's
// K and V rows loaded once, coalesced, into shared memory (K padded to D + 1 floats a row, so that lane t reading
// row t is free of bank conflicts) and used by all the block's rows. Per row the math is the warp-per-query walk
// of attention_common.cuh (one key per lane, online softmax per tile, lane-owned output dimensions), tested on the
// CPU (tests/unit/test_cuda_math_target.cpp); a row stops at its own last key. Unverified on GPU. The fp32 path, and
// the reference of the tensor-core kernel (attention_dflash_tc.cu) the launchers use for bf16 where they can. Split-K
// over a long cache (flash-decoding) is built for the tensor-core kernel only (the bf16 path); here a decode step
// (n = 1) still runs one block per head, each walking the whole cache.
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/target_math.h"

#include <type_traits>

namespace dflash::kernels::cuda {

namespace {

constexpr int kCausalRows = 16;                          // query rows per block (one head)
constexpr int kRowsPerWarp = kCausalRows / kAttnWarps;  // rows each warp carries through the key tiles
constexpr int kKeyTile = kWarp;                          // keys per shared tile: one per lane when scoring

// Shared floats for head_dim D: K tile [32, D + 1], V tile [32, D], the block's queries [kCausalRows, D].
size_t causal_smem_bytes(int D) {
  return (size_t(kKeyTile) * (D + 1) + size_t(kKeyTile) * D + size_t(kCausalRows) * D) * sizeof(float);
}

// grid (⌈n / kCausalRows⌉, NH); dynamic shared memory causal_smem_bytes(D).
template <typename T>
__global__ void __launch_bounds__(kAttnWarps * kWarp)
    attention_causal_kernel(T* out, const T* q, const T* k, const T* v, int n, int past, int NH, int KVH, int D) {
  DFLASH_DYNAMIC_SHARED(float, smem);
  const int ldk = D + 1;
  float* k_s = smem;                  // [kKeyTile, D + 1]
  float* v_s = k_s + kKeyTile * ldk;  // [kKeyTile, D]
  float* q_s = v_s + kKeyTile * D;    // [kCausalRows, D]
  DFLASH_SHARED(float, p_sh, [kAttnWarps][kWarp]);
  WarpRow p_row{p_sh[threadIdx.x / kWarp]};
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, tid = threadIdx.x;
  const int h = blockIdx.y, g = h / (NH / KVH), i0 = blockIdx.x * kCausalRows;
  const int rows = min(kCausalRows, n - i0);
  for (int e = tid; e < rows * D; e += blockDim.x)
    q_s[e] = to_f(q[(size_t(i0 + e / D) * NH + h) * D + e % D]);

  float o[kRowsPerWarp][kDimPerLane];
  cuda_math::OnlineSoftmax sm[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
    for (int c = 0; c < kDimPerLane; ++c) o[rr][c] = 0;
  const float scale = 1.0f / sqrtf(float(D));
  const int block_keys = cuda_math::causal_key_count(past, i0 + rows - 1);  // what the block's last row sees
  for (int t0 = 0; t0 < block_keys; t0 += kKeyTile) {
    const int nt = min(kKeyTile, block_keys - t0);
    __syncthreads();  // the previous tile's readers are done (and, the first time, q_s is written)
    for (int e = tid; e < nt * D; e += blockDim.x) {
      const int t = e / D, d = e % D;
      const size_t at = (size_t(t0 + t) * KVH + g) * D + d;
      k_s[t * ldk + d] = to_f(k[at]);
      v_s[t * D + d] = to_f(v[at]);
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int row_keys = r < rows ? cuda_math::causal_key_count(past, i0 + r) : 0;
      if (t0 >= row_keys) continue;  // warp-uniform: this row has seen all its keys (or does not exist)
      const int nk = min(kKeyTile, row_keys - t0);
      const float* q_r = q_s + r * D;
      float s = -INFINITY;
      if (lane < nk) {
        const float* k_r = k_s + lane * ldk;
        float acc = 0;
        for (int d = 0; d < D; ++d) acc += q_r[d] * k_r[d];
        s = acc * scale;
      }
      // every lane holds the same state and applies the same merge (attend_query)
      const float alpha = sm[rr].rescale(warp_max(s));
      const float p = lane < nk ? expf(s - sm[rr].m) : 0.0f;
      sm[rr].add(warp_sum(p));
#pragma unroll
      for (int c = 0; c < kDimPerLane; ++c) o[rr][c] *= alpha;
      p_row.publish(p);
      for (int kk = 0; kk < nk; ++kk) {
        const float pk = p_row[kk];
#pragma unroll
        for (int c = 0; c < kDimPerLane; ++c) {
          const int d = lane + kWarp * c;
          if (d < D) o[rr][c] += pk * v_s[kk * D + d];
        }
      }
      p_row.release();
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    if (r >= rows) continue;
    const float inv_l = 1.0f / sm[rr].l;
#pragma unroll
    for (int c = 0; c < kDimPerLane; ++c) {
      const int d = lane + kWarp * c;
      if (d < D) out[(size_t(i0 + r) * NH + h) * D + d] = from_f<T>(o[rr][c] * inv_l);
    }
  }
}

}  // namespace

template <typename T>
void launch_attention_cached_forward_cores(cudaStream_t st, T* out, const T* q, const T* k, const T* v, int n,
                                           int past, int q_heads, int kv_heads, int head_dim) {
  if (n <= 0 || q_heads <= 0) return;
  const size_t smem = causal_smem_bytes(head_dim);  // 82 KiB at head_dim 256: above the 48 KiB default
  DFLASH_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(&attention_causal_kernel<T>),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((n + kCausalRows - 1) / kCausalRows), unsigned(q_heads));
  DFLASH_LAUNCH(grid, kAttnWarps * kWarp, smem, st, attention_causal_kernel<T>)(out, q, k, v, n, past, q_heads,
                                                                                kv_heads, head_dim);
}

template <typename T>
void launch_attention_cached_forward(cudaStream_t st, T* out, const T* q, const T* k, const T* v, int n, int past,
                                     int q_heads, int kv_heads, int head_dim, int splits, float* scratch) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (attention_causal_tc_supports(q_heads, kv_heads, head_dim, {out, q, k, v}))
      return launch_attention_cached_forward_tc(st, out, q, k, v, n, past, q_heads, kv_heads, head_dim, splits,
                                                scratch);
  }
  launch_attention_cached_forward_cores(st, out, q, k, v, n, past, q_heads, kv_heads, head_dim);
}

template <typename T>
void launch_attention_causal_forward(cudaStream_t st, T* out, const T* q, const T* k, const T* v, int S, int q_heads,
                                     int kv_heads, int head_dim) {
  launch_attention_cached_forward(st, out, q, k, v, S, 0, q_heads, kv_heads, head_dim);
}

#define DFLASH_INSTANTIATE(T)                                                                                    \
  template void launch_attention_cached_forward<T>(cudaStream_t, T*, const T*, const T*, const T*, int, int, int, \
                                                   int, int, int, float*);                                       \
  template void launch_attention_cached_forward_cores<T>(cudaStream_t, T*, const T*, const T*, const T*, int, int, \
                                                         int, int, int);                                         \
  template void launch_attention_causal_forward<T>(cudaStream_t, T*, const T*, const T*, const T*, int, int, int, \
                                                   int);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(bf16)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::kernels::cuda
