// dflash_bench cuda [loss|drafter|attention|all]: the CUDA backend's vocab loss and a drafter forward+backward, each against
// the bound made of its own cuBLASLt GEMMs, timed alone in the same run at the same shapes (ratio = bound / time:
// 1.0 would mean every non-GEMM kernel is free). Prints "skipped: ..." and exits 0 without a GPU or without the
// CUDA backend, so scripts can call it anywhere.
//   loss:    per chunk of C rows: z = X_c Wᵀ, u = Y_c Wᵀ (target logits, KL), row statistics, row gradient in
//            place, dX_c = dZ W. fused: 3 vocab GEMMs per chunk; recompute: a statistics pass (2 GEMMs) then
//            the gradient pass recomputes z and u (3 more): 5. The LM head W is frozen (no dW GEMM).
//   drafter: `layers` DFlash layers over NB = anchors·block rows and a context of S positions (pre-norm
//            attention with q/k norm and RoPE, SwiGLU MLP), forward then backward with fp32 weight gradients;
//            the attention's share of the total is reported. Not the lib/model drafter (which moves onto the
//            backend separately): the same kernel sequence, for timing only.
//   attention (not in `all`): the DFlash attention alone, tensor-core and CUDA-core kernels, against the rate of
//            one cuBLASLt bf16 GEMM in the same run.
//   decode (not in `all`): the target's cached attention at decode and verify, unsplit against split-K.
//   delta (not in `all`): the target's gated delta rule alone at the heaviest TP-5 shard of Qwen3.6-27B: the
//            chunk-parallel bf16 kernels, each pass timed by CUDA events, against the per-token kernel.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "apps/dflash_bench/bench.h"
#include "kernels/backend.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/core/timer.h"

#if DFLASH_WITH_CUDA
#include "kernels/cuda/check.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/deltanet_chunked.h"
#include "kernels/cuda/launch.h"
#endif

namespace dflash::bench {

namespace {

// The options; a size shared by several benchmarks with different defaults is optional (each takes its own).
struct CudaBenchOptions {
  std::optional<int> T, H, V, chunk, reps, seq, anchors, block, hidden, layers, heads, kv_heads, head_dim,
      intermediate, taps, window, cores;
};

}  // namespace

#if DFLASH_WITH_CUDA
namespace {

using kernels::Backend;
using kernels::bf16;

// On the emulated GPU every time is the CPU emulation's: labelled so that nobody reads it as a GPU figure.
#if defined(DFLASH_CUDA_EMULATED)
constexpr const char* kFigureNote = "  [emulated: not a GPU figure]";
#else
constexpr const char* kFigureNote = "";
#endif

// A device array of n elements of U (uninitialised unless filled).
template <typename U>
struct Dev {
  Buffer buf;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t count) : buf(MemoryKind::device, std::max<size_t>(count, 1) * sizeof(U)), n(count) {}
  U* p() const { return buf.as<U>(); }
};
// The same bits as the kernels' type, for the direct launches (the backend takes kernels::bf16).
kernels::cuda::bf16* dev(bf16* p) { return reinterpret_cast<kernels::cuda::bf16*>(p); }
template <typename T>
T* dev(T* p) {
  return p;
}

template <typename T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16(x);
  else
    return x;
}

// Fills a device array with sd·N(0,1) values: one host slice of 2^22 normals, uploaded over and over from a
// rotating offset (timing needs realistic magnitudes, not 10^9 fresh draws, which would take a minute).
template <typename T, typename B>
void fill_normal(B& be, ExecContext& ctx, Dev<T>& d, double sd, uint64_t seed) {
  const size_t slice = size_t(1) << 22;
  Rng rng(seed);
  std::vector<T> h(2 * slice);
  for (size_t i = 0; i < slice; ++i) h[i] = h[i + slice] = from_float<T>(float(sd * rng.normal()));
  for (size_t off = 0, k = 0; off < d.n; off += slice, ++k) {
    const size_t m = std::min(slice, d.n - off);
    be.upload(ctx, d.p() + off, h.data() + (k * 7919) % slice, m * sizeof(T));
  }
  be.synchronize(ctx);
}

template <typename U, typename B>
void upload_vec(B& be, ExecContext& ctx, Dev<U>& d, const std::vector<U>& h) {
  be.upload(ctx, d.p(), h.data(), h.size() * sizeof(U));
}

// Best-of-reps wall seconds of fn(), synchronised on the stream, after one warm-up run.
template <typename B, typename F>
double time_best(B& be, ExecContext& ctx, int reps, F fn) {
  fn();
  be.synchronize(ctx);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    fn();
    be.synchronize(ctx);
    best = std::min(best, t.seconds());
  }
  return best;
}

// ------------------------------- vocab loss -------------------------------

