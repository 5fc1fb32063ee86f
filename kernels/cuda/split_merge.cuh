#pragma once
// The split-K (flash-decoding) merge of the target's cached attention, one copy for the CUDA-core kernels
// (attention_causal.cu, statistics in natural-log units) and the tensor-core ones (attention_dflash_tc.cu, base 2:
// their scores are pre-scaled by log2 e). Each split of a (query row, head) row wrote its unnormalised output o_z and
// its running (max m_z, sum l_z) in fp32; one warp merges the row.
#include "kernels/cuda/device_util.cuh"

namespace dflash::kernels::cuda {

enum class ExpBase { e, two };  // the base the splits' maxima are exponents of

// Row r of `rows`: out[r] (=) Σ_z w_z o_z / Σ_z w_z l_z with w_z = base^(m_z − max_z m_z), the splits taken in
// order z = 0, 1, …: the same bits whatever the thread order. Split 0 holds key 0, which every row sees, so the max
// is finite; a split past a row's keys (m = −∞, l = 0, o = 0) weighs 0. part_o [splits, rows, D], part_ml
// [splits, rows, 2] = (m, l); kPerLane ≥ ⌈D / 32⌉ (lane owns dimensions lane + 32·c); store(d, v) writes dimension d.
template <ExpBase kBase, int kPerLane, class Store>
__device__ __forceinline__ void merge_split_row(const float* part_o, const float* part_ml, int rows, int r, int D,
                                                int splits, Store store) {
  const int lane = threadIdx.x % kWarp;
  float m_max = -INFINITY;
  for (int z = 0; z < splits; ++z) m_max = fmaxf(m_max, part_ml[2 * (size_t(z) * rows + r)]);
  float acc[kPerLane], l = 0.0f;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) acc[c] = 0.0f;
  for (int z = 0; z < splits; ++z) {
    const size_t zr = size_t(z) * rows + r;
    const float dm = part_ml[2 * zr] - m_max;
    const float w = kBase == ExpBase::two ? exp2f(dm) : expf(dm);
    l += w * part_ml[2 * zr + 1];
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = lane + kWarp * c;
      if (d < D) acc[c] += w * part_o[zr * D + d];
    }
  }
  const float inv_l = 1.0f / l;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = lane + kWarp * c;
    if (d < D) store(d, acc[c] * inv_l);
  }
}

}  // namespace dflash::kernels::cuda
