// The CUDA backend: the kernel contracts of kernels/backend.h over cuBLASLt (gemm_lt) and the kernels of
// kernels/cuda/*.cu (launch.h). T = float (the fp32 path) or bf16 (fp32 accumulation; A = float).
// Every call is enqueued on the ExecContext's stream (a CudaContext's, kernels/cuda/context.h); launch and CUDA
// failures become dflash::Error here, in host code. Unverified on GPU (this code was compiled, never run on one).
// Scratch (rmsnorm dw partials, attention delta, sum_squares partials) comes from the context's workspace arena
// when it has room, else from a buffer the backend owns: a backend must not be used from two streams at once.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/launch.h"
#include "lib/core/error.h"

namespace dflash::kernels {

namespace {

using cuda::DType;

// kernels::bf16, the storage type the models use, is cuda::bf16 (__nv_bfloat16) bit for bit: the backend's T is the
// public type and the kernels compute in D = device_t<T>.
static_assert(sizeof(bf16) == sizeof(cuda::bf16) && alignof(bf16) == alignof(cuda::bf16),
              "kernels::bf16 must have __nv_bfloat16's layout");
template <typename T>
using device_t = std::conditional_t<std::is_same_v<T, bf16>, cuda::bf16, T>;

// A launch argument as the kernels take it: pointers to kernels::bf16 become pointers to cuda::bf16; the rest pass.
template <typename X>
auto device_arg(X x) {
  if constexpr (std::is_same_v<X, bf16*>) return reinterpret_cast<cuda::bf16*>(x);
  else if constexpr (std::is_same_v<X, const bf16*>) return reinterpret_cast<const cuda::bf16*>(x);
  else return x;
}
// launch(args...) with every argument through device_arg.
template <typename Launch, typename... Args>
void on_device(Launch&& launch, Args... args) {
  launch(device_arg(args)...);
}

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, bf16> ? DType::bf16 : DType::f32;
}

cudaStream_t stream_of(ExecContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// Device scratch for one call: from the context's arena (rewound when this object dies: later work on the same
// stream is ordered after the kernels that used it) or from the backend's own growing buffer.
class Scratch {
 public:
  Scratch(ExecContext& ctx, Buffer& own, std::mutex& own_mutex, size_t bytes) {
    Arena* a = ctx.workspace;
    if (a && a->kind() == MemoryKind::device && a->capacity() - a->used() >= Arena::footprint(bytes)) {
      arena_ = a;
      mark_ = a->mark();
      ptr_ = a->alloc_bytes(bytes);
      return;
    }
    std::lock_guard<std::mutex> lock(own_mutex);
    if (own.bytes() < bytes) {
      // the old buffer may still be in use by queued kernels of this stream
      DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
      own = Buffer(MemoryKind::device, bytes);
    }
    ptr_ = own.data();
  }
  ~Scratch() {
    if (arena_) arena_->rewind(mark_);
  }
  template <typename U>
  U* as() const { return static_cast<U*>(ptr_); }

 private:
  Arena* arena_ = nullptr;
  Arena::Mark mark_ = 0;
  void* ptr_ = nullptr;
};

template <typename T>
class CudaBackend final : public Backend<T> {
 public:
  using A = acc_t<T>;
  using D = device_t<T>;
  static_assert(std::is_same_v<A, float>, "the CUDA backend keeps statistics and weight gradients in fp32");

  // The backend's own stream, cuBLASLt handle and workspace, on the calling thread's current device.
  CudaBackend() : own_(std::make_unique<cuda::CudaContext>(current_device())) {}

  const char* name() const override { return "cuda"; }
  MemoryKind memory() const override { return MemoryKind::device; }
  ExecContext& context() override { return own_->exec(); }

  void upload(ExecContext& ctx, void* dst, const void* src, size_t bytes) override {
    if (bytes) DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(ctx)));
  }
  // Synchronises before returning (simple over fast): the host may read dst right away.
  void download(ExecContext& ctx, void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(ctx)));
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
  }
  void copy(ExecContext& ctx, void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src)
      DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(ctx)));
  }
  void zero(ExecContext& ctx, void* dst, size_t bytes) override {
    if (bytes) DFLASH_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_of(ctx)));
  }
  void synchronize(ExecContext& ctx) override { DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx))); }
  // cudaErrorNotReady: still running; anything else (success or an error) ends the wait: synchronize() reports it
  bool idle(ExecContext& ctx) override { return cudaStreamQuery(stream_of(ctx)) != cudaErrorNotReady; }
  void convert_from_float(ExecContext& ctx, T* dst, const float* src, size_t n) override {
    if constexpr (std::is_same_v<T, float>) {
      if (n && static_cast<const void*>(dst) != static_cast<const void*>(src))
        DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_of(ctx)));
    } else {
      on_device(cuda::launch_convert_from_float<D>, stream_of(ctx), dst, src, n);
    }
  }
  void convert_to_float(ExecContext& ctx, float* dst, const T* src, size_t n) override {
    if constexpr (std::is_same_v<T, float>) {
      if (n && static_cast<const void*>(dst) != static_cast<const void*>(src))
        DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_of(ctx)));
    } else {
      on_device(cuda::launch_convert_to_float<D>, stream_of(ctx), dst, src, n);
    }
  }
  void convert_to_float_strided(ExecContext& ctx, float* dst, int ld_dst, const T* src, int ld_src, int rows,
                                int cols) override {
    if (rows <= 0 || cols <= 0) return;
    if constexpr (std::is_same_v<T, float>) {
      DFLASH_CUDA_CHECK(cudaMemcpy2DAsync(dst, sizeof(float) * size_t(ld_dst), src, sizeof(float) * size_t(ld_src),
                                          sizeof(float) * size_t(cols), size_t(rows), cudaMemcpyDeviceToDevice,
                                          stream_of(ctx)));
    } else {
      on_device(cuda::launch_convert_to_float_strided<D>, stream_of(ctx), dst, ld_dst, src, ld_src, rows, cols);
    }
  }
  void gather_rows(ExecContext& ctx, T* out, const T* in, const int32_t* rows, int n, int dim) override {
    on_device(cuda::launch_gather_rows<D>, stream_of(ctx), out, in, rows, n, dim);
  }
  void scatter_add_rows(ExecContext& ctx, T* out, const T* in, const int32_t* rows, const A* weight, int n,
                        int dim) override {
    on_device(cuda::launch_scatter_add_rows<D>, stream_of(ctx), out, in, rows, weight, n, dim);
  }
  void scale_rows(ExecContext& ctx, T* x, const A* weight, int n, int dim) override {
    on_device(cuda::launch_scale_rows<D>, stream_of(ctx), x, weight, n, dim);
  }
  void scatter_rows(ExecContext& ctx, T* out, const T* in, const int32_t* rows, int n, int dim) override {
    on_device(cuda::launch_scatter_rows<D>, stream_of(ctx), out, in, rows, n, dim);
  }

  void copy_strided(ExecContext& ctx, T* dst, int ld_dst, const T* src, int ld_src, int rows, int cols) override {
    if (rows <= 0 || cols <= 0) return;
    DFLASH_CUDA_CHECK(cudaMemcpy2DAsync(dst, sizeof(T) * size_t(ld_dst), src, sizeof(T) * size_t(ld_src),
                                        sizeof(T) * size_t(cols), size_t(rows), cudaMemcpyDeviceToDevice,
                                        stream_of(ctx)));
  }

  void gemm(ExecContext& ctx, bool ta, bool tb, int M, int N, int K, double alpha, const T* a, int lda, const T* b,
            int ldb, double beta, T* c, int ldc) override {
    gemm_.run(ctx, dtype_of<T>(), dtype_of<T>(), ta, tb, M, N, K, float(alpha), a, lda, b, ldb, float(beta), c, ldc);
  }
  void linear_forward(ExecContext& ctx, T* y, const T* x, const T* W, int N, int in, int out) override {
    gemm_.run(ctx, dtype_of<T>(), dtype_of<T>(), false, true, N, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
  }
  // dW is fp32 whatever T is: bf16 products accumulate in fp32 and add into the fp32 gradient.
  void linear_backward(ExecContext& ctx, T* dx, A* dW, const T* dy, const T* x, const T* W, int N, int in,
                       int out) override {
    if (dx) gemm_.run(ctx, dtype_of<T>(), dtype_of<T>(), false, false, N, in, out, 1.0f, dy, out, W, in, 1.0f, dx, in);
    if (dW) gemm_.run(ctx, dtype_of<T>(), DType::f32, true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
  }

  void rmsnorm_forward(ExecContext& ctx, T* y, A* rstd, const T* x, const T* w, int rows, int dim,
                       double eps) override {
    on_device(cuda::launch_rmsnorm_forward<D>, stream_of(ctx), y, rstd, x, w, rows, dim, float(eps));
  }
  void rmsnorm_backward(ExecContext& ctx, T* dx, A* dw, const T* dy, const T* x, const T* w, const A* rstd, int rows,
                        int dim) override {
    const size_t bytes = dw ? sizeof(float) * size_t(cuda::rmsnorm_dw_chunks(rows)) * size_t(dim) : 0;
    Scratch partials(ctx, scratch_, scratch_mutex_, bytes > 0 ? bytes : 1);
    on_device(cuda::launch_rmsnorm_backward<D>, stream_of(ctx), dx, dw, dy, x, w, rstd, rows, dim,
              partials.as<float>());
  }
  void head_norm_rope_forward(ExecContext& ctx, T* y, A* rstd, const T* x, const T* w, const int32_t* pos, int rows,
                              int heads, int head_dim, double eps, double theta) override {
    check_norm_rope_head_dim(head_dim);
    on_device(cuda::launch_head_norm_rope_forward<D>, stream_of(ctx), y, rstd, x, w, pos, rows, heads, head_dim,
              float(eps), theta, rope_table(ctx, head_dim, theta));
  }
  void head_norm_rope_backward(ExecContext& ctx, T* dx, A* dw, const T* dy, const T* x, const T* w, const A* rstd,
                               const int32_t* pos, int rows, int heads, int head_dim, double theta) override {
    check_norm_rope_head_dim(head_dim);
    const size_t bytes =
        dw ? sizeof(float) * size_t(cuda::head_norm_rope_dw_chunks(rows, heads)) * size_t(head_dim) : 0;
    Scratch partials(ctx, scratch_, scratch_mutex_, bytes > 0 ? bytes : 1);
    on_device(cuda::launch_head_norm_rope_backward<D>, stream_of(ctx), dx, dw, dy, x, w, rstd, pos, rows, heads,
              head_dim, theta, partials.as<float>(), rope_table(ctx, head_dim, theta));
  }
  void rope_forward(ExecContext& ctx, T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim,
                    double theta) override {
    on_device(cuda::launch_rope<D>, stream_of(ctx), y, x, pos, rows, heads, head_dim, theta, false,
              rope_table(ctx, head_dim, theta));
  }
  void rope_backward(ExecContext& ctx, T* dx, const T* dy, const int32_t* pos, int rows, int heads, int head_dim,
                     double theta) override {
    on_device(cuda::launch_rope<D>, stream_of(ctx), dx, dy, pos, rows, heads, head_dim, theta, true,
              rope_table(ctx, head_dim, theta));
  }
  void swiglu_forward(ExecContext& ctx, T* h, const T* gate, const T* up, size_t n) override {
    on_device(cuda::launch_swiglu_forward<D>, stream_of(ctx), h, gate, up, n);
  }
  void swiglu_backward(ExecContext& ctx, T* dgate, T* dup, const T* dh, const T* gate, const T* up,
                       size_t n) override {
    on_device(cuda::launch_swiglu_backward<D>, stream_of(ctx), dgate, dup, dh, gate, up, n);
  }
  void residual_forward(ExecContext& ctx, T* out, const T* a, const T* b, size_t n) override {
    on_device(cuda::launch_residual<D>, stream_of(ctx), out, a, b, n);
  }
  void accumulate(ExecContext& ctx, T* y, const T* x, size_t n) override {
    on_device(cuda::launch_accumulate<D>, stream_of(ctx), y, x, n);
  }
  void scale(ExecContext& ctx, T* x, double s, size_t n) override {
    on_device(cuda::launch_scale<D>, stream_of(ctx), x, float(s), n);
  }
  void embedding_forward(ExecContext& ctx, T* out, const T* table, const int32_t* ids, int rows, int dim,
                         int vocab) override {
    on_device(cuda::launch_gather_rows<D>, stream_of(ctx), out, table, ids, rows, dim);
  }

  void dflash_attention_forward(ExecContext& ctx, T* out, A* lse, const T* q, const T* k_ctx, const T* v_ctx,
                                const T* k_blk, const T* v_blk, const int32_t* anchors,
                                const DFlashAttentionShape& shape) override {
    check_head_dim(shape.head_dim);
    on_device(cuda::launch_dflash_attention_forward<D>, stream_of(ctx), out, lse, q, k_ctx, v_ctx, k_blk, v_blk,
              anchors, shape);
  }
  void dflash_attention_backward(ExecContext& ctx, T* dq, T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk, const T* dout,
                                 const T* out, const A* lse, const T* q, const T* k_ctx, const T* v_ctx,
                                 const T* k_blk, const T* v_blk, const int32_t* anchors,
                                 const DFlashAttentionShape& shape) override {
    check_head_dim(shape.head_dim);
    const size_t queries = size_t(shape.n_blocks) * shape.block * shape.heads;
    Scratch delta(ctx, scratch_, scratch_mutex_, sizeof(float) * (queries > 0 ? queries : 1));
    on_device(cuda::launch_dflash_attention_backward<D>, stream_of(ctx), dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout,
              out, lse, q,
                                           k_ctx, v_ctx, k_blk, v_blk, anchors, shape, delta.as<float>());
  }
  void attention_causal_forward(ExecContext& ctx, T* out, const T* q, const T* k, const T* v, int S, int q_heads,
                                int kv_heads, int head_dim) override {
    check_head_dim(head_dim);
    on_device(cuda::launch_attention_causal_forward<D>, stream_of(ctx), out, q, k, v, S, q_heads, kv_heads, head_dim);
  }

  void attention_cached_forward(ExecContext& ctx, T* out, const T* q, const T* k, const T* v, int n, int past,
                                int q_heads, int kv_heads, int head_dim) override {
    check_head_dim(head_dim);
    // decode / verify over a long cache: split-K (on tensor cores for bf16 where they run, else on the CUDA-core
    // kernel), its partials in scratch (the context's arena, else the backend's buffer, which grows only when a
    // larger split is first seen)
    const int splits = cuda::attention_cached_forward_splits<D>(n, past, q_heads, kv_heads, head_dim, {out, q, k, v});
    if (splits == 1)
      return on_device(cuda::launch_attention_cached_forward<D>, stream_of(ctx), out, q, k, v, n, past, q_heads,
                       kv_heads, head_dim, 1, static_cast<float*>(nullptr));
    const size_t floats = cuda::attention_cached_split_scratch_floats(n, q_heads, head_dim, splits);
    Scratch partials(ctx, scratch_, scratch_mutex_, sizeof(float) * floats);
    on_device(cuda::launch_attention_cached_forward<D>, stream_of(ctx), out, q, k, v, n, past, q_heads, kv_heads,
              head_dim, splits, partials.as<float>());
  }
  // Tree verification runs in dflash_eval's host-side loop on the CPU backend: no device kernel (yet).
  bool supports(Feature f, int head_dim) const override {
    if (f == Feature::head_norm_rope) return norm_rope_takes(head_dim);
    return f != Feature::tree_attention;
  }
  void attention_tree_forward(ExecContext&, T*, const T*, const T*, const T*, const int32_t*, int, int, int, int,
                              int) override {
    DFLASH_FAIL("the CUDA backend has no tree attention (supports(Feature::tree_attention) is false); verify trees on "
                "the CPU backend");
  }
  void sigmoid_gate(ExecContext& ctx, T* x, const T* gate, size_t n) override {
    on_device(cuda::launch_sigmoid_gate<D>, stream_of(ctx), x, gate, n);
  }
  void rope_partial_forward(ExecContext& ctx, T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim,
                            int rot_dim, double theta) override {
    on_device(cuda::launch_rope_partial<D>, stream_of(ctx), y, x, pos, rows, heads, head_dim, rot_dim, theta,
              rope_table(ctx, rot_dim, theta));
  }
  void l2norm_forward(ExecContext& ctx, T* x, int rows, int dim, double eps, double scale) override {
    on_device(cuda::launch_l2norm<D>, stream_of(ctx), x, rows, dim, float(eps), float(scale));
  }
  void causal_conv1d_silu_forward(ExecContext& ctx, T* y, const T* x, const T* w, T* tail, int S, int C,
                                  int K) override {
    on_device(cuda::launch_causal_conv1d_silu<D>, stream_of(ctx), y, x, w, tail, S, C, K);
  }
  void deltanet_gates_forward(ExecContext& ctx, A* g, A* beta, const T* a, const T* b, const T* a_log,
                              const T* dt_bias, int rows, int heads) override {
    on_device(cuda::launch_deltanet_gates<D>, stream_of(ctx), g, beta, a, b, a_log, dt_bias, rows, heads);
  }
  void gated_delta_rule_forward(ExecContext& ctx, T* out, const T* q, const T* k, const T* v, const A* g,
                                const A* beta, A* state, int S, int k_heads, int v_heads, int dk, int dv,
                                void* scratch) override {
    if (v_heads <= 0 || dv <= 0) return;  // an empty shard
    DFLASH_CHECK(dk >= 1 && dk <= cuda::kMaxDeltaKeyDim && k_heads >= 1 && v_heads % k_heads == 0,
                 "CUDA gated delta rule: key head dim {} (supported 1..{}), {} value heads over {} key heads (must "
                 "be a multiple)",
                 dk, cuda::kMaxDeltaKeyDim, v_heads, k_heads);
    // the chunked kernels' scratch: the caller's (the target plans it), else the context's arena or the backend's
    const size_t bytes = gated_delta_rule_scratch_bytes<T>(S, k_heads, v_heads, dk, dv);
    if (bytes == 0 || scratch)
      return on_device(cuda::launch_gated_delta_rule<D>, stream_of(ctx), out, q, k, v, g, beta, state, S, k_heads,
                       v_heads, dk, dv, scratch);
    Scratch own(ctx, scratch_, scratch_mutex_, bytes);
    on_device(cuda::launch_gated_delta_rule<D>, stream_of(ctx), out, q, k, v, g, beta, state, S, k_heads, v_heads, dk,
              dv, own.as<void>());
  }
  void gated_rmsnorm_forward(ExecContext& ctx, T* y, const T* x, const T* z, const T* w, int rows, int dim,
                             double eps) override {
    on_device(cuda::launch_gated_rmsnorm<D>, stream_of(ctx), y, x, z, w, rows, dim, float(eps));
  }
  void argmax_rows(ExecContext& ctx, int32_t* index, A* value, const T* x, int rows, int cols) override {
    on_device(cuda::launch_argmax_rows<D>, stream_of(ctx), index, value, x, rows, cols);
  }

  void vocab_loss_row_stats(ExecContext& ctx, const T* z, const T* u, int n, int V, const int32_t* labels,
                            const A* weights, const VocabLossCoeffs& coeffs, int top_k, VocabLossRow* rows,
                            VocabLossRowValues* values) override {
    on_device(cuda::launch_vocab_loss_row_stats<D>, stream_of(ctx), z, u, n, V, labels, weights, coeffs, top_k, rows,
              values);
  }
  void vocab_loss_row_grad(ExecContext& ctx, T* z, const T* u, int n, int V, const int32_t* labels, const A* weights,
                           const VocabLossRow* rows, double grad_scale, const VocabLossCoeffs& coeffs) override {
    on_device(cuda::launch_vocab_loss_row_grad<D>, stream_of(ctx), z, u, n, V, labels, weights, rows, grad_scale,
              coeffs);
  }

  void adamw_step(ExecContext& ctx, float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask,
                  size_t n, const AdamWCoeffs& k) override {
    on_device(cuda::launch_adamw, stream_of(ctx), params, grads, m, v, decay_mask, n, k);
  }
  // Synchronises (the result is a host double).
  double sum_squares(ExecContext& ctx, const float* x, size_t n) override {
    Scratch partials(ctx, scratch_, scratch_mutex_, sizeof(double) * (cuda::kSumSquaresBlocks + 1));
    double* d = partials.as<double>();
    on_device(cuda::launch_sum_squares, stream_of(ctx), x, n, d, d + cuda::kSumSquaresBlocks);
    double result = 0;
    download(ctx, &result, d + cuda::kSumSquaresBlocks, sizeof result);
    return result;
  }
  void scale_master(ExecContext& ctx, float* x, double s, size_t n) override {
    on_device(cuda::launch_scale_f32, stream_of(ctx), x, float(s), n);
  }

 private:
  // the fused head norm + RoPE kernel: each lane holds 4 rotate-half pairs of an even head_dim
  static bool norm_rope_takes(int head_dim) {
    return head_dim >= 2 && head_dim <= cuda::kMaxNormRopeHeadDim && head_dim % 2 == 0;
  }
  static void check_norm_rope_head_dim(int head_dim) {
    DFLASH_CHECK(norm_rope_takes(head_dim),
                 "CUDA head norm + RoPE: head_dim {} must be even, 2..{} (each lane holds 4 rotate-half pairs)",
                 head_dim, cuda::kMaxNormRopeHeadDim);
  }
  static void check_head_dim(int head_dim) {
    DFLASH_CHECK(head_dim >= 1 && head_dim <= cuda::kMaxHeadDim,
                 "CUDA attention: head_dim {} is outside what the warp-per-query kernels support (1..{})", head_dim,
                 cuda::kMaxHeadDim);
  }

  // The RoPE cos/sin table of (rot_dim, theta) (cuda::RopeTable): made on first use, on a stream of its own that is
  // then synchronised once (a later call may come on another stream), and kept for the backend's life. Not on the
  // caller's stream: work queued there may wait for a stream-ordered TP all-reduce (lib/model/target.cpp), which
  // only the transport's bounded poll may wait for; the table depends on nothing queued. A model has
  // one or two (rot_dim, theta) pairs, so every forward and backward looks its angles up instead of evaluating them
  // in double (the fused kernels did so once per (row, run of ≤ 8 heads) and lane). No allocation after a pair's
  // first call.
  cuda::RopeTable rope_table(ExecContext& ctx, int rot_dim, double theta) {
    if (rot_dim < 2) return {};
    std::lock_guard<std::mutex> lock(rope_mutex_);
    for (const RopeTableEntry& e : rope_tables_)
      if (e.rot_dim == rot_dim && e.theta == theta) return {static_cast<const float*>(e.cs.data()), e.positions};
    const int positions = cuda::kRopeTablePositions;
    RopeTableEntry e{rot_dim, theta, positions, Buffer(MemoryKind::device, kernels::rope_table_bytes(rot_dim))};
    cudaStream_t own = nullptr;
    DFLASH_CUDA_CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
    on_device(cuda::launch_rope_table, own, static_cast<float*>(e.cs.data()), positions, rot_dim, theta);
    const cudaError_t done = cudaStreamSynchronize(own);
    cudaStreamDestroy(own);
    DFLASH_CUDA_CHECK(done);
    rope_tables_.push_back(std::move(e));
    return {static_cast<const float*>(rope_tables_.back().cs.data()), positions};
  }

  static int current_device() {
    int d = 0;
    DFLASH_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  }

  std::unique_ptr<cuda::CudaContext> own_;
  cuda::LtGemm gemm_;
  Buffer scratch_;
  std::mutex scratch_mutex_;
  struct RopeTableEntry {
    int rot_dim = 0;
    double theta = 0;
    int positions = 0;
    Buffer cs;  // [positions, rot_dim/2] (cos, sin) floats
  };
  std::vector<RopeTableEntry> rope_tables_;  // grows by a pair's first call; entries never move their buffers
  std::mutex rope_mutex_;
};

void require_device() {
  DFLASH_USER_CHECK(cuda_available(),
                    "the CUDA device was asked for (run.device: cuda, --device cuda), but no CUDA device is visible "
                    "(cudaGetDeviceCount found none); check "
                    "nvidia-smi and CUDA_VISIBLE_DEVICES, or run on the CPU (run.device: cpu, --device cpu)");
}

}  // namespace

template <typename T>
std::unique_ptr<Backend<T>> make_cuda_backend() {
  require_device();
  return std::make_unique<CudaBackend<T>>();
}
template std::unique_ptr<Backend<float>> make_cuda_backend<float>();
template std::unique_ptr<Backend<bf16>> make_cuda_backend<bf16>();

}  // namespace dflash::kernels