template <typename T>
int loss_bench(Backend<T>& be, ExecContext& ctx, const CudaBenchOptions& args, const char* precision) {
  const int T_rows = args.T.value_or(32768), H = args.H.value_or(5120), V = args.V.value_or(248320);
  const int C = std::min(args.chunk.value_or(2048), T_rows), reps = args.reps.value_or(2);
  DFLASH_USER_CHECK(T_rows >= 1 && H >= 1 && V >= 2 && C >= 1 && reps >= 1,
                    "dflash_bench cuda loss: --T, --H, --chunk, --reps must be ≥ 1 and --V ≥ 2");
  const kernels::VocabLossCoeffs coeffs{1.0, 1.0, 0.1, 1.0};
  Dev<T> W(size_t(V) * H), X(size_t(T_rows) * H), Y(size_t(T_rows) * H), dX(size_t(T_rows) * H);
  Dev<T> z(size_t(C) * V), u(size_t(C) * V);  // the loss's scratch: 2 · chunk · V logits
  Dev<int32_t> labels(T_rows);
  Dev<float> weights(T_rows);
  Dev<kernels::VocabLossRow> rows(T_rows);
  Dev<kernels::VocabLossRowValues> values(T_rows);
  fill_normal(be, ctx, W, 3.0 / std::sqrt(double(H)), 1);
  fill_normal(be, ctx, X, 1.0, 2);
  fill_normal(be, ctx, Y, 1.0, 3);
  {
    Rng rng(4);
    std::vector<int32_t> l(T_rows);
    std::vector<float> w(T_rows);
    for (int r = 0; r < T_rows; ++r) {
      l[r] = int32_t(rng.below(uint64_t(V)));
      w[r] = float(std::exp(-(r % 31) / 7.0));
    }
    upload_vec(be, ctx, labels, l);
    upload_vec(be, ctx, weights, w);
  }
  const double grad_scale = 1.0 / T_rows;
  auto logits = [&](int r0, int n, const Dev<T>& in, Dev<T>& out) {
    be.linear_forward(ctx, out.p(), in.p() + size_t(r0) * H, W.p(), n, H, V);
  };
  auto dx_gemm = [&](int r0, int n) {  // dX_c = dZ · W
    be.gemm(ctx, false, false, n, H, V, 1.0, z.p(), V, W.p(), H, 0.0, dX.p() + size_t(r0) * H, H);
  };
  auto stats = [&](int r0, int n) {
    be.vocab_loss_row_stats(ctx, z.p(), u.p(), n, V, labels.p() + r0, weights.p() + r0, coeffs, 5, rows.p() + r0,
                            values.p() + r0);
  };
  auto grad = [&](int r0, int n) {
    be.vocab_loss_row_grad(ctx, z.p(), u.p(), n, V, labels.p() + r0, weights.p() + r0, rows.p() + r0, grad_scale,
                           coeffs);
  };
  auto run = [&](bool recompute, bool gemms_only) {
    for (int r0 = 0; r0 < T_rows; r0 += C) {
      const int n = std::min(C, T_rows - r0);
      logits(r0, n, X, z);
      logits(r0, n, Y, u);
      if (!gemms_only) stats(r0, n);
      if (!recompute) {
        if (!gemms_only) grad(r0, n);
        dx_gemm(r0, n);
      }
    }
    if (!recompute) return;
    for (int r0 = 0; r0 < T_rows; r0 += C) {
      const int n = std::min(C, T_rows - r0);
      logits(r0, n, X, z);
      logits(r0, n, Y, u);
      if (!gemms_only) grad(r0, n);
      dx_gemm(r0, n);
    }
  };
  std::printf("cuda loss: %s T=%d H=%d V=%d chunk=%d (CE + KL τ=1 + CAP 0.1), best of %d%s\n", precision, T_rows, H,
              V, C, reps, kFigureNote);
  for (bool recompute : {false, true}) {
    const double bound = time_best(be, ctx, reps, [&] { run(recompute, true); });
    const double total = time_best(be, ctx, reps, [&] { run(recompute, false); });
    const int gemms = recompute ? 5 : 3;
    const double flops = gemms * 2.0 * T_rows * double(H) * V;
    std::printf("  %-9s time %.3f s (%.1f TFLOP/s)  GEMMs alone %.3f s (%.1f TFLOP/s)  ratio %.3f%s\n",
                recompute ? "recompute" : "fused", total, flops / total * 1e-12, bound, flops / bound * 1e-12,
                bound / total, kFigureNote);
  }
  std::printf("  scratch   logits 2 x chunk x V x %zu B = %.1f MiB (flat in T) + row state %.1f MiB\n", sizeof(T),
              2.0 * C * V * sizeof(T) / 1048576.0,
              double(T_rows) * (sizeof(kernels::VocabLossRow) + sizeof(kernels::VocabLossRowValues)) / 1048576.0);
  return 0;
}

// ------------------------------- drafter -------------------------------

struct DrafterShape {
  int S, N, B, H, layers, NH, KVH, D, I, taps, window;
  int NB() const { return N * B; }
};

// One DFlash layer's weights (T), fp32 weight gradients and saved activations.
template <typename T>
struct Layer {
  Dev<T> w_in, w_post, q_norm, k_norm, Wq, Wk, Wv, Wo, Wg, Wu, Wd;
  Dev<float> dw_in, dw_post, dq_norm, dk_norm, dWq, dWk, dWv, dWo, dWg, dWu, dWd;
  // activations
  Dev<T> h, xn, q_raw, q_n, q, kb_raw, kb_n, kb, vb, kc_raw, kc_n, kc, vc, attn, h1, xn2, gate, up, a;
  Dev<float> rstd_in, rstd_q, rstd_kb, rstd_kc, rstd_post, lse;
};

