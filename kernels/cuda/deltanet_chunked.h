#pragma once
// The chunk-parallel gated delta rule on tensor cores (kernels/cuda/deltanet_chunked.cu, bf16 only), and the
// per-token kernel (kernels/cuda/deltanet.cu) under its own name so that tests can run both. Both take the contract
// of Backend::gated_delta_rule_forward (kernels/backend.h): out [S, v_heads, dv] (=); q, k [S, k_heads, dk]
// (L2-normed, q scaled by 1/sqrt(dk)); v [S, v_heads, dv]; g, beta [S, v_heads] fp32; state [v_heads, dk, dv] fp32
// (before position 0 on entry, after S−1 on return; null: zero). launch_gated_delta_rule (launch.h) sends bf16 to
// the chunked kernels when they take the call (kernels/delta_rule_chunks.h: the shape, S ≥ 2), everything else to
// the per-token kernel. Unverified on GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace dflash::kernels::cuda {

// The chunked kernels' shapes: dk ∈ {64, 128}, dv a positive multiple of 64, k_heads ≥ 1 dividing v_heads.
bool gated_delta_rule_chunked_supports(int k_heads, int v_heads, int dk, int dv);

// Device scratch of one chunked call of S tokens (kernels/delta_rule_chunks.h: γ, W and the per-chunk states).
size_t gated_delta_rule_chunked_scratch_bytes(int S, int v_heads, int dk, int dv);

// Dynamic shared memory of the three kernels at key dim dk (64 or 128); the state pass in 2 and in 3 stages
// (the launcher takes 3 where the device's opt-in limit holds them).
struct ChunkedSmem {
  size_t prepare, state2, state3, output;
};
ChunkedSmem gated_delta_rule_chunked_smem(int dk);

// Events recorded on the stream after the first and the second pass (for per-pass timing; null: none).
struct ChunkedPassMarks {
  cudaEvent_t after_prepare = nullptr, after_state = nullptr;
};

// Chunks of 64 tokens in three passes (kernels/cpu/gated_delta_chunked.h, the CPU twin). scratch: device memory of
// gated_delta_rule_chunked_scratch_bytes, 16-byte aligned; `out` also serves as scratch between the passes (U, then
// V', then O). Throws dflash::Error naming the numbers for a shape gated_delta_rule_chunked_supports refuses, a
// missing or misaligned scratch, or a device whose opt-in shared memory is below a kernel's need.
void launch_gated_delta_rule_chunked(cudaStream_t st, __nv_bfloat16* out, const __nv_bfloat16* q,
                                     const __nv_bfloat16* k, const __nv_bfloat16* v, const float* g,
                                     const float* beta, float* state, int S, int k_heads, int v_heads, int dk, int dv,
                                     void* scratch, const ChunkedPassMarks* marks = nullptr);

// The per-token recurrence (T = float or __nv_bfloat16; dk ≤ kMaxDeltaKeyDim, any dv): the reference kernel.
template <typename T>
void launch_gated_delta_rule_per_token(cudaStream_t st, T* out, const T* q, const T* k, const T* v, const float* g,
                                       const float* beta, float* state, int S, int k_heads, int v_heads, int dk,
                                       int dv);

}  // namespace dflash::kernels::cuda
