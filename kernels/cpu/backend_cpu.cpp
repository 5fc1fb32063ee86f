// The CPU backend: the kernel contracts of kernels/backend.h over the BLAS + OpenMP kernels of kernels/cpu.
// Host memory throughout; calls complete before they return, so synchronize() has nothing to wait for.
// The vocab-loss row loops must vectorise: GCC will not if-convert the selects inside loss_exp while FP operations
// may trap (its default), so this translation unit says they do not. No code here relies on FP traps.
#pragma GCC optimize("no-trapping-math")
#include <cmath>
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/backend.h"
#include <vector>

#include "kernels/cpu/attention_causal.h"
#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/attention_dflash.h"
#include "kernels/cpu/attention_tree.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gated_deltanet.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/rope_partial.h"
#include "kernels/cpu/vocab_loss_rows.h"
#include "kernels/math/adamw.h"
#include "lib/core/error.h"

namespace dflash::kernels {

namespace {

template <typename T>
class CpuBackend final : public Backend<T> {
 public:
  using A = acc_t<T>;
  static_assert(std::is_same_v<A, T>, "the CPU backend computes statistics and gradients in T");

  explicit CpuBackend(const CpuBackendOptions& options = {}) : options_(options) {
    DFLASH_CHECK(options.attention_block >= 1, "CPU backend: attention_block {} must be ≥ 1",
                 options.attention_block);
  }

  const char* name() const override { return "cpu"; }
  MemoryKind memory() const override { return MemoryKind::host; }
  ExecContext& context() override { return host_exec_context(); }  // no state: every CPU backend shares it