template <typename T>
int drafter_bench(Backend<T>& be, ExecContext& ctx, const CudaBenchOptions& args, const char* precision) {
  DrafterShape s;
  s.S = args.seq.value_or(32768);
  s.N = args.anchors.value_or(1024);
  s.B = args.block.value_or(32);
  s.H = args.hidden.value_or(5120);
  s.layers = args.layers.value_or(5);
  s.NH = args.heads.value_or(32);
  s.KVH = args.kv_heads.value_or(8);
  s.D = args.head_dim.value_or(128);
  s.I = args.intermediate.value_or(17408);
  s.taps = args.taps.value_or(5);
  s.window = args.window.value_or(0);
  const int reps = args.reps.value_or(2);
  DFLASH_USER_CHECK(s.S >= 2 && s.N >= 1 && s.B >= 1 && s.H >= 1 && s.layers >= 1 && s.KVH >= 1 &&
                        s.NH % s.KVH == 0 && s.D >= 2 && s.D % 2 == 0 && s.I >= 1 && s.taps >= 1 && reps >= 1,
                    "dflash_bench cuda drafter: need --heads a multiple of --kv-heads, an even --head-dim, --seq ≥ 2 "
                    "and every size ≥ 1");
  const int NB = s.NB(), QD = s.NH * s.D, KD = s.KVH * s.D;
  const double eps = 1e-6, theta = 1e6;

  // Shared inputs: taps [S, taps·H] → ctx [S, H] through fc (frozen here), block hidden [NB, H], anchors, positions.
  Dev<T> taps(size_t(s.S) * s.taps * s.H), fc(size_t(s.H) * s.taps * s.H), ctx_h(size_t(s.S) * s.H);
  Dev<T> h0(size_t(NB) * s.H), dh(size_t(NB) * s.H), dctx(size_t(s.S) * s.H), dxn(size_t(NB) * s.H);
  Dev<T> dq(size_t(NB) * QD), dkb(size_t(NB) * KD), dvb(size_t(NB) * KD), dkc(size_t(s.S) * KD), dvc(size_t(s.S) * KD);
  Dev<T> dq_n(size_t(NB) * QD), dkb_n(size_t(NB) * KD), dkc_n(size_t(s.S) * KD);
  Dev<T> dq_raw(size_t(NB) * QD), dkb_raw(size_t(NB) * KD), dkc_raw(size_t(s.S) * KD);
  Dev<T> dattn(size_t(NB) * QD), dgate(size_t(NB) * s.I), dup(size_t(NB) * s.I), da(size_t(NB) * s.I), dxn2(size_t(NB) * s.H);
  Dev<int32_t> anchors(s.N), pos_blk(NB), pos_ctx(s.S);
  fill_normal(be, ctx, taps, 1.0, 10);
  fill_normal(be, ctx, fc, 1.0 / std::sqrt(double(s.taps) * s.H), 11);
  fill_normal(be, ctx, h0, 1.0, 12);
  {
    Rng rng(13);
    std::vector<int32_t> a(s.N), pb(NB), pc(s.S);
    for (int i = 0; i < s.N; ++i) a[i] = int32_t(rng.below(uint64_t(s.S - 1)) + 1);
    std::sort(a.begin(), a.end());
    for (int r = 0; r < NB; ++r) pb[r] = a[r / s.B] + r % s.B;
    for (int i = 0; i < s.S; ++i) pc[i] = i;
    upload_vec(be, ctx, anchors, a);
    upload_vec(be, ctx, pos_blk, pb);
    upload_vec(be, ctx, pos_ctx, pc);
  }
  std::vector<Layer<T>> L(s.layers);
  for (int l = 0; l < s.layers; ++l) {
    Layer<T>& y = L[l];
    auto w = [&](Dev<T>& d, size_t n, double sd, uint64_t seed) {
      d = Dev<T>(n);
      fill_normal(be, ctx, d, sd, seed);
    };
    auto g = [&](Dev<float>& d, size_t n) {
      d = Dev<float>(n);
      be.zero(ctx, d.p(), n * sizeof(float));
    };
    const uint64_t sd0 = 100 + 20 * l;
    w(y.w_in, s.H, 0.1, sd0), w(y.w_post, s.H, 0.1, sd0 + 1), w(y.q_norm, s.D, 0.1, sd0 + 2), w(y.k_norm, s.D, 0.1, sd0 + 3);
    w(y.Wq, size_t(QD) * s.H, 0.02, sd0 + 4), w(y.Wk, size_t(KD) * s.H, 0.02, sd0 + 5), w(y.Wv, size_t(KD) * s.H, 0.02, sd0 + 6);
    w(y.Wo, size_t(s.H) * QD, 0.02, sd0 + 7), w(y.Wg, size_t(s.I) * s.H, 0.02, sd0 + 8), w(y.Wu, size_t(s.I) * s.H, 0.02, sd0 + 9);
    w(y.Wd, size_t(s.H) * s.I, 0.02, sd0 + 10);
    g(y.dw_in, s.H), g(y.dw_post, s.H), g(y.dq_norm, s.D), g(y.dk_norm, s.D), g(y.dWq, size_t(QD) * s.H);
    g(y.dWk, size_t(KD) * s.H), g(y.dWv, size_t(KD) * s.H), g(y.dWo, size_t(s.H) * QD), g(y.dWg, size_t(s.I) * s.H);
    g(y.dWu, size_t(s.I) * s.H), g(y.dWd, size_t(s.H) * s.I);
    for (Dev<T>* d : {&y.h, &y.xn, &y.h1, &y.xn2}) *d = Dev<T>(size_t(NB) * s.H);
    for (Dev<T>* d : {&y.q_raw, &y.q_n, &y.q, &y.attn}) *d = Dev<T>(size_t(NB) * QD);
    for (Dev<T>* d : {&y.kb_raw, &y.kb_n, &y.kb, &y.vb}) *d = Dev<T>(size_t(NB) * KD);
    for (Dev<T>* d : {&y.kc_raw, &y.kc_n, &y.kc, &y.vc}) *d = Dev<T>(size_t(s.S) * KD);
    for (Dev<T>* d : {&y.gate, &y.up, &y.a}) *d = Dev<T>(size_t(NB) * s.I);
    y.rstd_in = Dev<float>(NB), y.rstd_post = Dev<float>(NB), y.rstd_q = Dev<float>(size_t(NB) * s.NH);
    y.rstd_kb = Dev<float>(size_t(NB) * s.KVH), y.rstd_kc = Dev<float>(size_t(s.S) * s.KVH), y.lse = Dev<float>(size_t(NB) * s.NH);
  }
  kernels::DFlashAttentionShape ash{s.N, s.B, s.S, s.NH, s.KVH, s.D, s.window};
  // gradient scratch starts at zero: the GEMM-only and attention-only timings accumulate into it without the
  // zeroing kernels, and must not start from whatever bytes cudaMalloc returned (NaN patterns)
  for (Dev<T>* d : {&dctx, &dxn, &dq, &dkb, &dvb, &dkc, &dvc, &dq_n, &dkb_n, &dkc_n, &dq_raw, &dkb_raw, &dkc_raw,
                    &dattn, &dgate, &dup, &da, &dxn2})
    be.zero(ctx, d->p(), d->n * sizeof(T));
  for (Layer<T>& y : L)
    for (Dev<T>* d : {&y.h, &y.xn, &y.q_raw, &y.q_n, &y.q, &y.kb_raw, &y.kb_n, &y.kb, &y.vb, &y.kc_raw, &y.kc_n,
                      &y.kc, &y.vc, &y.attn, &y.h1, &y.xn2, &y.gate, &y.up, &y.a})
      be.zero(ctx, d->p(), d->n * sizeof(T));

  // what: 0 = everything, 1 = GEMMs only (the bound), 2 = attention only (its share)
  auto step = [&](int what) {
    const bool gemm = what != 2, other = what == 0, attn = what != 1;
    if (gemm) be.linear_forward(ctx, ctx_h.p(), taps.p(), fc.p(), s.S, s.taps * s.H, s.H);
    for (int l = 0; l < s.layers; ++l) {
      Layer<T>& y = L[l];
      const Dev<T>& hin = l == 0 ? h0 : L[l - 1].h1;  // (the MLP residual is folded into h1 for timing)
      if (other) be.rmsnorm_forward(ctx, y.xn.p(), y.rstd_in.p(), hin.p(), y.w_in.p(), NB, s.H, eps);
      if (gemm) {
        be.linear_forward(ctx, y.q_raw.p(), y.xn.p(), y.Wq.p(), NB, s.H, QD);
        be.linear_forward(ctx, y.kb_raw.p(), y.xn.p(), y.Wk.p(), NB, s.H, KD);
        be.linear_forward(ctx, y.vb.p(), y.xn.p(), y.Wv.p(), NB, s.H, KD);
        be.linear_forward(ctx, y.kc_raw.p(), ctx_h.p(), y.Wk.p(), s.S, s.H, KD);
        be.linear_forward(ctx, y.vc.p(), ctx_h.p(), y.Wv.p(), s.S, s.H, KD);
      }
      if (other) {
        be.rmsnorm_forward(ctx, y.q_n.p(), y.rstd_q.p(), y.q_raw.p(), y.q_norm.p(), NB * s.NH, s.D, eps);
        be.rmsnorm_forward(ctx, y.kb_n.p(), y.rstd_kb.p(), y.kb_raw.p(), y.k_norm.p(), NB * s.KVH, s.D, eps);
        be.rmsnorm_forward(ctx, y.kc_n.p(), y.rstd_kc.p(), y.kc_raw.p(), y.k_norm.p(), s.S * s.KVH, s.D, eps);
        be.rope_forward(ctx, y.q.p(), y.q_n.p(), pos_blk.p(), NB, s.NH, s.D, theta);
        be.rope_forward(ctx, y.kb.p(), y.kb_n.p(), pos_blk.p(), NB, s.KVH, s.D, theta);
        be.rope_forward(ctx, y.kc.p(), y.kc_n.p(), pos_ctx.p(), s.S, s.KVH, s.D, theta);
      }
      if (attn)
        be.dflash_attention_forward(ctx, y.attn.p(), y.lse.p(), y.q.p(), y.kc.p(), y.vc.p(), y.kb.p(), y.vb.p(),
                                    anchors.p(), ash);
      if (gemm) be.linear_forward(ctx, y.h.p(), y.attn.p(), y.Wo.p(), NB, QD, s.H);
      if (other) {
        be.residual_forward(ctx, y.h.p(), y.h.p(), hin.p(), size_t(NB) * s.H);
        be.rmsnorm_forward(ctx, y.xn2.p(), y.rstd_post.p(), y.h.p(), y.w_post.p(), NB, s.H, eps);
      }
      if (gemm) {
        be.linear_forward(ctx, y.gate.p(), y.xn2.p(), y.Wg.p(), NB, s.H, s.I);
        be.linear_forward(ctx, y.up.p(), y.xn2.p(), y.Wu.p(), NB, s.H, s.I);
      }
      if (other) be.swiglu_forward(ctx, y.a.p(), y.gate.p(), y.up.p(), size_t(NB) * s.I);
      if (gemm) be.linear_forward(ctx, y.h1.p(), y.a.p(), y.Wd.p(), NB, s.I, s.H);
      if (other) be.residual_forward(ctx, y.h1.p(), y.h1.p(), y.h.p(), size_t(NB) * s.H);
    }
    // backward from dL/dh = a fixed tensor (the loss's dX)
    if (other) be.zero(ctx, dctx.p(), dctx.n * sizeof(T));
    for (int l = s.layers - 1; l >= 0; --l) {
      Layer<T>& y = L[l];
      const Dev<T>& hin = l == 0 ? h0 : L[l - 1].h1;
      if (other) {
        for (Dev<T>* d : {&da, &dxn2, &dattn, &dxn, &dgate, &dup, &dq_n, &dkb_n, &dkc_n, &dq_raw, &dkb_raw, &dkc_raw,
                          &dq, &dkb, &dvb, &dkc, &dvc})
          be.zero(ctx, d->p(), d->n * sizeof(T));
      }
      if (gemm) be.linear_backward(ctx, da.p(), y.dWd.p(), dh.p(), y.a.p(), y.Wd.p(), NB, s.I, s.H);
      if (other) be.swiglu_backward(ctx, dgate.p(), dup.p(), da.p(), y.gate.p(), y.up.p(), size_t(NB) * s.I);
      if (gemm) {
        be.linear_backward(ctx, dxn2.p(), y.dWg.p(), dgate.p(), y.xn2.p(), y.Wg.p(), NB, s.H, s.I);
        be.linear_backward(ctx, dxn2.p(), y.dWu.p(), dup.p(), y.xn2.p(), y.Wu.p(), NB, s.H, s.I);
      }
      if (other) be.rmsnorm_backward(ctx, dh.p(), y.dw_post.p(), dxn2.p(), y.h.p(), y.w_post.p(), y.rstd_post.p(), NB, s.H);
      if (gemm) be.linear_backward(ctx, dattn.p(), y.dWo.p(), dh.p(), y.attn.p(), y.Wo.p(), NB, QD, s.H);
      if (attn)
        be.dflash_attention_backward(ctx, dq.p(), dkc.p(), dvc.p(), dkb.p(), dvb.p(), dattn.p(), y.attn.p(), y.lse.p(),
                                     y.q.p(), y.kc.p(), y.vc.p(), y.kb.p(), y.vb.p(), anchors.p(), ash);
      if (other) {
        be.rope_backward(ctx, dq_n.p(), dq.p(), pos_blk.p(), NB, s.NH, s.D, theta);
        be.rope_backward(ctx, dkb_n.p(), dkb.p(), pos_blk.p(), NB, s.KVH, s.D, theta);
        be.rope_backward(ctx, dkc_n.p(), dkc.p(), pos_ctx.p(), s.S, s.KVH, s.D, theta);
        be.rmsnorm_backward(ctx, dq_raw.p(), y.dq_norm.p(), dq_n.p(), y.q_raw.p(), y.q_norm.p(), y.rstd_q.p(), NB * s.NH, s.D);
        be.rmsnorm_backward(ctx, dkb_raw.p(), y.dk_norm.p(), dkb_n.p(), y.kb_raw.p(), y.k_norm.p(), y.rstd_kb.p(), NB * s.KVH, s.D);
        be.rmsnorm_backward(ctx, dkc_raw.p(), y.dk_norm.p(), dkc_n.p(), y.kc_raw.p(), y.k_norm.p(), y.rstd_kc.p(), s.S * s.KVH, s.D);
      }
      if (gemm) {
        be.linear_backward(ctx, dxn.p(), y.dWq.p(), dq_raw.p(), y.xn.p(), y.Wq.p(), NB, s.H, QD);
        be.linear_backward(ctx, dxn.p(), y.dWk.p(), dkb_raw.p(), y.xn.p(), y.Wk.p(), NB, s.H, KD);
        be.linear_backward(ctx, dxn.p(), y.dWv.p(), dvb.p(), y.xn.p(), y.Wv.p(), NB, s.H, KD);
        be.linear_backward(ctx, dctx.p(), y.dWk.p(), dkc_raw.p(), ctx_h.p(), y.Wk.p(), s.S, s.H, KD);
        be.linear_backward(ctx, dctx.p(), y.dWv.p(), dvc.p(), ctx_h.p(), y.Wv.p(), s.S, s.H, KD);
      }
      if (other) be.rmsnorm_backward(ctx, dh.p(), y.dw_in.p(), dxn.p(), hin.p(), y.w_in.p(), y.rstd_in.p(), NB, s.H);
    }
  };
  fill_normal(be, ctx, dh, 1e-3, 14);
  std::printf("cuda drafter: %s seq=%d anchors=%d block=%d (NB=%d) hidden=%d layers=%d heads=%d/%d head_dim=%d "
              "intermediate=%d taps=%d window=%d, best of %d%s\n",
              precision, s.S, s.N, s.B, NB, s.H, s.layers, s.NH, s.KVH, s.D, s.I, s.taps, s.window, reps, kFigureNote);
  const double bound = time_best(be, ctx, reps, [&] { step(1); });
  const double attn_t = time_best(be, ctx, reps, [&] { step(2); });
  const double total = time_best(be, ctx, reps, [&] { step(0); });
  // GEMM FLOPs: fc + per layer (q, k, v on blocks, k, v on context, o, gate, up, down) × (1 fwd + 2 bwd)
  const double layer_fwd = 2.0 * NB * s.H * (QD + 2.0 * KD) + 2.0 * s.S * s.H * 2.0 * KD + 2.0 * NB * QD * s.H +
                           3 * 2.0 * NB * s.H * double(s.I);
  const double flops = 2.0 * s.S * s.taps * double(s.H) * s.H + 3.0 * s.layers * layer_fwd;
  std::printf("  total     %.3f s  GEMMs alone %.3f s (%.1f TFLOP/s)  ratio %.3f%s\n", total, bound,
              flops / bound * 1e-12, bound / total, kFigureNote);
  std::printf("  attention fwd+bwd alone %.3f s = %.1f%% of the total%s\n", attn_t,
              100.0 * attn_t / total, kFigureNote);
  return 0;
}

