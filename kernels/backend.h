#pragma once
// The kernel contracts of dflash_mpi: every model (drafter forward/backward, vocab loss, AdamW, the target's
// forward) is written once over this interface; kernels/cpu (BLAS + OpenMP) and kernels/cuda (cuBLASLt + CUDA) implement it.
//
// Rules every implementation keeps:
//   * Pointers are in the backend's memory (memory()): host for the CPU, device for CUDA. Small host-side
//     arguments (shapes, scalars, the attention shape) are passed by value.
//   * Outputs marked (=) are overwritten, (+=) accumulated; callers zero accumulators once per step.
//   * Kernels never throw and never validate user input: the orchestration in lib/model validates first.
//   * Calls are ordered on the context's stream; results are visible to the host only after synchronize().
//   * T is the activation and weight type (float, double on the CPU; float, bf16 on CUDA; kernels/bf16.h is the
//     storage type, so the models never see CUDA). Statistics (RMSNorm rstd, attention lse) and weight gradients
//     use A = acc_t<T> (float for float/bf16, double for double).
//   * An op a backend lacks, or takes only at some shapes, is named by a Feature: supports(f, shape) says so before
//     the call (the op then throws).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "kernels/attention_shape.h"
#include "kernels/bf16.h"
#include "kernels/delta_rule_chunks.h"
#include "kernels/device.h"
#include "kernels/math/adamw.h"  // AdamWCoeffs
#include "kernels/vocab_loss_rows.h"
#include "lib/core/exec_context.h"

namespace dflash::kernels {

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};
template <typename T>
using acc_t = typename Acc<T>::type;

// The ops not every backend has, or has at every shape (ask supports() first; the op then throws).
enum class Feature {
  tree_attention,  // attention_tree_forward: the CPU only (speculative tree verification, a host-side evaluation)
  head_norm_rope,  // head_norm_rope_forward / _backward at a head_dim: the CPU any, CUDA an even one up to 256
};

template <typename T>
class Backend {
 public:
  using A = acc_t<T>;
  virtual ~Backend() = default;

  virtual const char* name() const = 0;  // "cpu" or "cuda"
  // Whether this backend runs `f` (at head_dim, for the ops whose support depends on it).
  virtual bool supports(Feature f, int head_dim = 0) const { return true; }
  virtual MemoryKind memory() const = 0;
  // The backend's own execution context (CUDA: its stream, cuBLASLt handle and workspace; the CPU:
  // host_exec_context(), which has no state).
  virtual ExecContext& context() = 0;

