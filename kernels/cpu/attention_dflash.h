#pragma once
// DFlash attention: block queries attend to the target context (KV injection) and to their own block.
//
// Shapes, mask and the visible ranges: kernels/attention_shape.h (shared with the CUDA kernel).

#include "kernels/attention_shape.h"

namespace dflash::cpu {

using kernels::DFlashAttentionShape;
using kernels::dflash_blk_count;
using kernels::dflash_attention_pairs;
using kernels::dflash_ctx_range;

// out (=), lse (=).
template <typename T>
void dflash_attention_forward(T* out, T* lse, const T* q, const T* k_ctx, const T* v_ctx, const T* k_blk,
                              const T* v_blk, const int* anchors, const DFlashAttentionShape& shape);

// dq, dk_ctx, dv_ctx, dk_blk, dv_blk (+=). Recomputes the scores from q, k and lse (flash-attention style).
template <typename T>
void dflash_attention_backward(T* dq, T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk, const T* dout, const T* out,
                               const T* lse, const T* q, const T* k_ctx, const T* v_ctx, const T* k_blk,
                               const T* v_blk, const int* anchors, const DFlashAttentionShape& shape);

}  // namespace dflash::cpu
