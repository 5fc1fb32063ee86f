// Causal GQA attention of the target, forward only, with or without a KV cache: out[n, NH, D] (=), query row i at
// position past + i seeing keys 0 .. past + i (past = 0: a prefill). A block takes kCausalRows consecutive query
// rows of one head (4 warps, 4 rows each) and walks the keys the last of them sees in tiles of 32, each tile's
// K and V rows loaded once, coalesced, into shared memory (K padded to D + 1 floats a row, so that lane t reading
// row t is free of bank conflicts) and used by all the block's rows. Per row the math is the warp-per-query walk
// of attention_common.cuh (one key per lane, online softmax per tile, lane-owned output dimensions), tested on the
// CPU (tests/unit/test_cuda_math_target.cpp); a row stops at its own last key. Unverified on GPU. The fp32 path, and
// the reference of the tensor-core kernel (attention_dflash_tc.cu) the launchers use for bf16 where they can.
// Split-K over a long cache (flash-decoding), the tensor-core kernel's scheme: a decode step (n = 1) or a short
// verify would run ⌈n / 16⌉ · NH blocks, each walking the whole cache; split z (blockIdx.z) takes the key tiles
// [z · per, (z + 1) · per) of its block and writes each row's unnormalised output and (running max, sum) in fp32 to
// scratch, and a merge kernel (one warp per (query row, head)) combines the splits in order z = 0, 1, … (no atomics:
// the same bits in any thread or block order). One split is the unsplit kernel, writing T directly.
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/split_merge.cuh"
#include "kernels/cuda/target_math.h"

#include <algorithm>
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

// The split-K policy (attention_cached_splits_cores): enough thread blocks for about one per SM of an H100/H200
// (132), each split at least kMinSplitTiles key tiles of 32 (128 keys: the streaming outweighs writing and merging
// D + 2 floats per row), at most kMaxSplits; the tensor-core policy's constants.
constexpr int kSplitTargetBlocks = 132;
constexpr int kMinSplitTiles = 4;
constexpr int kMaxSplits = 64;

// Key tiles of the longest query tile (its last row sees past + n keys); tiles per split for `splits`.
int causal_key_tiles(int n, int past) { return (past + n + kKeyTile - 1) / kKeyTile; }
int tiles_per_split(int n, int past, int splits) { return (causal_key_tiles(n, past) + splits - 1) / splits; }

// grid (⌈n / kCausalRows⌉, NH, splits); dynamic shared memory causal_smem_bytes(D). Split z takes the keys
// [z · split_keys, (z + 1) · split_keys) (a multiple of the key tile; unsplit: all of them). part_o null: out (=)
// the normalised output. Else, per row i·NH + h of the n · NH rows and split z (zr = z · n · NH + row):
// part_o[zr, D] (=) its unnormalised output, part_ml[zr, 2] (=) its (running max, sum) in natural-log units; a
// split past the row's keys writes (−∞, 0) and zeros.
template <typename T>
__global__ void __launch_bounds__(kAttnWarps * kWarp)
    attention_causal_kernel(T* out, const T* q, const T* k, const T* v, int n, int past, int NH, int KVH, int D,
                            int split_keys, float* part_o, float* part_ml) {
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
  // this split's keys: [k0, k0 + split_keys) of what the block's last row sees
  const int k0 = blockIdx.z * split_keys;
  const int block_keys = min(cuda_math::causal_key_count(past, i0 + rows - 1), k0 + split_keys);
  for (int t0 = k0; t0 < block_keys; t0 += kKeyTile) {
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
      const int row_keys = r < rows ? min(cuda_math::causal_key_count(past, i0 + r), k0 + split_keys) : 0;
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
    if (part_o) {  // a split: unnormalised, in fp32, with its (max, sum) for the merge
      const size_t zr = (size_t(blockIdx.z) * n + (i0 + r)) * NH + h;
#pragma unroll
      for (int c = 0; c < kDimPerLane; ++c) {
        const int d = lane + kWarp * c;
        if (d < D) part_o[zr * D + d] = o[rr][c];
      }
      if (lane == 0) {
        part_ml[2 * zr] = sm[rr].m;
        part_ml[2 * zr + 1] = sm[rr].l;
      }
      continue;
    }
    const float inv_l = 1.0f / sm[rr].l;
#pragma unroll
    for (int c = 0; c < kDimPerLane; ++c) {
      const int d = lane + kWarp * c;
      if (d < D) out[(size_t(i0 + r) * NH + h) * D + d] = from_f<T>(o[rr][c] * inv_l);
    }
  }
}

