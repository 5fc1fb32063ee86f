#pragma once
// The chunked gated delta rule on tensor cores (kernels/cuda/deltanet_chunked.cu, bf16 only), and the per-token
// kernel (kernels/cuda/deltanet.cu) under its own name so that tests can run both. Both take the contract of
// Backend::gated_delta_rule_forward (kernels/backend.h): out [S, v_heads, dv] (=); q, k [S, k_heads, dk] (L2-normed,
// q scaled by 1/sqrt(dk)); v [S, v_heads, dv]; g, beta [S, v_heads] fp32; state [v_heads, dk, dv] fp32 (before
// position 0 on entry, after S−1 on return; null: zero). launch_gated_delta_rule (launch.h) sends bf16 to the
// chunked kernel when it supports the shape, everything else to the per-token kernel. Unverified on GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace dflash::kernels::cuda {

// The chunked kernel's shapes: dk ∈ {64, 128}, dv a positive multiple of 64, k_heads ≥ 1 dividing v_heads, and its
// shared memory (98 KiB at dk 64, 139 KiB at dk 128) within the current device's per-block limit.
bool gated_delta_rule_chunked_supports(int k_heads, int v_heads, int dk, int dv);
// The chunked kernel's dynamic shared memory for key head dim dk (64 or 128).
size_t gated_delta_rule_chunked_smem(int dk);

// Chunks of 64 tokens in the WY / UT form (kernels/cpu/gated_delta_chunked.h, its CPU twin). Throws dflash::Error
// naming the numbers for a shape gated_delta_rule_chunked_supports refuses.
void launch_gated_delta_rule_chunked(cudaStream_t st, __nv_bfloat16* out, const __nv_bfloat16* q,
                                     const __nv_bfloat16* k, const __nv_bfloat16* v, const float* g,
                                     const float* beta, float* state, int S, int k_heads, int v_heads, int dk, int dv);

// The per-token recurrence (T = float or __nv_bfloat16; dk ≤ kMaxDeltaKeyDim, any dv): the reference kernel.
template <typename T>
void launch_gated_delta_rule_per_token(cudaStream_t st, T* out, const T* q, const T* k, const T* v, const float* g,
                                       const float* beta, float* state, int S, int k_heads, int v_heads, int dk,
                                       int dv);

}  // namespace dflash::kernels::cuda