  // ---- data movement ----
  virtual void upload(ExecContext& ctx, void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(ExecContext& ctx, void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(ExecContext& ctx, void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(ExecContext& ctx, void* dst, size_t bytes) = 0;
  virtual void synchronize(ExecContext& ctx) = 0;
  // True when the work queued on ctx has completed (a poll, never blocks; CPU: always). An error of that work is
  // reported by synchronize().
  virtual bool idle(ExecContext&) { return true; }
  // dst[n] (=) src[n] rounded to T (bf16: round to nearest even); both in backend memory. How fp32 master weights
  // become compute weights and fp32 features become activations.
  virtual void convert_from_float(ExecContext& ctx, T* dst, const float* src, size_t n) = 0;
  // dst[n] (=) src[n] as fp32 (bf16, float: exact; double: rounded to nearest); both in backend memory. How outputs
  // computed in T (the target's taps and final hidden) reach fp32 consumers.
  virtual void convert_to_float(ExecContext& ctx, float* dst, const T* src, size_t n) = 0;
  // The same over a row block: dst[r, 0:cols] (=) src[r, 0:cols] as fp32 for r < rows, row strides ld_dst, ld_src
  // (elements): writes one tap's [S, H] into its columns of the taps [S, n_taps·H] without a pass through the host.
  virtual void convert_to_float_strided(ExecContext& ctx, float* dst, int ld_dst, const T* src, int ld_src, int rows,
                                        int cols) = 0;
  // out[i, :] (=) in[rows[i], :] for i < n; rows in backend memory.
  virtual void gather_rows(ExecContext& ctx, T* out, const T* in, const int32_t* rows, int n, int dim) = 0;
  // out[rows[i], :] (=) in[i, :] for i < n; rows distinct; other rows of out untouched.
  virtual void scatter_rows(ExecContext& ctx, T* out, const T* in, const int32_t* rows, int n, int dim) = 0;
  // out[rows[i], :] (+=) weight[i] · in[i, :] for i < n (computed in A, one rounding to T); rows distinct (an expert's
  // tokens: no two writers of a row, no atomics), weight and rows in backend memory. The MoE's weighted add back.
  virtual void scatter_add_rows(ExecContext& ctx, T* out, const T* in, const int32_t* rows, const A* weight, int n,
                                int dim) = 0;
  // x[i, :] (*=) weight[i] for i < n (in A, one rounding), weight in backend memory: per-row gates (the MoE
  // hybrids' shared-expert gate).
  virtual void scale_rows(ExecContext& ctx, T* x, const A* weight, int n, int dim) = 0;
  // dst[r, 0:cols] (=) src[r, 0:cols] for r < rows, with row strides ld_dst, ld_src (elements): splits fused
  // projections into per-head arrays (Qwen3.5's per-head query | gate rows, Gated DeltaNet's q | k | v channels).
  // dst and src must not overlap.
  virtual void copy_strided(ExecContext& ctx, T* dst, int ld_dst, const T* src, int ld_src, int rows, int cols) = 0;

  // ---- dense ----
  // C[M, N] = alpha · op(A) op(B) + beta · C, row-major, op(X) = Xᵀ when trans_x; ld* are row strides.
  virtual void gemm(ExecContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, double alpha, const T* a,
                    int lda, const T* b, int ldb, double beta, T* c, int ldc) = 0;
  // y[N, out] (=) x[N, in] · Wᵀ, W [out, in] (PyTorch layout).
  virtual void linear_forward(ExecContext& ctx, T* y, const T* x, const T* W, int N, int in, int out) = 0;
  // dx[N, in] (+=) dy · W (skipped when dx is null); dW[out, in] (+=) dyᵀ · x (skipped when null: frozen).
  virtual void linear_backward(ExecContext& ctx, T* dx, A* dW, const T* dy, const T* x, const T* W, int N, int in,
                               int out) = 0;

  // ---- normalisation, rotary, MLP, residual, embedding ----
  // y[rows, dim] (=) x · rsqrt(mean(x²) + eps) · w; rstd[rows] (=). y may alias x.
  virtual void rmsnorm_forward(ExecContext& ctx, T* y, A* rstd, const T* x, const T* w, int rows, int dim,
                               double eps) = 0;
  // dx (+=), dw (+=, skipped when null). x is the forward input.
  virtual void rmsnorm_backward(ExecContext& ctx, T* dx, A* dw, const T* dy, const T* x, const T* w, const A* rstd,
                                int rows, int dim) = 0;
  // y[rows, heads, head_dim] (=) rope(x) at positions pos[rows] (rotate-half layout); y may alias x.
  virtual void rope_forward(ExecContext& ctx, T* y, const T* x, const int32_t* pos, int rows, int heads,
                            int head_dim, double theta) = 0;
  // dx (+=) Rᵀ dy.
  virtual void rope_backward(ExecContext& ctx, T* dx, const T* dy, const int32_t* pos, int rows, int heads,
                             int head_dim, double theta) = 0;
  // Per-head q/k norm and RoPE in one pass: y[rows, heads, head_dim] (=) rope(rmsnorm(x)), i.e. rmsnorm_forward
  // over rows·heads rows of head_dim, then rope_forward at positions pos[rows]; rstd[rows·heads] (=), as
  // rmsnorm_forward's. y may alias x. CUDA: head_dim even, ≤ 256; the normed value is not rounded to T in between.
  virtual void head_norm_rope_forward(ExecContext& ctx, T* y, A* rstd, const T* x, const T* w, const int32_t* pos,
                                      int rows, int heads, int head_dim, double eps, double theta) = 0;
  // Its adjoint: dx (+=) rmsnorm_backward(Rᵀ dy), dw[head_dim] (+=, deterministic; skipped when null). x is the
  // forward input, rstd the forward's. dx must not alias dy.
  virtual void head_norm_rope_backward(ExecContext& ctx, T* dx, A* dw, const T* dy, const T* x, const T* w,
                                       const A* rstd, const int32_t* pos, int rows, int heads, int head_dim,
                                       double theta) = 0;
  // h (=) silu(gate) · up
  virtual void swiglu_forward(ExecContext& ctx, T* h, const T* gate, const T* up, size_t n) = 0;
  // dgate (+=), dup (+=)
  virtual void swiglu_backward(ExecContext& ctx, T* dgate, T* dup, const T* dh, const T* gate, const T* up,
                               size_t n) = 0;
  // out (=) a + b; out may alias a or b.
  virtual void residual_forward(ExecContext& ctx, T* out, const T* a, const T* b, size_t n) = 0;
  // y (+=) x
  virtual void accumulate(ExecContext& ctx, T* y, const T* x, size_t n) = 0;
  // x (=) x · s
  virtual void scale(ExecContext& ctx, T* x, double s, size_t n) = 0;
  // out[rows, dim] (=) table[ids[r], :], table [vocab, dim]; ids validated by the caller (in [0, vocab)).
  virtual void embedding_forward(ExecContext& ctx, T* out, const T* table, const int32_t* ids, int rows, int dim,
                                 int vocab) = 0;

  // ---- attention ----
  // DFlash drafter attention (kernels/attention_shape.h): out (=), lse (=).
  virtual void dflash_attention_forward(ExecContext& ctx, T* out, A* lse, const T* q, const T* k_ctx,
                                        const T* v_ctx, const T* k_blk, const T* v_blk, const int32_t* anchors,
                                        const DFlashAttentionShape& shape) = 0;
  // dq, dk_ctx, dv_ctx, dk_blk, dv_blk (+=).
  virtual void dflash_attention_backward(ExecContext& ctx, T* dq, T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk,
                                         const T* dout, const T* out, const A* lse, const T* q, const T* k_ctx,
                                         const T* v_ctx, const T* k_blk, const T* v_blk, const int32_t* anchors,
                                         const DFlashAttentionShape& shape) = 0;
  // Causal GQA attention of the target (prefill): out[S, NH, D] (=).
  virtual void attention_causal_forward(ExecContext& ctx, T* out, const T* q, const T* k, const T* v, int S,
                                        int q_heads, int kv_heads, int head_dim) = 0;

  // ---- the frozen target's forward (no backward) ----
  // Causal GQA attention over a KV cache: query row i sits at position past + i and sees keys 0 .. past + i.
  // q [n, q_heads, head_dim]; k, v [past + n, kv_heads, head_dim]: the cache with these n rows already appended;
  // out [n, q_heads, head_dim] (=). Q head h reads KV head h / (q_heads / kv_heads). past = 0 is a prefill from
  // position 0, n = 1 a decoding step. Scale 1/sqrt(head_dim); softmax statistics in A.
  virtual void attention_cached_forward(ExecContext& ctx, T* out, const T* q, const T* k, const T* v, int n,
                                        int past, int q_heads, int kv_heads, int head_dim) = 0;
  // Tree attention of speculative verification (kernels/cpu/attention_tree.h): query row i is tree node i after
  // `past` cached positions and sees the cache and its own ancestors (parents[n] on the host: parents[0] = −1,
  // parents[i] < i); on a chain it equals attention_cached_forward bit for bit. Feature::tree_attention.
  virtual void attention_tree_forward(ExecContext& ctx, T* out, const T* q, const T* k, const T* v,
                                      const int32_t* parents, int n, int past, int q_heads, int kv_heads,
                                      int head_dim) = 0;
  // x[n] (=) x · sigmoid(gate[n]): the output gate of Qwen3.5's attention.
  virtual void sigmoid_gate(ExecContext& ctx, T* x, const T* gate, size_t n) = 0;
  // Partial RoPE (kernels/cpu/rope_partial.h): the first rot_dim (even, ≤ head_dim) dims of each head rotate
  // (rotate-half within them, angle pos · theta^(−2i/rot_dim)), the rest pass through. y [rows, heads, head_dim]
  // (=); y may alias x. rot_dim = head_dim is rope_forward.
  virtual void rope_partial_forward(ExecContext& ctx, T* y, const T* x, const int32_t* pos, int rows, int heads,
                                    int head_dim, int rot_dim, double theta) = 0;
  // x[rows, dim] (= in place) x · scale / sqrt(Σ x² + eps): Gated DeltaNet's q/k normalisation.
  virtual void l2norm_forward(ExecContext& ctx, T* x, int rows, int dim, double eps, double scale) = 0;
  // y[S, C] (=) silu(Σ_{j<K} w[c, j] · in[t + j, c]), in = [tail ; x]: the depthwise causal conv of Gated DeltaNet.
  // tail [K−1, C] holds the K−1 inputs before x[0] (zeros for a fresh sequence) and is overwritten with
  // the last K−1 rows of [tail ; x]; null: zeros before x[0], nothing kept. x [S, C], w [C, K]. y must not alias x.
  virtual void causal_conv1d_silu_forward(ExecContext& ctx, T* y, const T* x, const T* w, T* tail, int S, int C,
                                          int K) = 0;
  // Gated DeltaNet's per-token gates from the projections a, b [rows, heads] and the per-head a_log, dt_bias
  // [heads]: beta (=) sigmoid(b); g (=) −exp(a_log) · softplus(a + dt_bias) (softplus linear above 20, as torch).
  // g, beta [rows, heads] in A (they compound over the sequence in the recurrence).
  virtual void deltanet_gates_forward(ExecContext& ctx, A* g, A* beta, const T* a, const T* b, const T* a_log,
                                      const T* dt_bias, int rows, int heads) = 0;
  // The gated delta rule (kernels/cpu/gated_deltanet.h): out [S, v_heads, dv] (=); q, k [S, k_heads, dk]
  // (L2-normed, q scaled by 1/sqrt(dk)); v [S, v_heads, dv]; g, beta [S, v_heads]. state [v_heads, dk, dv] in A:
  // the state before position 0 on entry and after position S−1 on return (carried across calls); null: zero.
  // Value head h reads key head h / (v_heads / k_heads). scratch: backend memory of
  // gated_delta_rule_scratch_bytes<T>(S, k_heads, v_heads, dk, dv) bytes (below) the call may overwrite, or null
  // (the backend then takes it from the context's workspace arena or a buffer of its own).
  virtual void gated_delta_rule_forward(ExecContext& ctx, T* out, const T* q, const T* k, const T* v, const A* g,
                                        const A* beta, A* state, int S, int k_heads, int v_heads, int dk, int dv,
                                        void* scratch) = 0;
  // y[rows, dim] (=) w · x · rsqrt(mean(x²) + eps) · silu(z): Gated DeltaNet's output norm. y may alias x.
  virtual void gated_rmsnorm_forward(ExecContext& ctx, T* y, const T* x, const T* z, const T* w, int rows, int dim,
                                     double eps) = 0;
  // Greedy decoding: index[r] (=) the first column of the largest value of row r of x [rows, cols] (NaNs never
  // win; −1 when a row has no non-NaN value), value[r] (=) that value (−inf when none). index, value in backend
  // memory.
  virtual void argmax_rows(ExecContext& ctx, int32_t* index, A* value, const T* x, int rows, int cols) = 0;

  // ---- vocab loss row passes (one chunk of n rows over logits already in memory) ----
  // z [n, V] drafter logits, u [n, V] target logits or null (no KL). For each row with weights[r] > 0:
  // rows[r] (=) its statistics and values[r] (=) CE/KL/CAP(/TV/LK/NLA)/correct/top-k/finite; rows with w = 0:
  // values zeroed. coeffs: τ, and whether a TV / LK / NLA term needs the overlap pass (u given, τ = 1).
  virtual void vocab_loss_row_stats(ExecContext& ctx, const T* z, const T* u, int n, int V, const int32_t* labels,
                                    const A* weights, const VocabLossCoeffs& coeffs, int top_k, VocabLossRow* rows,
                                    VocabLossRowValues* values) = 0;
  // z [n, V] (= in place) grad_scale · w_r · ∂ℓ_r/∂z_r from the forward statistics; u as above.
  virtual void vocab_loss_row_grad(ExecContext& ctx, T* z, const T* u, int n, int V, const int32_t* labels,
                                   const A* weights, const VocabLossRow* rows, double grad_scale,
                                   const VocabLossCoeffs& coeffs) = 0;

  // ---- optimizer (fp32 master weights and state, whatever T is) ----
  // params, m, v (=) one AdamW update from grads; decay_mask [n] of 0/1.
  virtual void adamw_step(ExecContext& ctx, float* params, const float* grads, float* m, float* v,
                          const uint8_t* decay_mask, size_t n, const AdamWCoeffs& coeffs) = 0;
  // Σ x² accumulated in double, in a fixed order (deterministic from run to run).
  virtual double sum_squares(ExecContext& ctx, const float* x, size_t n) = 0;
  // x (=) x · s on fp32 master gradients
  virtual void scale_master(ExecContext& ctx, float* x, double s, size_t n) = 0;
};

// The CPU backend (kernels/cpu); always available.
// Tuning of the CPU backend (the results of one setting are reproducible; different settings may differ in the last
// bits): query rows per block of the blocked causal attention (attention_causal_forward and the prefill of
// attention_cached_forward), whose scores hold block × S values.
struct CpuBackendOptions {
  int attention_block = 64;
};
template <typename T>
std::unique_ptr<Backend<T>> make_cpu_backend(const CpuBackendOptions& options = {});
// One shared CPU backend per type and the host execution context (no state; the CPU backend's context()): for tests,
// tools and benchmarks.
template <typename T>
Backend<T>& cpu_backend();
ExecContext& host_exec_context();

// The CUDA backend (kernels/cuda), T = float or bf16; throws dflash::Error in a build without CUDA or on a machine
// without a GPU. Uses the calling thread's current device.
template <typename T>
std::unique_ptr<Backend<T>> make_cuda_backend();

// The CUDA backend's RoPE cos/sin table, one per (rot_dim, θ) a model uses, kept in device memory for the backend's
// life: fp32 cos and sin of the first kRopeTablePositions positions (later ones are evaluated). Memory plans count it.
constexpr int kRopeTablePositions = 16384;
constexpr size_t rope_table_bytes(int rot_dim) {
  return sizeof(float) * 2 * size_t(kRopeTablePositions) * size_t(rot_dim / 2);
}
// The one factory the models and tools use: the backend of `device` computing in T, or a user error naming what
// does not exist (backend_refusal in kernels/device.h: bf16 on the CPU, double on CUDA; CUDA in a build without it
// or on a machine without a GPU).
template <typename T>
std::unique_ptr<Backend<T>> make_backend(Device device, const CpuBackendOptions& cpu_options = {});

// The scratch bytes Backend<T>::gated_delta_rule_forward uses for a call of S tokens: bf16 (CUDA) runs the
// chunk-parallel kernels where they take the call (kernels/delta_rule_chunks.h: γ, W and every chunk's start state;
// 75.9 MB at S 8192 with 12 value heads of dk = dv = 128), which the target's memory plan counts; the rest need none.
template <typename T>
size_t gated_delta_rule_scratch_bytes(int S, int k_heads, int v_heads, int dk, int dv) {
  if constexpr (std::is_same_v<T, bf16>)
    return delta_rule_chunked_takes(S, k_heads, v_heads, dk, dv) ? delta_rule_chunked_scratch(S, v_heads, dk, dv).bytes
                                                                 : 0;
  else
    return 0;
}
// True when this build has the CUDA backend and a CUDA device is visible.
bool cuda_available();
// The name of the calling thread's current CUDA device ("NVIDIA H200"); "" without one.
std::string cuda_device_name();
// Makes GPU (node_local_rank mod visible devices) current on the calling thread and returns its ordinal: ranks of
// one node spread over its GPUs, and share them when there are more ranks than GPUs. Throws (a user error naming
// the fix) without the CUDA backend or without a device.
int bind_cuda_device(int node_local_rank);

}  // namespace dflash::kernels
