// Causal GQA attention of the target, forward only, with or without a KV cache: out[n, NH, D] (=), query row i at
// position past + i seeing keys 0 .. past + i (past = 0: a prefill). One warp per (row, head), keys in tiles of 32
// with an online softmax (attention_common.cuh). Unverified on GPU; simple over fast (a decode step, n = 1, runs
// only NH warps: each walks the whole cache alone).
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/target_math.h"

namespace dflash::kernels::cuda {

namespace {

template <typename T>
__global__ void attention_causal_kernel(T* out, const T* q, const T* k, const T* v, int n, int past, int NH, int KVH,
                                        int D) {
  __shared__ float q_sh[kAttnWarps][kMaxHeadDim];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const long long query = (long long)blockIdx.x * kAttnWarps + warp;  // = i·NH + h
  if (query >= (long long)n * NH) return;                             // whole warps exit together
  const int i = int(query / NH), h = int(query % NH), g = h / (NH / KVH);
  float* q_s = q_sh[warp];
  load_shared(q_s, q + size_t(query) * D, D);
  auto key = [&](int t, const T*& kp, const T*& vp) {
    kp = k + (size_t(t) * KVH + g) * D;
    vp = v + (size_t(t) * KVH + g) * D;
  };
  float o[kDimPerLane];
  cuda_math::OnlineSoftmax sm;
  attend_query<T>(q_s, D, 1.0f / sqrtf(float(D)), cuda_math::causal_key_count(past, i), key, o, sm);
  const float inv_l = 1.0f / sm.l;
  for (int c = 0; c < kDimPerLane; ++c) {
    const int d = lane + kWarp * c;
    if (d < D) out[size_t(query) * D + d] = from_f<T>(o[c] * inv_l);
  }
}

}  // namespace

template <typename T>
void launch_attention_cached_forward(cudaStream_t st, T* out, const T* q, const T* k, const T* v, int n, int past,
                                     int q_heads, int kv_heads, int head_dim) {
  const long long queries = (long long)n * q_heads;
  if (queries <= 0) return;
  const unsigned blocks = unsigned((queries + kAttnWarps - 1) / kAttnWarps);
  attention_causal_kernel<T><<<blocks, kAttnWarps * kWarp, 0, st>>>(out, q, k, v, n, past, q_heads, kv_heads,
                                                                     head_dim);
  DFLASH_CUDA_LAUNCHED("attention_causal_kernel");
}

template <typename T>
void launch_attention_causal_forward(cudaStream_t st, T* out, const T* q, const T* k, const T* v, int S, int q_heads,
                                     int kv_heads, int head_dim) {
  launch_attention_cached_forward(st, out, q, k, v, S, 0, q_heads, kv_heads, head_dim);
}

#define DFLASH_INSTANTIATE(T)                                                                                    \
  template void launch_attention_cached_forward<T>(cudaStream_t, T*, const T*, const T*, const T*, int, int, int, \
                                                   int, int);                                                    \
  template void launch_attention_causal_forward<T>(cudaStream_t, T*, const T*, const T*, const T*, int, int, int, \
                                                   int);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(bf16)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::kernels::cuda
