#pragma once
// Host-side launchers of the CUDA kernels (one .cu file per family), called by backend_cuda.cpp. Each launches on
// `stream`, checks the launch (dflash::Error on failure) and returns without synchronising. T is float or bf16;
// statistics, fp32 gradients and optimizer state are float whatever T is (A = acc_t<T> = float).
// Pointers are device memory; nothing here validates shapes (the backend and lib/model do).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kernels/attention_shape.h"
#include "kernels/backend.h"
#include "kernels/vocab_loss_rows.h"

namespace dflash::kernels::cuda {

using bf16 = __nv_bfloat16;

// ---- gemm_fallback.cu: the GEMM of the layouts cuBLASLt has no algorithm for (gemm_lt.cpp) ----
// C[M, N] = alpha · op(A) op(B) + beta · C, row-major; (AB, C) = (float, float), (bf16, bf16) or (bf16, float).
template <typename AB, typename C>
void launch_gemm_fallback(cudaStream_t st, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const AB* a,
                          int lda, const AB* b, int ldb, float beta, C* c, int ldc);

// ---- elementwise.cu ----
template <typename T>
void launch_gather_rows(cudaStream_t st, T* out, const T* in, const int32_t* rows, int n, int dim);
template <typename T>
void launch_scatter_add_rows(cudaStream_t st, T* out, const T* in, const int32_t* rows, const float* weight, int n,
                             int dim);
template <typename T>
void launch_scale_rows(cudaStream_t st, T* x, const float* weight, int n, int dim);
template <typename T>
void launch_scatter_rows(cudaStream_t st, T* out, const T* in, const int32_t* rows, int n, int dim);
template <typename T>
void launch_swiglu_forward(cudaStream_t st, T* h, const T* gate, const T* up, size_t n);
template <typename T>
void launch_swiglu_backward(cudaStream_t st, T* dgate, T* dup, const T* dh, const T* gate, const T* up, size_t n);
// x (=) x · sigmoid(gate)
template <typename T>
void launch_sigmoid_gate(cudaStream_t st, T* x, const T* gate, size_t n);
template <typename T>
void launch_residual(cudaStream_t st, T* out, const T* a, const T* b, size_t n);
template <typename T>
void launch_accumulate(cudaStream_t st, T* y, const T* x, size_t n);
template <typename T>
void launch_scale(cudaStream_t st, T* x, float s, size_t n);
// dst[n] = src[n] rounded to T (bf16: nearest even)
template <typename T>
void launch_convert_from_float(cudaStream_t st, T* dst, const float* src, size_t n);
// dst[n] = src[n] widened to fp32 (exact for bf16)
template <typename T>
void launch_convert_to_float(cudaStream_t st, float* dst, const T* src, size_t n);
// dst[r, 0:cols] = src[r, 0:cols] widened to fp32, row strides ld_dst, ld_src (elements)
template <typename T>
void launch_convert_to_float_strided(cudaStream_t st, float* dst, int ld_dst, const T* src, int ld_src, int rows,
                                     int cols);
// c[rows, cols] (row stride ld) *= beta (beta = 0: set to 0): a GEMM with K = 0.
template <typename T>
void launch_scale_matrix(cudaStream_t st, T* c, int rows, int cols, int ld, float beta);

// ---- norm_rope.cu ----
template <typename T>
void launch_rmsnorm_forward(cudaStream_t st, T* y, float* rstd, const T* x, const T* w, int rows, int dim, float eps);
// partials: device scratch of rmsnorm_dw_chunks(rows) · dim floats (used only when dw is non-null).
int rmsnorm_dw_chunks(int rows);
template <typename T>
void launch_rmsnorm_backward(cudaStream_t st, T* dx, float* dw, const T* dy, const T* x, const T* w,
                             const float* rstd, int rows, int dim, float* partials);
// The RoPE cos/sin table: cs[2 (p · rot_dim/2 + i) + {0, 1}] = the cos and sin of p · θ^(−2i/rot_dim) for positions
// p in [0, positions), each the float rounding of the double cos/sin that math::rope_cos_sin (and the CPU)
// evaluates, so a lookup gives the bits of an evaluation. The RoPE kernels read it for positions in
// [0, positions) and evaluate the rest themselves; cs null: they evaluate every angle.
struct RopeTable {
  const float* cs = nullptr;
  int positions = 0;
};
using kernels::kRopeTablePositions;  // kernels/backend.h: 8 MiB at rot_dim 128 (fp32 cos, sin)
// cs[positions · rot_dim/2 · 2] (=) the table of (rot_dim, theta)
void launch_rope_table(cudaStream_t st, float* cs, int positions, int rot_dim, double theta);
// backward: dx (+=) Rᵀ dy; forward: y (=) R x. table: of (head_dim, theta), or empty.
template <typename T>
void launch_rope(cudaStream_t st, T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim,
                 double theta, bool backward, RopeTable table);
// Fused per-head RMSNorm + RoPE (head_norm_rope_forward/backward of kernels/backend.h): one warp per group of
// consecutive (row, head) items, each lane holding its rotate-half pairs (i, i + head_dim/2) in registers.
constexpr int kMaxNormRopeHeadDim = 256;  // even head_dim up to this: 4 pairs per lane
template <typename T>
void launch_head_norm_rope_forward(cudaStream_t st, T* y, float* rstd, const T* x, const T* w, const int32_t* pos,
                                   int rows, int heads, int head_dim, float eps, double theta, RopeTable table);
// partials: device scratch of head_norm_rope_dw_chunks(rows, heads) · head_dim floats (used only when dw is
// non-null): one row of dw partial sums per warp, summed in a fixed order afterwards.
int head_norm_rope_dw_chunks(int rows, int heads);
template <typename T>
void launch_head_norm_rope_backward(cudaStream_t st, T* dx, float* dw, const T* dy, const T* x, const T* w,
                                    const float* rstd, const int32_t* pos, int rows, int heads, int head_dim,
                                    double theta, float* partials, RopeTable table);
// y (=) partial RoPE of x over the first rot_dim dims of each head (the rest copied when y ≠ x). table: of
// (rot_dim, theta), or empty.
template <typename T>
void launch_rope_partial(cudaStream_t st, T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim,
                         int rot_dim, double theta, RopeTable table);

// ---- attention_dflash.cu / attention_causal.cu (CUDA cores), attention_dflash_tc.cu (tensor cores) ----
// The launchers without a suffix take the tensor-core kernels for bf16 where those support the shape, else the
// CUDA-core ones (always for fp32).
constexpr int kMaxHeadDim = 256;  // the warp-per-query kernels keep head_dim / 32 floats per lane
template <typename T>
void launch_dflash_attention_forward(cudaStream_t st, T* out, float* lse, const T* q, const T* k_ctx, const T* v_ctx,
                                     const T* k_blk, const T* v_blk, const int32_t* anchors,
                                     const DFlashAttentionShape& s);
// delta: device scratch [n_blocks·block, heads] floats (rowsum(dO ⊙ O), shared by the two backward kernels).
template <typename T>
void launch_dflash_attention_backward(cudaStream_t st, T* dq, T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk,
                                      const T* dout, const T* out, const float* lse, const T* q, const T* k_ctx,
                                      const T* v_ctx, const T* k_blk, const T* v_blk, const int32_t* anchors,
                                      const DFlashAttentionShape& s, float* delta);
// The same, always on the CUDA-core kernels (attention_dflash.cu): the fp32 path, and the reference of the
// tensor-core kernels (attention_dflash_tc.cu) that the two launchers above use for bf16 when they can.
template <typename T>
void launch_dflash_attention_forward_cores(cudaStream_t st, T* out, float* lse, const T* q, const T* k_ctx,
                                           const T* v_ctx, const T* k_blk, const T* v_blk, const int32_t* anchors,
                                           const DFlashAttentionShape& s);
template <typename T>
void launch_dflash_attention_backward_cores(cudaStream_t st, T* dq, T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk,
                                            const T* dout, const T* out, const float* lse, const T* q,
                                            const T* k_ctx, const T* v_ctx, const T* k_blk, const T* v_blk,
                                            const int32_t* anchors, const DFlashAttentionShape& s, float* delta);
// Tensor cores (bf16 only): head_dim 64, 128 or 256, heads a multiple of kv_heads, block · heads / kv_heads ≤ 512,
// every tensor 16-byte aligned (null pointers are not checked).
bool dflash_attention_tc_supports(const DFlashAttentionShape& s, std::initializer_list<const void*> tensors);
void launch_dflash_attention_forward_tc(cudaStream_t st, bf16* out, float* lse, const bf16* q, const bf16* k_ctx,
                                        const bf16* v_ctx, const bf16* k_blk, const bf16* v_blk,
                                        const int32_t* anchors, const DFlashAttentionShape& s);
void launch_dflash_attention_backward_tc(cudaStream_t st, bf16* dq, bf16* dk_ctx, bf16* dv_ctx, bf16* dk_blk,
                                         bf16* dv_blk, const bf16* dout, const bf16* out, const float* lse,
                                         const bf16* q, const bf16* k_ctx, const bf16* v_ctx, const bf16* k_blk,
                                         const bf16* v_blk, const int32_t* anchors, const DFlashAttentionShape& s,
                                         float* delta);
template <typename T>
void launch_attention_causal_forward(cudaStream_t st, T* out, const T* q, const T* k, const T* v, int S,
                                     int q_heads, int kv_heads, int head_dim);
// query row i at position past + i sees keys 0 .. past + i of k, v [past + n, KVH, D]. splits > 1 (split-K over
// the keys, on the tensor-core and the CUDA-core kernel) needs `scratch`: device memory of
// attention_cached_split_scratch_floats(n, q_heads, head_dim, splits) floats, used only by this call's kernels.
template <typename T>
void launch_attention_cached_forward(cudaStream_t st, T* out, const T* q, const T* k, const T* v, int n, int past,
                                     int q_heads, int kv_heads, int head_dim, int splits = 1,
                                     float* scratch = nullptr);
// The same on the CUDA-core kernel always; and on tensor cores (bf16: head_dim 64, 128 or 256, q_heads a multiple of
// kv_heads, every tensor 16-byte aligned), which the launcher above takes for bf16 when it can.
template <typename T>
void launch_attention_cached_forward_cores(cudaStream_t st, T* out, const T* q, const T* k, const T* v, int n,
                                           int past, int q_heads, int kv_heads, int head_dim, int splits = 1,
                                           float* scratch = nullptr);
// Split-K of the CUDA-core cached attention: the splits for a shape (the tensor-core policy's rule over blocks of
// 16 query rows × one head and key tiles of 32; 1 for prefill and short caches), and the split count
// launch_attention_cached_forward<T> takes for a call: the tensor-core policy where that kernel runs (bf16, its
// shapes, 16-byte aligned tensors), else this one. The scratch: attention_cached_split_scratch_floats (the same
// layout for both kernels).
int attention_cached_splits_cores(int n, int past, int q_heads, int head_dim);
template <typename T>
int attention_cached_forward_splits(int n, int past, int q_heads, int kv_heads, int head_dim,
                                    std::initializer_list<const void*> tensors);
bool attention_causal_tc_supports(int q_heads, int kv_heads, int head_dim, std::initializer_list<const void*> tensors);
// Split-K of the tensor-core cached attention (flash-decoding): the number of key splits for a shape, a pure
// function of it (1: unsplit; prefill and short caches; the launcher uses exactly these), and the scratch they
// take (0 for splits ≤ 1): a partial output [splits, n, q_heads, head_dim] and (max, sum) [splits, n, q_heads, 2],
// in floats. Asked for other splits, the launcher may use fewer (whole-tile ranges of equal length, never an
// empty one for the longest query tile), never more.
int attention_cached_splits(int n, int past, int q_heads, int kv_heads, int head_dim);
size_t attention_cached_split_scratch_floats(int n, int q_heads, int head_dim, int splits);
void launch_attention_cached_forward_tc(cudaStream_t st, bf16* out, const bf16* q, const bf16* k, const bf16* v,
                                        int n, int past, int q_heads, int kv_heads, int head_dim, int splits = 1,
                                        float* scratch = nullptr);

// ---- deltanet.cu (Gated DeltaNet, forward only) ----
// tail: [K−1, C] carried inputs (null: zeros, nothing kept), updated after the conv.
template <typename T>
void launch_causal_conv1d_silu(cudaStream_t st, T* y, const T* x, const T* w, T* tail, int S, int C, int K);
template <typename T>
void launch_l2norm(cudaStream_t st, T* x, int rows, int dim, float eps, float scale);
template <typename T>
void launch_gated_rmsnorm(cudaStream_t st, T* y, const T* x, const T* z, const T* w, int rows, int dim, float eps);
template <typename T>
void launch_deltanet_gates(cudaStream_t st, float* g, float* beta, const T* a, const T* b, const T* a_log,
                           const T* dt_bias, int rows, int heads);
constexpr int kMaxDeltaKeyDim = 256;  // the delta-rule kernel stages k_t, q_t in shared memory, 2 per thread
// bf16 calls the chunked kernels take (kernels/delta_rule_chunks.h) run chunk-parallel in `scratch` (device memory
// of kernels::gated_delta_rule_scratch_bytes<bf16>, kernels/backend.h); the rest per token (scratch unused).
template <typename T>
void launch_gated_delta_rule(cudaStream_t st, T* out, const T* q, const T* k, const T* v, const float* g,
                             const float* beta, float* state, int S, int k_heads, int v_heads, int dk, int dv,
                             void* scratch);

// ---- argmax.cu ----
template <typename T>
void launch_argmax_rows(cudaStream_t st, int32_t* index, float* value, const T* x, int rows, int cols);

// ---- vocab_loss_rows.cu ----
template <typename T>
void launch_vocab_loss_row_stats(cudaStream_t st, const T* z, const T* u, int n, int V, const int32_t* labels,
                                 const float* weights, const VocabLossCoeffs& coeffs, int top_k, VocabLossRow* rows,
                                 VocabLossRowValues* values);
template <typename T>
void launch_vocab_loss_row_grad(cudaStream_t st, T* z, const T* u, int n, int V, const int32_t* labels,
                                const float* weights, const VocabLossRow* rows, double grad_scale,
                                const VocabLossCoeffs& coeffs);

// ---- adamw.cu ----
void launch_adamw(cudaStream_t st, float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask,
                  size_t n, const AdamWCoeffs& k);
void launch_scale_f32(cudaStream_t st, float* x, float s, size_t n);
// Σ x² in double: kSumSquaresBlocks fixed partials, then one fixed reduction into result[0] (device memory).
// partials: device scratch of kSumSquaresBlocks doubles.
constexpr int kSumSquaresBlocks = 512;
void launch_sum_squares(cudaStream_t st, const float* x, size_t n, double* partials, double* result);

}  // namespace dflash::kernels::cuda