// Split-K merge, one warp per row r of the n · NH (query row, head) rows (split_merge.cuh; maxima in natural-log
// units here).
template <typename T>
__global__ void attention_cores_split_merge_kernel(T* out, const float* part_o, const float* part_ml, int rows,
                                                   int D, int splits) {
  const int r = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (r >= rows) return;
  merge_split_row<ExpBase::e, kDimPerLane>(part_o, part_ml, rows, r, D, splits,
                                           [&](int d, float v) { out[size_t(r) * D + d] = from_f<T>(v); });
}

}  // namespace

int attention_cached_splits_cores(int n, int past, int q_heads, int head_dim) {
  if (n <= 0 || past < 0 || q_heads <= 0 || head_dim < 1 || head_dim > kMaxHeadDim) return 1;
  const long long blocks = (long long)((n + kCausalRows - 1) / kCausalRows) * q_heads;
  const long long by_sms = (kSplitTargetBlocks + blocks - 1) / blocks;  // 1 once the unsplit grid fills the GPU
  const long long by_keys = causal_key_tiles(n, past) / kMinSplitTiles;
  const int asked = int(std::max(1LL, std::min({by_sms, by_keys, (long long)kMaxSplits})));
  // as the launcher cuts them: equal whole-tile ranges
  return (causal_key_tiles(n, past) + tiles_per_split(n, past, asked) - 1) / tiles_per_split(n, past, asked);
}

template <typename T>
int attention_cached_forward_splits(int n, int past, int q_heads, int kv_heads, int head_dim,
                                    std::initializer_list<const void*> tensors) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (attention_causal_tc_supports(q_heads, kv_heads, head_dim, tensors))
      return attention_cached_splits(n, past, q_heads, kv_heads, head_dim);
  }
  return attention_cached_splits_cores(n, past, q_heads, head_dim);
}

template <typename T>
void launch_attention_cached_forward_cores(cudaStream_t st, T* out, const T* q, const T* k, const T* v, int n,
                                           int past, int q_heads, int kv_heads, int head_dim, int splits,
                                           float* scratch) {
  if (n <= 0 || q_heads <= 0) return;
  const size_t smem = causal_smem_bytes(head_dim);  // 82 KiB at head_dim 256: above the 48 KiB default
  allow_dynamic_smem<attention_causal_kernel<T>>(smem, "attention_cached_forward (CUDA cores)");
  // splits covering the longest query tile's key tiles with none empty there (7 tiles asked in 4: 2 a split)
  const int tiles = causal_key_tiles(n, past), per_split = tiles_per_split(n, past, std::clamp(splits, 1, tiles));
  splits = (tiles + per_split - 1) / per_split;
  if (splits > 1 && !scratch)
    cuda_fail("launch_attention_cached_forward_cores", __FILE__, __LINE__, "split-K needs its scratch");
  float* part_o = splits > 1 ? scratch : nullptr;
  float* part_ml = splits > 1 ? scratch + size_t(splits) * n * q_heads * head_dim : nullptr;
  const dim3 grid(unsigned((n + kCausalRows - 1) / kCausalRows), unsigned(q_heads), unsigned(splits));
  DFLASH_LAUNCH(grid, kAttnWarps * kWarp, smem, st, attention_causal_kernel<T>)(
      out, q, k, v, n, past, q_heads, kv_heads, head_dim, per_split * kKeyTile, part_o, part_ml);
  if (splits == 1) return;
  constexpr int kMergeWarps = 8;
  const int rows = n * q_heads;
  DFLASH_LAUNCH(unsigned((rows + kMergeWarps - 1) / kMergeWarps), kMergeWarps * kWarp, 0, st,
                attention_cores_split_merge_kernel<T>)(out, part_o, part_ml, rows, head_dim, splits);
}

template <typename T>
void launch_attention_cached_forward(cudaStream_t st, T* out, const T* q, const T* k, const T* v, int n, int past,
                                     int q_heads, int kv_heads, int head_dim, int splits, float* scratch) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (attention_causal_tc_supports(q_heads, kv_heads, head_dim, {out, q, k, v}))
      return launch_attention_cached_forward_tc(st, out, q, k, v, n, past, q_heads, kv_heads, head_dim, splits,
                                                scratch);
  }
  launch_attention_cached_forward_cores(st, out, q, k, v, n, past, q_heads, kv_heads, head_dim, splits, scratch);
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
                                                         int, int, int, int, float*);                            \
  template int attention_cached_forward_splits<T>(int, int, int, int, int, std::initializer_list<const void*>);   \
  template void launch_attention_causal_forward<T>(cudaStream_t, T*, const T*, const T*, const T*, int, int, int, \
                                                   int);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(bf16)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::kernels::cuda