// ------------------------------- attention -------------------------------

// The DFlash attention alone at the drafter's shapes: forward and backward time and TFLOP/s (nominal FLOPs: 4·D
// per visible (query, key, head) pair forward, 2.5× that backward, as FlashAttention counts them; our backward
// does 7 products per pair instead of 5, recomputing the scores in both of its passes), for the tensor-core
// kernels and the CUDA-core kernels, against the same run's cuBLASLt GEMM rate at the drafter's q projection
// shape (NB × H → NH·D): the yardstick (goals: forward ≥ 0.45 of it, backward ≥ 0.35).
int attention_bench(ExecContext& ctx, const CudaBenchOptions& args) {
  const int S = args.seq.value_or(8192), N = args.anchors.value_or(1024),
            B = args.block.value_or(32), NH = args.heads.value_or(32),
            KVH = args.kv_heads.value_or(8), D = args.head_dim.value_or(128),
            H = args.hidden.value_or(5120), window = args.window.value_or(0),
            reps = args.reps.value_or(2);
  DFLASH_USER_CHECK(S >= 2 && N >= 1 && B >= 1 && KVH >= 1 && NH % KVH == 0 && D >= 2 && H >= 1 && reps >= 1,
                    "dflash_bench cuda attention: need --heads a multiple of --kv-heads and every size ≥ 1");
  auto be = kernels::make_cuda_backend<bf16>();
  const int NB = N * B;
  const kernels::DFlashAttentionShape s{N, B, S, NH, KVH, D, window};
  Dev<bf16> q(size_t(NB) * NH * D), kc(size_t(S) * KVH * D), vc(size_t(S) * KVH * D), kb(size_t(NB) * KVH * D),
      vb(size_t(NB) * KVH * D), out(size_t(NB) * NH * D), dout(size_t(NB) * NH * D), dq(size_t(NB) * NH * D),
      dkc(size_t(S) * KVH * D), dvc(size_t(S) * KVH * D), dkb(size_t(NB) * KVH * D), dvb(size_t(NB) * KVH * D);
  Dev<float> lse(size_t(NB) * NH), delta(size_t(NB) * NH);
  Dev<int32_t> anchors(N);
  for (Dev<bf16>* d : {&q, &kc, &vc, &kb, &vb, &dout}) fill_normal(*be, ctx, *d, 1.0, 20 + d->n % 7);
  for (Dev<bf16>* d : {&dq, &dkc, &dvc, &dkb, &dvb}) be->zero(ctx, d->p(), d->n * sizeof(bf16));
  std::vector<int32_t> a(N);
  {
    Rng rng(21);
    for (int i = 0; i < N; ++i) a[i] = int32_t(rng.below(uint64_t(S - 1)) + 1);
    std::sort(a.begin(), a.end());
    upload_vec(*be, ctx, anchors, a);
  }
  const double pairs = double(kernels::dflash_attention_pairs(a.data(), s));
  const double fwd_flops = 4.0 * D * pairs, bwd_flops = 2.5 * fwd_flops;
  const bool tc = kernels::cuda::dflash_attention_tc_supports(s, {q.p(), kc.p(), vc.p(), kb.p(), vb.p(), out.p()});
  const cudaStream_t st = static_cast<cudaStream_t>(ctx.stream);
  // the yardstick: one bf16 GEMM at the q projection's shape
  Dev<bf16> x(size_t(NB) * H), w(size_t(NH) * D * H), y(size_t(NB) * NH * D);
  fill_normal(*be, ctx, x, 1.0, 22);
  fill_normal(*be, ctx, w, 0.02, 23);
  const double gemm_t = time_best(*be, ctx, reps, [&] { be->linear_forward(ctx, y.p(), x.p(), w.p(), NB, H, NH * D); });
  const double gemm_rate = 2.0 * NB * double(H) * NH * D / gemm_t;
  std::printf("cuda attention: bf16 seq=%d anchors=%d block=%d (NB=%d) heads=%d/%d head_dim=%d window=%d, %.3g "
              "visible pairs, best of %d%s\n",
              S, N, B, NB, NH, KVH, D, window, pairs, reps, kFigureNote);
  std::printf("  yardstick cuBLASLt bf16 GEMM %d x %d x %d: %.3f ms, %.1f TFLOP/s%s\n", NB, NH * D, H, gemm_t * 1e3,
              gemm_rate * 1e-12, kFigureNote);
  auto report = [&](const char* who, double fwd_t, double bwd_t) {
    std::printf("  %-13s forward %.3f ms %.1f TFLOP/s = %.3f of the GEMM rate; backward %.3f ms %.1f TFLOP/s = %.3f%s\n",
                who, fwd_t * 1e3, fwd_flops / fwd_t * 1e-12, fwd_flops / fwd_t / gemm_rate, bwd_t * 1e3,
                bwd_flops / bwd_t * 1e-12, bwd_flops / bwd_t / gemm_rate, kFigureNote);
  };
  if (tc) {
    const double f = time_best(*be, ctx, reps, [&] {
      kernels::cuda::launch_dflash_attention_forward_tc(st, dev(out.p()), lse.p(), dev(q.p()), dev(kc.p()), dev(vc.p()),
                                                        dev(kb.p()), dev(vb.p()), anchors.p(), s);
    });
    const double b = time_best(*be, ctx, reps, [&] {
      kernels::cuda::launch_dflash_attention_backward_tc(st, dev(dq.p()), dev(dkc.p()), dev(dvc.p()), dev(dkb.p()),
                                                         dev(dvb.p()), dev(dout.p()), dev(out.p()), lse.p(),
                                                         dev(q.p()), dev(kc.p()), dev(vc.p()), dev(kb.p()),
                                                         dev(vb.p()), anchors.p(), s, delta.p());
    });
    report("tensor cores", f, b);
  } else {
    std::printf("  tensor cores: not for this shape (head_dim 64/128/256, block·heads/kv_heads ≤ 512)\n");
  }
  if (args.cores.value_or(1)) {
    const double f = time_best(*be, ctx, reps, [&] {
      kernels::cuda::launch_dflash_attention_forward_cores(st, dev(out.p()), lse.p(), dev(q.p()), dev(kc.p()),
                                                           dev(vc.p()), dev(kb.p()), dev(vb.p()), anchors.p(), s);
    });
    const double b = time_best(*be, ctx, reps, [&] {
      kernels::cuda::launch_dflash_attention_backward_cores(st, dev(dq.p()), dev(dkc.p()), dev(dvc.p()), dev(dkb.p()),
                                                            dev(dvb.p()), dev(dout.p()), dev(out.p()), lse.p(),
                                                            dev(q.p()), dev(kc.p()), dev(vc.p()), dev(kb.p()),
                                                            dev(vb.p()), anchors.p(), s, delta.p());
    });
    report("CUDA cores", f, b);
  }
  return 0;
}