  void upload(ExecContext&, void* dst, const void* src, size_t bytes) override { copy_bytes(dst, src, bytes); }
  void download(ExecContext&, void* dst, const void* src, size_t bytes) override { copy_bytes(dst, src, bytes); }
  void copy(ExecContext&, void* dst, const void* src, size_t bytes) override { copy_bytes(dst, src, bytes); }
  void zero(ExecContext&, void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void synchronize(ExecContext&) override {}
  void convert_from_float(ExecContext&, T* dst, const float* src, size_t n) override {
    if constexpr (std::is_same_v<T, float>) {
      copy_bytes(dst, src, n * sizeof(float));
    } else {
      for (size_t i = 0; i < n; ++i) dst[i] = T(src[i]);
    }
  }
  void convert_to_float(ExecContext&, float* dst, const T* src, size_t n) override {
    if constexpr (std::is_same_v<T, float>) {
      copy_bytes(dst, src, n * sizeof(float));
    } else {
      for (size_t i = 0; i < n; ++i) dst[i] = float(src[i]);
    }
  }
  void convert_to_float_strided(ExecContext& ctx, float* dst, int ld_dst, const T* src, int ld_src, int rows,
                                int cols) override {
    for (int r = 0; r < rows; ++r)
      convert_to_float(ctx, dst + size_t(r) * ld_dst, src + size_t(r) * ld_src, size_t(cols > 0 ? cols : 0));
  }
  void gather_rows(ExecContext&, T* out, const T* in, const int32_t* rows, int n, int dim) override {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) std::memcpy(out + size_t(i) * dim, in + size_t(rows[i]) * dim, sizeof(T) * dim);
  }
  void scatter_rows(ExecContext&, T* out, const T* in, const int32_t* rows, int n, int dim) override {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) std::memcpy(out + size_t(rows[i]) * dim, in + size_t(i) * dim, sizeof(T) * dim);
  }
  void scatter_add_rows(ExecContext&, T* out, const T* in, const int32_t* rows, const A* weight, int n,
                        int dim) override {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) {  // rows distinct: one writer per output row
      T* o = out + size_t(rows[i]) * dim;
      const T* x = in + size_t(i) * dim;
      const A w = weight[i];
      for (int j = 0; j < dim; ++j) o[j] = T(A(o[j]) + w * A(x[j]));
    }
  }
  void scale_rows(ExecContext&, T* x, const A* weight, int n, int dim) override {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) {
      T* r = x + size_t(i) * dim;
      for (int j = 0; j < dim; ++j) r[j] = T(A(r[j]) * weight[i]);
    }
  }

  void copy_strided(ExecContext&, T* dst, int ld_dst, const T* src, int ld_src, int rows, int cols) override {
    for (int r = 0; r < rows; ++r) std::memcpy(dst + size_t(r) * ld_dst, src + size_t(r) * ld_src, sizeof(T) * cols);
  }

  void gemm(ExecContext&, bool ta, bool tb, int M, int N, int K, double alpha, const T* a, int lda, const T* b,
            int ldb, double beta, T* c, int ldc) override {
    cpu::gemm<T>(ta, tb, M, N, K, T(alpha), a, lda, b, ldb, T(beta), c, ldc);
  }
  void linear_forward(ExecContext&, T* y, const T* x, const T* W, int N, int in, int out) override {
    cpu::linear_forward(y, x, W, N, in, out);
  }
  void linear_backward(ExecContext&, T* dx, A* dW, const T* dy, const T* x, const T* W, int N, int in,
                       int out) override {
    cpu::linear_backward(dx, dW, dy, x, W, N, in, out);
  }

  void rmsnorm_forward(ExecContext&, T* y, A* rstd, const T* x, const T* w, int rows, int dim, double eps) override {
    cpu::rmsnorm_forward(y, rstd, x, w, rows, dim, T(eps));
  }
  void rmsnorm_backward(ExecContext&, T* dx, A* dw, const T* dy, const T* x, const T* w, const A* rstd, int rows,
                        int dim) override {
    cpu::rmsnorm_backward(dx, dw, dy, x, w, rstd, rows, dim);
  }
  void rope_forward(ExecContext&, T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim,
                    double theta) override {
    cpu::rope_forward(y, x, pos, rows, heads, head_dim, theta);
  }
  void rope_backward(ExecContext&, T* dx, const T* dy, const int32_t* pos, int rows, int heads, int head_dim,
                     double theta) override {
    cpu::rope_backward(dx, dy, pos, rows, heads, head_dim, theta);
  }
  void head_norm_rope_forward(ExecContext&, T* y, A* rstd, const T* x, const T* w, const int32_t* pos, int rows,
                              int heads, int head_dim, double eps, double theta) override {
    cpu::head_norm_rope_forward(y, rstd, x, w, pos, rows, heads, head_dim, T(eps), theta);
  }
  void head_norm_rope_backward(ExecContext&, T* dx, A* dw, const T* dy, const T* x, const T* w, const A* rstd,
                               const int32_t* pos, int rows, int heads, int head_dim, double theta) override {
    cpu::head_norm_rope_backward(dx, dw, dy, x, w, rstd, pos, rows, heads, head_dim, theta);
  }
  void swiglu_forward(ExecContext&, T* h, const T* gate, const T* up, size_t n) override {
    cpu::swiglu_forward(h, gate, up, n);
  }
  void swiglu_backward(ExecContext&, T* dgate, T* dup, const T* dh, const T* gate, const T* up, size_t n) override {
    cpu::swiglu_backward(dgate, dup, dh, gate, up, n);
  }
  void residual_forward(ExecContext&, T* out, const T* a, const T* b, size_t n) override {
    cpu::residual_forward(out, a, b, n);
  }
  void accumulate(ExecContext&, T* y, const T* x, size_t n) override { cpu::accumulate(y, x, n); }
  void scale(ExecContext&, T* x, double s, size_t n) override {
    const T f = T(s);
    for (size_t i = 0; i < n; ++i) x[i] *= f;
  }
  void embedding_forward(ExecContext&, T* out, const T* table, const int32_t* ids, int rows, int dim,
                         int vocab) override {
    cpu::embedding_forward(out, table, ids, rows, dim, vocab);
  }

  void dflash_attention_forward(ExecContext&, T* out, A* lse, const T* q, const T* k_ctx, const T* v_ctx,
                                const T* k_blk, const T* v_blk, const int32_t* anchors,
                                const DFlashAttentionShape& shape) override {
    cpu::dflash_attention_forward(out, lse, q, k_ctx, v_ctx, k_blk, v_blk, anchors, shape);
  }
  void dflash_attention_backward(ExecContext&, T* dq, T* dk_ctx, T* dv_ctx, T* dk_blk, T* dv_blk, const T* dout,
                                 const T* out, const A* lse, const T* q, const T* k_ctx, const T* v_ctx,
                                 const T* k_blk, const T* v_blk, const int32_t* anchors,
                                 const DFlashAttentionShape& shape) override {
    cpu::dflash_attention_backward(dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx, k_blk, v_blk,
                                   anchors, shape);
  }
  void attention_causal_forward(ExecContext&, T* out, const T* q, const T* k, const T* v, int S, int q_heads,
                                int kv_heads, int head_dim) override {
    cpu::attention_causal_forward(out, q, k, v, S, q_heads, kv_heads, head_dim, options_.attention_block);
  }

  // A prefill from position 0 takes the blocked GEMM kernel (options_.attention_block query rows per block), rows
  // after a cache the one-row-at-a-time decode kernel.
  void attention_cached_forward(ExecContext&, T* out, const T* q, const T* k, const T* v, int n, int past,
                                int q_heads, int kv_heads, int head_dim) override {
    if (past == 0)
      cpu::attention_causal_forward(out, q, k, v, n, q_heads, kv_heads, head_dim, options_.attention_block);
    else
      cpu::attention_decode_forward(out, q, k, v, n, past, q_heads, kv_heads, head_dim);
  }
  void attention_tree_forward(ExecContext&, T* out, const T* q, const T* k, const T* v, const int32_t* parents, int n,
                              int past, int q_heads, int kv_heads, int head_dim) override {
    cpu::attention_tree_forward<T>(out, q, k, v, parents, n, past, q_heads, kv_heads, head_dim);
  }
  void sigmoid_gate(ExecContext&, T* x, const T* gate, size_t n) override { cpu::sigmoid_gate(x, gate, n); }
  void rope_partial_forward(ExecContext&, T* y, const T* x, const int32_t* pos, int rows, int heads, int head_dim,
                            int rot_dim, double theta) override {
    copy_bytes(y, x, sizeof(T) * size_t(rows) * heads * head_dim);  // the CPU kernel rotates in place
    cpu::rope_partial_forward(y, pos, rows, heads, head_dim, rot_dim, theta);
  }
  void l2norm_forward(ExecContext&, T* x, int rows, int dim, double eps, double scale) override {
    cpu::l2norm_forward(x, rows, dim, T(eps), T(scale));
  }
  // The CPU kernel convolves one sequence from zeros: run it over [tail ; x] and keep the last S outputs.
  void causal_conv1d_silu_forward(ExecContext&, T* y, const T* x, const T* w, T* tail, int S, int C,
                                  int K) override {
    if (!tail) {
      cpu::causal_conv1d_silu_forward(y, x, w, S, C, K);
      return;
    }
    const size_t carried = size_t(K - 1) * C, fresh = size_t(S) * C;
    std::vector<T> in(carried + fresh), out(carried + fresh);
    std::copy_n(tail, carried, in.begin());
    std::copy_n(x, fresh, in.begin() + long(carried));
    cpu::causal_conv1d_silu_forward(out.data(), in.data(), w, K - 1 + S, C, K);
    std::copy_n(out.begin() + long(carried), fresh, y);
    std::copy(in.end() - long(carried), in.end(), tail);
  }
  void deltanet_gates_forward(ExecContext&, A* g, A* beta, const T* a, const T* b, const T* a_log,
                              const T* dt_bias, int rows, int heads) override {
    cpu::deltanet_gates_forward(g, beta, a, b, a_log, dt_bias, rows, heads);
  }
  void gated_delta_rule_forward(ExecContext&, T* out, const T* q, const T* k, const T* v, const A* g, const A* beta,
                                A* state, int S, int k_heads, int v_heads, int dk, int dv, void*) override {
    cpu::gated_delta_rule_forward(out, q, k, v, g, beta, S, k_heads, v_heads, dk, dv, 64, state);
  }
  void gated_rmsnorm_forward(ExecContext&, T* y, const T* x, const T* z, const T* w, int rows, int dim,
                             double eps) override {
    cpu::gated_rmsnorm_forward(y, x, z, w, rows, dim, T(eps));
  }
  void argmax_rows(ExecContext&, int32_t* index, A* value, const T* x, int rows, int cols) override {
    cpu::argmax_rows(index, value, x, rows, cols);
  }

  void vocab_loss_row_stats(ExecContext&, const T* z, const T* u, int n, int V, const int32_t* labels,
                            const A* weights, const VocabLossCoeffs& coeffs, int top_k, VocabLossRow* rows,
                            VocabLossRowValues* values) override {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) {
      VocabLossRowValues v;
      if (weights[i] > 0) {
        cpu::row_stats<T>(z + size_t(i) * V, u ? u + size_t(i) * V : nullptr, V, labels[i], coeffs, top_k, rows[i],
                          v);
        v.scored = 1;
      }
      values[i] = v;
    }
  }
  void vocab_loss_row_grad(ExecContext&, T* z, const T* u, int n, int V, const int32_t* labels, const A* weights,
                           const VocabLossRow* rows, double grad_scale, const VocabLossCoeffs& coeffs) override {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i)
      cpu::row_grad<T>(z + size_t(i) * V, u ? u + size_t(i) * V : nullptr, V, labels[i], rows[i],
                       grad_scale * double(weights[i]), coeffs);
  }

  void adamw_step(ExecContext&, float* params, const float* grads, float* m, float* v, const uint8_t* decay_mask,
                  size_t n, const AdamWCoeffs& k) override {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) math::adamw_update(params[i], grads[i], m[i], v[i], decay_mask[i] != 0, k);
  }
  double sum_squares(ExecContext&, const float* x, size_t n) override {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
    return s;
  }
  void scale_master(ExecContext&, float* x, double s, size_t n) override {
    const float f = float(s);
    for (size_t i = 0; i < n; ++i) x[i] *= f;
  }

 private:
  CpuBackendOptions options_;

  static void copy_bytes(void* dst, const void* src, size_t bytes) {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
};

}  // namespace

template <typename T>
std::unique_ptr<Backend<T>> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend<T>>(options);
}
template std::unique_ptr<Backend<float>> make_cpu_backend<float>(const CpuBackendOptions&);
template std::unique_ptr<Backend<double>> make_cpu_backend<double>(const CpuBackendOptions&);

template <typename T>
Backend<T>& cpu_backend() {
  static CpuBackend<T> backend;
  return backend;
}
template Backend<float>& cpu_backend<float>();
template Backend<double>& cpu_backend<double>();

ExecContext& host_exec_context() {
  static thread_local ExecContext ctx;  // nothing in it changes; thread_local so no thread shares a mutable object
  return ctx;
}

}  // namespace dflash::kernels