// ------------------------------- decode -------------------------------

// The target's cached attention (bf16, tensor cores) for a decode step (n = 1) and a verify (n = 16) over a cache
// of --seq positions at the 27B's attention shape (24 query / 4 kv heads × 256), unsplit (one thread block per
// (query tile, kv head) walking the whole cache) against split-K (attention_cached_splits's choice, plus its
// merge). Decode is bound by reading the cache: K and V, seq × kv_heads × head_dim × 2 × 2 bytes, once per step;
// the rate printed is those bytes over the time. Then the same for the fp32 path's CUDA-core kernel and its split-K.
int decode_bench(ExecContext& ctx, const CudaBenchOptions& args) {
  const int cache = args.seq.value_or(8192), NH = args.heads.value_or(24),
            KVH = args.kv_heads.value_or(4), D = args.head_dim.value_or(256),
            reps = args.reps.value_or(2);
  DFLASH_USER_CHECK(cache >= 16 && KVH >= 1 && NH % KVH == 0 && reps >= 1 &&
                        kernels::cuda::attention_causal_tc_supports(NH, KVH, D, {}),
                    "dflash_bench cuda decode: need --seq ≥ 16, --heads a multiple of --kv-heads, --head-dim 64, "
                    "128 or 256");
  auto be = kernels::make_cuda_backend<bf16>();
  Dev<bf16> k(size_t(cache) * KVH * D), v(size_t(cache) * KVH * D);
  fill_normal(*be, ctx, k, 1.0, 30);
  fill_normal(*be, ctx, v, 1.0, 31);
  const cudaStream_t st = static_cast<cudaStream_t>(ctx.stream);
  const double cache_bytes = 2.0 * cache * KVH * D * sizeof(bf16);
  std::printf("cuda decode: bf16 cached attention, cache=%d heads=%d/%d head_dim=%d, K+V %.1f MiB, best of %d%s\n",
              cache, NH, KVH, D, cache_bytes / (1 << 20), reps, kFigureNote);
  for (const int n : {1, 16}) {
    const int past = cache - n;  // the step's own n keys are the cache's last
    const int splits = kernels::cuda::attention_cached_splits(n, past, NH, KVH, D);
    Dev<bf16> q(size_t(n) * NH * D), out(size_t(n) * NH * D);
    Dev<float> scratch(kernels::cuda::attention_cached_split_scratch_floats(n, NH, D, splits));
    fill_normal(*be, ctx, q, 1.0, 32);
    auto run = [&](int s) {
      return time_best(*be, ctx, reps, [&] {
        kernels::cuda::launch_attention_cached_forward_tc(st, dev(out.p()), dev(q.p()), dev(k.p()), dev(v.p()), n,
                                                          past, NH, KVH, D, s, scratch.p());
      });
    };
    const double t1 = run(1), ts = splits > 1 ? run(splits) : t1;
    std::printf("  n=%-2d unsplit %.3f ms %.1f GB/s; %d splits %.3f ms %.1f GB/s (%.2fx)%s\n", n, t1 * 1e3,
                cache_bytes / t1 * 1e-9, splits, ts * 1e3, cache_bytes / ts * 1e-9, t1 / ts, kFigureNote);
  }
  // the fp32 path's CUDA-core kernel (one block per 16 query rows × one head), unsplit against its split-K: the
  // cache in fp32 is twice the bytes
  auto be32 = kernels::make_cuda_backend<float>();
  Dev<float> k32(size_t(cache) * KVH * D), v32(size_t(cache) * KVH * D);
  fill_normal(*be32, ctx, k32, 1.0, 30);
  fill_normal(*be32, ctx, v32, 1.0, 31);
  const double cache32 = 2.0 * cache * KVH * D * sizeof(float);
  std::printf("cuda decode: fp32 cached attention on CUDA cores, K+V %.1f MiB%s\n", cache32 / (1 << 20), kFigureNote);
  for (const int n : {1, 16}) {
    const int past = cache - n;
    const int splits = kernels::cuda::attention_cached_splits_cores(n, past, NH, D);
    Dev<float> q(size_t(n) * NH * D), out(size_t(n) * NH * D);
    Dev<float> scratch(kernels::cuda::attention_cached_split_scratch_floats(n, NH, D, splits));
    fill_normal(*be32, ctx, q, 1.0, 32);
    auto run = [&](int s) {
      return time_best(*be32, ctx, reps, [&] {
        kernels::cuda::launch_attention_cached_forward_cores(st, out.p(), q.p(), k32.p(), v32.p(), n, past, NH, KVH,
                                                             D, s, scratch.p());
      });
    };
    const double t1 = run(1), ts = splits > 1 ? run(splits) : t1;
    std::printf("  n=%-2d cores unsplit %.3f ms %.1f GB/s; %d splits %.3f ms %.1f GB/s (%.2fx)%s\n", n, t1 * 1e3,
                cache32 / t1 * 1e-9, splits, ts * 1e3, cache32 / ts * 1e-9, t1 / ts, kFigureNote);
  }
  return 0;
}

// ------------------------------- the gated delta rule -------------------------------

// CUDA events around the work fn() enqueues on st (marks in between where fn records them): elapsed ms.
struct EventClock {
  cudaEvent_t e[4] = {};
  EventClock() {
    for (auto& x : e) DFLASH_CUDA_CHECK(cudaEventCreate(&x));
  }
  ~EventClock() {
    for (auto& x : e) cudaEventDestroy(x);
  }
  float ms(int a, int b) const {
    float t = 0;
    DFLASH_CUDA_CHECK(cudaEventElapsedTime(&t, e[a], e[b]));
    return t;
  }
};

// The target's gated delta rule alone (forward; the state carried in, S tokens) at the heaviest TP-5 shard of
// Qwen3.6-27B by default: 16 key / 48 value heads split by whole key groups over 5 ranks, [4, 3, 3, 3, 3] key heads,
// so 4 key / 12 value heads of 128 on the heaviest rank; × --layers (48 Gated DeltaNet layers) per forward. The
// chunk-parallel kernels' three passes timed by CUDA events (best of --reps after a warm-up), then the per-token
// kernel (bf16 and fp32: the serial path fp32 and decode steps take). A dry run on the emulated GPU: small --seq and
// --heads (e.g. --seq 256 --heads 3 --kv-heads 1 --layers 1).
int delta_bench(ExecContext& ctx, const CudaBenchOptions& args) {
  const int S = args.seq.value_or(8192), VH = args.heads.value_or(12), KH = args.kv_heads.value_or(4),
            D = args.head_dim.value_or(128), layers = args.layers.value_or(48), reps = args.reps.value_or(2);
  DFLASH_USER_CHECK(S >= 2 && KH >= 1 && VH >= KH && VH % KH == 0 && layers >= 1 && reps >= 1 &&
                        kernels::delta_rule_chunked_shape(KH, VH, D, D),
                    "dflash_bench cuda delta: need --seq ≥ 2, --heads (value heads) a multiple of --kv-heads (key "
                    "heads), --head-dim 64 or 128, --layers and --reps ≥ 1");
  auto be = kernels::make_cuda_backend<bf16>();
  auto be32 = kernels::make_cuda_backend<float>();
  const size_t qn = size_t(S) * KH * D, vn = size_t(S) * VH * D, gn = size_t(S) * VH, sn = size_t(VH) * D * D;
  Dev<bf16> q(qn), k(qn), v(vn), out(vn);
  fill_normal(*be, ctx, q, 1.0, 40);
  fill_normal(*be, ctx, k, 1.0, 41);
  fill_normal(*be, ctx, v, 1.0, 42);
  be->l2norm_forward(ctx, q.p(), S * KH, D, 1e-6, 1.0 / std::sqrt(double(D)));
  be->l2norm_forward(ctx, k.p(), S * KH, D, 1e-6, 1.0);
  Dev<float> g(gn), beta(gn), state(sn), state0(sn);
  {
    Rng rng(43);
    std::vector<float> gh(gn), bh(gn);
    for (size_t i = 0; i < gn; ++i) {
      gh[i] = float(-rng.uniform());  // decays e^g ∈ (0.37, 1]
      bh[i] = float(1.0 / (1.0 + std::exp(-rng.normal())));
    }
    upload_vec(*be, ctx, g, gh);
    upload_vec(*be, ctx, beta, bh);
  }
  fill_normal(*be32, ctx, state0, 0.3, 44);
  const size_t scratch_bytes = kernels::cuda::gated_delta_rule_chunked_scratch_bytes(S, VH, D, D);
  Dev<unsigned char> scratch(scratch_bytes);
  const cudaStream_t st = static_cast<cudaStream_t>(ctx.stream);
  std::printf("cuda delta: gated delta rule, S=%d, %d key / %d value heads, dk=dv=%d, scratch %.1f MB, best of %d, "
              "x %d layers%s\n",
              S, KH, VH, D, scratch_bytes / 1e6, reps, layers, kFigureNote);
  // the chunked passes
  EventClock clock;
  const kernels::cuda::ChunkedPassMarks marks{clock.e[1], clock.e[2]};
  float best = 1e30f, prep = 0, pass = 0, outp = 0;
  for (int r = 0; r <= reps; ++r) {  // r = 0: the warm-up
    be->copy(ctx, state.p(), state0.p(), sn * sizeof(float));
    DFLASH_CUDA_CHECK(cudaEventRecord(clock.e[0], st));
    kernels::cuda::launch_gated_delta_rule_chunked(st, dev(out.p()), dev(q.p()), dev(k.p()), dev(v.p()), g.p(),
                                                   beta.p(), state.p(), S, KH, VH, D, D, scratch.p(), &marks);
    DFLASH_CUDA_CHECK(cudaEventRecord(clock.e[3], st));
    DFLASH_CUDA_CHECK(cudaEventSynchronize(clock.e[3]));
    if (r > 0 && clock.ms(0, 3) < best) {
      best = clock.ms(0, 3);
      prep = clock.ms(0, 1), pass = clock.ms(1, 2), outp = clock.ms(2, 3);
    }
  }
  std::printf("  chunked (bf16 tensor cores): %.3f ms a layer (prepare %.3f, state pass %.3f, output %.3f); %.2f ms "
              "a forward of %d layers%s\n",
              best, prep, pass, outp, best * layers, layers, kFigureNote);
  // the per-token kernel, bf16 and fp32
  auto per_token = [&](auto& backend, auto& qq, auto& kk, auto& vv, auto& oo) {
    float t = 1e30f;
    for (int r = 0; r <= reps; ++r) {
      backend.copy(ctx, state.p(), state0.p(), sn * sizeof(float));
      DFLASH_CUDA_CHECK(cudaEventRecord(clock.e[0], st));
      kernels::cuda::launch_gated_delta_rule_per_token(st, dev(oo.p()), dev(qq.p()), dev(kk.p()), dev(vv.p()), g.p(),
                                                       beta.p(), state.p(), S, KH, VH, D, D);
      DFLASH_CUDA_CHECK(cudaEventRecord(clock.e[3], st));
      DFLASH_CUDA_CHECK(cudaEventSynchronize(clock.e[3]));
      if (r > 0) t = std::min(t, clock.ms(0, 3));
    }
    return t;
  };
  const float t16 = per_token(*be, q, k, v, out);
  Dev<float> q32(qn), k32(qn), v32(vn), out32(vn);
  be->convert_to_float(ctx, q32.p(), q.p(), qn);
  be->convert_to_float(ctx, k32.p(), k.p(), qn);
  be->convert_to_float(ctx, v32.p(), v.p(), vn);
  const float t32 = per_token(*be32, q32, k32, v32, out32);
  std::printf("  per-token (bf16): %.3f ms a layer, %.2f ms a forward (%.1fx the chunked)%s\n", t16, t16 * layers,
              t16 / best, kFigureNote);
  std::printf("  per-token (fp32): %.3f ms a layer, %.2f ms a forward (%.1fx the chunked)%s\n", t32, t32 * layers,
              t32 / best, kFigureNote);
  // (not timing lines of this run: worded apart from them, which tests/emu/CMakeLists.txt counts)
  std::printf("  chunked at the defaults, measured before on an H200 (the state pass on 4 warps): 26.4 ms a forward, "
              "0.549 a layer = prepare 0.114 + state 0.357 + output 0.078 ms\n");
  std::printf("  chunked at the defaults, predicted (docs/benchmarks.md, the state pass on 8 warps, unverified): state "
              "pass 0.055-0.124 ms, 11.9-15.2 ms a forward on an H200; 0.050-0.084 ms, 21.7-23.4 ms on an RTX PRO "
              "6000\n");
  return 0;
}

template <typename T>
int run_all(Backend<T>& be, ExecContext& ctx, const std::string& what, const CudaBenchOptions& args,
            const char* precision) {
  if (what == "loss" || what == "all") loss_bench(be, ctx, args, precision);
  if (what == "drafter" || what == "all") drafter_bench(be, ctx, args, precision);
  return 0;
}

}  // namespace
#endif

int run_cuda(int argc, char** argv) {
  CliApp app(
        "dflash_bench cuda [loss|drafter|attention|decode|delta|all] [--precision bf16|fp32] [--reps 2]\n"
        "  loss:    [--T 32768] [--H 5120] [--V 248320] [--chunk 2048]\n"
        "  drafter: [--seq 32768] [--anchors 1024] [--block 32] [--hidden 5120] [--layers 5] [--heads 32]\n"
        "           [--kv-heads 8] [--head-dim 128] [--intermediate 17408] [--taps 5] [--window 0]\n"
        "  attention (bf16): [--seq 8192] [--anchors 1024] [--block 32] [--heads 32] [--kv-heads 8]\n"
        "           [--head-dim 128] [--window 0] [--hidden 5120] [--cores 1 (0: skip the CUDA-core kernels)]\n"
        "  decode (cached attention, n = 1 and 16, unsplit vs split-K: bf16 tensor cores, fp32 CUDA cores):\n"
        "           [--seq 8192 (the cache)]\n"
        "           [--heads 24] [--kv-heads 4] [--head-dim 256]\n"
        "  delta (the target's gated delta rule, chunk-parallel vs per token; CUDA events per pass):\n"
        "           [--seq 8192] [--heads 12 (value heads)] [--kv-heads 4 (key heads)] [--head-dim 128]\n"
        "           [--layers 48] (dry run on the emulated GPU: --seq 256 --heads 3 --kv-heads 1 --layers 1)\n"
        "Times the CUDA backend against its own cuBLASLt GEMMs alone (same run, same shapes).\n"
        "Prints 'skipped: ...' and exits 0 where there is no GPU or no CUDA backend.\n",
      "dflash_bench cuda");
  std::string what = "all";
  kernels::Precision precision = kernels::Precision::bf16;
  CudaBenchOptions o;
  app.add_option("BENCHMARK", what, "loss, drafter, attention, decode, delta or all (loss and drafter)")
      ->check(CLI::IsMember({"loss", "drafter", "attention", "decode", "delta", "all"}));
  add_named_option(app, "--precision", precision, "loss and drafter",
                   {kernels::Precision::bf16, kernels::Precision::fp32});
  for (auto [name, value] : {std::pair{"--T", &o.T}, {"--H", &o.H}, {"--V", &o.V}, {"--chunk", &o.chunk},
                             {"--reps", &o.reps}, {"--seq", &o.seq}, {"--anchors", &o.anchors}, {"--block", &o.block},
                             {"--hidden", &o.hidden}, {"--layers", &o.layers}, {"--heads", &o.heads},
                             {"--kv-heads", &o.kv_heads}, {"--head-dim", &o.head_dim},
                             {"--intermediate", &o.intermediate}, {"--taps", &o.taps}, {"--window", &o.window},
                             {"--cores", &o.cores}})
    app.add_option(name, *value, "see above (the default depends on the benchmark)")->check(non_negative_number());
  if (!parse_command_line(app, argc, argv)) return 0;
  DFLASH_USER_CHECK(what == "loss" || what == "drafter" || what == "attention" || what == "decode" ||
                        what == "delta" || what == "all",
                    "dflash_bench cuda: unknown benchmark '{}': use loss, drafter, attention, decode, delta or all",
                    what);
#if !DFLASH_WITH_CUDA
  std::printf("skipped: this build has no CUDA backend\n");
  return 0;
#else
  if (!kernels::cuda_available()) {
    std::printf("skipped: no CUDA device\n");
    return 0;
  }
  kernels::cuda::CudaContext context(0);
  if (what == "attention") return attention_bench(context.exec(), o);
  if (what == "decode") return decode_bench(context.exec(), o);
  if (what == "delta") return delta_bench(context.exec(), o);
  if (precision == kernels::Precision::bf16) {
    auto be = kernels::make_cuda_backend<bf16>();
    return run_all(*be, context.exec(), what, o, name_of(precision));
  }
  auto be = kernels::make_cuda_backend<float>();
  return run_all(*be, context.exec(), what, o, name_of(precision));
#endif
}

}  // namespace dflash::bench
