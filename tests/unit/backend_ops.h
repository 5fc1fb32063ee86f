#pragma once
// One table of op cases (op, shape, which backends take it) with a plain double reference, run through the
// Backend<T> interface against every backend the build has: tests/unit/test_backend_ops.cpp runs the CPU in float
// and double, tests/cuda/test_cuda_backend_ops.cpp runs CUDA in float and bf16 where the build has CUDA (the
// emulated GPU in CI; a build or machine without it reports those skipped, never passed). There is no CPU bf16
// backend (make_backend<bf16>(Device::cpu) is a user error), so bf16 is CUDA's alone.
//
// Inputs are drawn in double, rounded to the backend's storage type (T for activations and weights, A = acc_t<T> for
// statistics, float for AdamW's master state) and the reference runs in double on the rounded values, so only the
// kernel's own roundings count. Error bounds, per element (derivation):
//   * u_c: the unit roundoff of the type the kernel computes in (2^-24 for float and bf16, which compute in fp32;
//     2^-53 for double); u_s: that of the type the result is stored in (T: 2^-24 float, 2^-8 bf16, 2^-53 double;
//     A and float outputs: u_c).
//   * A result formed by n fp32 operations from inputs of total magnitude M (Σ|terms| of its reference formula)
//     is within n·u_c·M of the exact value (Higham's γ_n, first order; a sum of k terms in any order is k
//     operations), and storing it adds u_s·|y|. The bound is 2·(n·u_c·M + u_s·|y|): the factor 2 is a margin,
//     n and M are derived for each op next to its case. Transcendentals (exp, sqrt, sin/cos of the RoPE table)
//     count 2 operations each (glibc and CUDA's are within 2 ulp = 4 u_c; the RoPE table is computed in double
//     and rounded once).
// Each case reports its worst |got − ref| / bound; the test fails when any exceeds 1.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/attention_shape.h"
#include "kernels/backend.h"
#include "lib/core/buffer.h"
#include "lib/core/rng.h"

namespace dflash::test::ops {

using kernels::acc_t;
using kernels::Backend;
using kernels::bf16;
using Vec = std::vector<double>;

// ---- storage types and their unit roundoffs ----
template <typename X>
X store(double v) {
  if constexpr (std::is_same_v<X, bf16>)
    return bf16(float(v));
  else
    return X(v);
}
template <typename X>
double widen(X v) {
  if constexpr (std::is_same_v<X, bf16>)
    return double(float(v));
  else
    return double(v);
}
template <typename X>
constexpr double unit() {
  if constexpr (std::is_same_v<X, bf16>) return 0x1.0p-8;
  if constexpr (std::is_same_v<X, float>) return 0x1.0p-24;
  return 0x1.0p-53;
}
template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bf16>) return "bf16";
  if constexpr (std::is_same_v<T, float>) return "float";
  return "double";
}

inline Vec randn(size_t n, uint64_t seed, double sd = 1.0, double mean = 0.0) {
  Rng rng(seed);
  Vec v(n);
  for (auto& x : v) x = mean + sd * rng.normal();
  return v;
}

// An array in the backend's memory, filled from doubles rounded to X; `host` keeps the rounded values the
// reference reads.
template <typename X>
struct DevArray {
  Buffer buf;
  Vec host;
  template <typename B>
  DevArray(B& be, const Vec& values) : buf(be.memory(), std::max<size_t>(1, values.size()) * sizeof(X)) {
    std::vector<X> h(values.size());
    host.resize(values.size());
    for (size_t i = 0; i < h.size(); ++i) {
      h[i] = store<X>(values[i]);
      host[i] = widen(h[i]);
    }
    be.upload(be.context(), buf.data(), h.data(), h.size() * sizeof(X));
  }
  X* p() const { return buf.as<X>(); }
  template <typename B>
  Vec get(B& be) const {
    std::vector<X> h(host.size());
    be.download(be.context(), h.data(), buf.data(), h.size() * sizeof(X));
    be.synchronize(be.context());
    Vec out(h.size());
    for (size_t i = 0; i < h.size(); ++i) out[i] = widen(h[i]);
    return out;
  }
};

// The worst |got − ref| / bound over one output of one case.
struct Worst {
  double ratio = 0;
  size_t at = 0;
  double got = 0, ref = 0, bound = 0;
  bool nan = false;
};
inline Worst compare(const Vec& got, const Vec& ref, const Vec& bound) {
  REQUIRE(got.size() == ref.size());
  Worst w;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - ref[i]);
    if (!(e == e)) w.nan = true;
    const double r = bound[i] > 0 ? e / bound[i] : (e == 0 ? 0 : std::numeric_limits<double>::infinity());
    if (r > w.ratio || !(e == e)) w = Worst{r, i, got[i], ref[i], bound[i], w.nan || !(e == e)};
  }
  return w;
}

// Bound from the derivation in the header: 2·(n·u_c·M + u_s·|y|).
inline Vec bounds(const Vec& ref, const Vec& mag, double n, double u_c, double u_s) {
  Vec b(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) b[i] = 2.0 * (n * u_c * mag[i] + u_s * std::fabs(ref[i]));
  return b;
}

// ---- the table ----
enum class Op {
  residual,
  swiglu,
  rmsnorm,
  rope,
  head_norm_rope,
  vocab_loss_rows,
  adamw,
  gemm,
  accumulate_scale,
  sigmoid_gate,
  l2norm,
  gated_rmsnorm,
  deltanet_gates,
  rope_partial,
  linear,
  cached_attention,
  causal_attention,
  causal_conv1d,
  delta_rule,
  argmax,
  dflash_attention,
};
inline const char* op_name(Op op) {
  switch (op) {
    case Op::residual: return "residual_forward";
    case Op::swiglu: return "swiglu forward and backward";
    case Op::rmsnorm: return "rmsnorm forward and backward";
    case Op::rope: return "rope forward and backward";
    case Op::head_norm_rope: return "head_norm_rope forward and backward";
    case Op::vocab_loss_rows: return "vocab_loss row_stats and row_grad";
    case Op::adamw: return "adamw_step";
    case Op::gemm: return "gemm";
    case Op::accumulate_scale: return "accumulate and scale";
    case Op::sigmoid_gate: return "sigmoid_gate";
    case Op::l2norm: return "l2norm_forward";
    case Op::gated_rmsnorm: return "gated_rmsnorm_forward";
    case Op::deltanet_gates: return "deltanet_gates_forward";
    case Op::rope_partial: return "rope_partial_forward";
    case Op::linear: return "linear forward and backward";
    case Op::cached_attention: return "attention_cached_forward";
    case Op::causal_attention: return "attention_causal_forward";
    case Op::causal_conv1d: return "causal_conv1d_silu_forward";
    case Op::delta_rule: return "gated_delta_rule_forward";
    case Op::argmax: return "argmax_rows";
    case Op::dflash_attention: return "dflash_attention forward and backward";
  }
  return "?";
}

// Shape fields by op: residual/swiglu/accumulate_scale/sigmoid_gate/adamw: n; rmsnorm/l2norm/gated_rmsnorm: rows,
// dim; deltanet_gates: rows, heads; rope/head_norm_rope: rows, heads, head_dim; rope_partial: rows, head_dim,
// rot_dim; vocab_loss_rows: rows, V (+ tau, with_u; d = 1: the TV, LK and NLA terms too); gemm: M, N, K (+ trans_a, trans_b, beta); linear: N, in, out;
// cached_attention: n, past, q_heads (+ d = kv_heads, e = head_dim); causal_attention: S, 0, q_heads (+ d, e); causal_conv1d: S, C, K; delta_rule: S,
// k_heads, v_heads (+ d = dk, e = dv); argmax: rows, cols; dflash_attention: n_blocks, block, ctx_len (+ d = heads,
// e = kv_heads, f = head_dim, g = window, anchors).
struct OpCase {
  Op op;
  int a = 0, b = 0, c = 0;
  bool cuda = true;  // the CUDA backend takes this shape (its fused head_norm_rope: head_dim even ≤ 256)
  double tau = 1.0;
  bool with_u = true, trans_a = false, trans_b = false;
  double beta = 0.0;
  int d = 0, e = 0, f = 0, g = 0;
  std::vector<int32_t> anchors = {};
  std::string describe() const {
    std::string s = std::string(op_name(op)) + " [" + std::to_string(a) + ", " + std::to_string(b) + ", " +
                    std::to_string(c) + (d || e ? ", " + std::to_string(d) + ", " + std::to_string(e) : "") +
                    (f || g ? ", " + std::to_string(f) + ", " + std::to_string(g) : "") + "]";
    if (op == Op::vocab_loss_rows)
      s += " tau " + std::to_string(tau) + (with_u ? " with u" : " no u") + (d ? " +TV/LK/NLA" : "");
    if (op == Op::gemm) s += std::string(trans_a ? " Aᵀ" : "") + (trans_b ? " Bᵀ" : "") + " beta " + std::to_string(beta);
    return s;
  }
};

// Partial tiles and odd sizes: 1, primes, one past a power of two (the CUDA kernels' 256-thread blocks, 16-byte
// packs of 4 / 8 elements, 32-key tiles, 64-row dw chunks).
inline std::vector<OpCase> op_cases() {
  std::vector<OpCase> c;
  for (int n : {1, 7, 257, 4099}) c.push_back({Op::residual, n});
  for (int n : {1, 13, 1031}) c.push_back({Op::swiglu, n});
  for (auto [rows, dim] : {std::pair{1, 1}, std::pair{7, 33}, std::pair{130, 96}, std::pair{3, 1027}})
    c.push_back({Op::rmsnorm, rows, dim});
  for (auto [rows, heads, hd] : {std::array{1, 1, 2}, std::array{5, 3, 8}, std::array{9, 2, 64}, std::array{3, 4, 128}})
    c.push_back({Op::rope, rows, heads, hd});
  for (int hd : {1, 5, 9}) c.push_back({Op::rope, 4, 2, hd});  // an odd head_dim's last dim passes through
  for (auto [rows, heads, hd] : {std::array{1, 1, 2}, std::array{5, 3, 8}, std::array{7, 2, 64}, std::array{3, 2, 256},
                                 std::array{2, 3, 30}})
    c.push_back({Op::head_norm_rope, rows, heads, hd});
  for (int hd : {5, 9}) c.push_back({Op::head_norm_rope, 3, 2, hd, /*cuda=*/false});
  for (int V : {2, 301, 4099})
    for (double tau : {1.0, 2.0})
      for (bool u : {false, true}) {
        OpCase k{Op::vocab_loss_rows, 6, V};
        k.tau = tau;
        k.with_u = u;
        c.push_back(k);
        if (u && tau == 1.0) {  // the overlap pass: TV, LK-hybrid, NLA (defined at τ = 1, with the target)
          k.d = 1;
          c.push_back(k);
        }
      }
  for (int n : {1, 5, 1025}) c.push_back({Op::adamw, n});
  for (auto [M, N, K] : {std::array{1, 1, 1}, std::array{7, 5, 3}, std::array{33, 17, 65}, std::array{64, 48, 129}})
    for (int t = 0; t < 4; ++t) {
      OpCase k{Op::gemm, M, N, K};
      k.trans_a = t & 1;
      k.trans_b = t & 2;
      k.beta = t == 3 ? 0.5 : 0.0;
      c.push_back(k);
    }
  for (int n : {1, 9, 1029}) c.push_back({Op::accumulate_scale, n});
  for (int n : {1, 9, 1029}) c.push_back({Op::sigmoid_gate, n});
  for (auto [rows, dim] : {std::pair{1, 1}, std::pair{5, 33}, std::pair{3, 257}}) {
    c.push_back({Op::l2norm, rows, dim});
    c.push_back({Op::gated_rmsnorm, rows, dim});
  }
  for (auto [rows, heads] : {std::pair{1, 1}, std::pair{7, 6}, std::pair{33, 32}}) c.push_back({Op::deltanet_gates, rows, heads});
  for (auto [rows, hd, rot] : {std::array{3, 8, 8}, std::array{5, 64, 16}, std::array{4, 10, 6}, std::array{2, 256, 64}})
    c.push_back({Op::rope_partial, rows, hd, rot});
  for (auto [N, in, out] : {std::array{1, 1, 1}, std::array{7, 33, 5}, std::array{65, 48, 17}})
    c.push_back({Op::linear, N, in, out});
  // the target's attention: prefill (past 0), a cached chunk, decode steps (n 1: the split-K path on CUDA), GQA
  // groups 1 to 6, head dims the tensor-core kernels take (64/128/256) and ones they do not (4, 33)
  for (auto [n, past, qh, kvh, D] :
       {std::array{100, 0, 8, 2, 128}, std::array{1, 300, 6, 1, 256}, std::array{17, 70, 3, 3, 33},
        std::array{1, 0, 2, 1, 4}, std::array{5, 37, 4, 2, 64}}) {
    OpCase k{Op::cached_attention, n, past, qh};
    k.d = kvh, k.e = D;
    c.push_back(k);
  }
  // the prefill entry point of the same attention (keys = the S rows themselves)
  for (auto [S, qh, kvh, D] : {std::array{1, 2, 1, 4}, std::array{100, 8, 2, 128}, std::array{65, 3, 3, 33}}) {
    OpCase k{Op::causal_attention, S, 0, qh};
    k.d = kvh, k.e = D;
    c.push_back(k);
  }
  for (auto [S, C, K] : {std::array{1, 1, 1}, std::array{9, 33, 4}, std::array{66, 300, 4}, std::array{5, 7, 2}})
    c.push_back({Op::causal_conv1d, S, C, K});
  // the delta rule: value heads over key heads (groups 1 to 3), dv not a multiple of 32, S across chunk sizes
  for (auto [S, kh, vh, dk, dv] : {std::array{70, 2, 6, 128, 80}, std::array{3, 1, 3, 256, 32},
                                   std::array{1, 4, 4, 16, 7}, std::array{65, 1, 1, 33, 5}}) {
    OpCase k{Op::delta_rule, S, kh, vh};
    k.d = dk, k.e = dv;
    c.push_back(k);
  }
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{7, 257}, std::pair{6, 49664}})
    c.push_back({Op::argmax, rows, cols});
  // the drafter's attention {n_blocks, block, ctx_len, heads, kv_heads, head_dim, window} + anchors: full
  // (bidirectional block) and sliding (causal block) layers, GQA 1 to 6, anchors at 0 and at S and unsorted,
  // ragged head dims (CUDA cores) and 64/128/256 (bf16: the tensor-core kernels), partial key tiles and warps
  struct Dflash {
    std::array<int, 7> s;
    std::vector<int32_t> anchors;
  };
  for (const Dflash& x : {Dflash{{4, 3, 9, 4, 2, 4, 0}, {0, 4, 5, 9}}, Dflash{{4, 3, 9, 4, 2, 4, 4}, {0, 4, 5, 9}},
                          Dflash{{3, 4, 8, 2, 1, 5, 1}, {2, 7, 1}},
                          Dflash{{3, 16, 130, 8, 2, 128, 0}, {0, 129, 130}},
                          Dflash{{3, 16, 130, 8, 2, 128, 40}, {1, 70, 130}},
                          Dflash{{3, 7, 77, 6, 3, 33, 0}, {76, 13, 40}}, Dflash{{3, 16, 130, 2, 2, 64, 0}, {130, 64, 65}},
                          Dflash{{3, 8, 100, 12, 2, 64, 20}, {0, 50, 100}}, Dflash{{3, 7, 77, 8, 2, 64, 16}, {76, 13, 40}},
                          Dflash{{2, 32, 100, 4, 1, 256, 0}, {40, 100}}}) {
    OpCase k{Op::dflash_attention, x.s[0], x.s[1], x.s[2]};
    k.d = x.s[3], k.e = x.s[4], k.f = x.s[5], k.g = x.s[6];
    k.anchors = x.anchors;
    c.push_back(k);
  }
  return c;
}

// ---- the ops: each runs one case on a backend, computes the double reference and the bounds ----
template <typename T>
struct Runner {
  using A = acc_t<T>;
  Backend<T>& be;
  static constexpr double uc = std::is_same_v<T, double> ? 0x1.0p-53 : 0x1.0p-24;  // compute
  static constexpr double us = unit<T>();                                           // T storage
  std::vector<std::pair<std::string, Worst>> results;

  void check(const std::string& what, const Vec& got, const Vec& ref, const Vec& bound) {
    results.push_back({what, compare(got, ref, bound)});
  }

  // out = a + b: one operation, M = |a| + |b|.
  void residual(const OpCase& k) {
    const size_t n = size_t(k.a);
    DevArray<T> a(be, randn(n, 1)), b(be, randn(n, 2)), out(be, Vec(n));
    be.residual_forward(be.context(), out.p(), a.p(), b.p(), n);
    Vec ref(n), mag(n);
    for (size_t i = 0; i < n; ++i) ref[i] = a.host[i] + b.host[i], mag[i] = std::fabs(a.host[i]) + std::fabs(b.host[i]);
    check("out", out.get(be), ref, bounds(ref, mag, 1, uc, us));
  }

  // h = g σ(g) u: exp (2), 1 + e, the division, two products: 6 operations on M = |h| (σ = 1/(1 + e^−g) has at
  // most the relative error of e^−g plus its own two). Backward dgate (+=) dh·u·σ(1 + g(1 − σ)): 1 − σ has an
  // absolute error of about 6 u_c when σ → 1, which g multiplies: M = |init| + |dh u σ| (1 + |g|(1 − σ))(1 + |g|)
  // bounds it, n = 10 (σ's 6, the sum, the products); dup (+=) dh·g·σ: the same n on |init| + |dh g σ|(1 + |g|).
  void swiglu(const OpCase& k) {
    const size_t n = size_t(k.a);
    DevArray<T> g(be, randn(n, 3, 3.0)), u(be, randn(n, 4)), dh(be, randn(n, 5)), h(be, Vec(n));
    const Vec init_g = randn(n, 6), init_u = randn(n, 7);
    DevArray<T> dg(be, init_g), du(be, init_u);
    be.swiglu_forward(be.context(), h.p(), g.p(), u.p(), n);
    be.swiglu_backward(be.context(), dg.p(), du.p(), dh.p(), g.p(), u.p(), n);
    Vec rh(n), mh(n), rg(n), mg(n), ru(n), mu(n);
    for (size_t i = 0; i < n; ++i) {
      const double x = g.host[i], s = 1 / (1 + std::exp(-x)), cond = 1 + std::fabs(x);
      rh[i] = x * s * u.host[i], mh[i] = std::fabs(rh[i]);
      const double dgi = dh.host[i] * u.host[i] * s * (1 + x * (1 - s));
      rg[i] = dg.host[i] + dgi;
      mg[i] = std::fabs(dg.host[i]) + std::fabs(dh.host[i] * u.host[i] * s) * (1 + std::fabs(x) * (1 - s)) * cond;
      ru[i] = du.host[i] + dh.host[i] * x * s;
      mu[i] = std::fabs(du.host[i]) + std::fabs(dh.host[i] * x * s) * cond;
    }
    check("h", h.get(be), rh, bounds(rh, mh, 6, uc, us));
    check("dgate", dg.get(be), rg, bounds(rg, mg, 10, uc, us));
    check("dup", du.get(be), ru, bounds(ru, mu, 10, uc, us));
  }

  // rstd = 1/sqrt(Σx²/d + ε): the sum of d squares (d + 1), the division, +ε, sqrt (2), the reciprocal: n = d + 6
  // relative to rstd (Σx² is a sum of positive terms: its relative error is its absolute error over itself), of
  // which sqrt halves the sum's part. y = x·rstd·w: 2 more on M = |y|. Backward, with g = dy·w, n̂ = x·rstd:
  // dx (+=) rstd (g − n̂ · mean(g n̂)): the dot of d terms (d + 3 operations) and the rest (5) on
  // M = |init| + rstd (|g| + |n̂| mean|g n̂|); dw (+=) Σ_rows dy x rstd: rows + 3 on M = |init| + Σ|dy x rstd|. rstd is
  // the input the backend's forward stored (in A), the reference reads the same rounded value.
  void rmsnorm(const OpCase& k) {
    const int rows = k.a, dim = k.b;
    const size_t n = size_t(rows) * dim;
    const double eps = 1e-6;
    DevArray<T> x(be, randn(n, 8)), w(be, randn(size_t(dim), 9, 0.5, 1.0)), y(be, Vec(n)), dy(be, randn(n, 10));
    DevArray<T> dx(be, randn(n, 11));
    DevArray<A> rstd(be, Vec(static_cast<size_t>(rows))), dw(be, randn(size_t(dim), 12));
    be.rmsnorm_forward(be.context(), y.p(), rstd.p(), x.p(), w.p(), rows, dim, eps);
    const Vec rstd_got = rstd.get(be);
    Vec ry(n), my(n), rr(static_cast<size_t>(rows)), mr(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += x.host[size_t(r) * dim + i] * x.host[size_t(r) * dim + i];
      rr[size_t(r)] = 1 / std::sqrt(ss / dim + eps), mr[size_t(r)] = rr[size_t(r)];
      for (int i = 0; i < dim; ++i) {
        const size_t o = size_t(r) * dim + i;
        ry[o] = x.host[o] * rr[size_t(r)] * w.host[size_t(i)], my[o] = std::fabs(ry[o]);
      }
    }
    check("rstd", rstd_got, rr, bounds(rr, mr, dim / 2.0 + 6, uc, uc));
    check("y", y.get(be), ry, bounds(ry, my, dim / 2.0 + 8, uc, us));

    be.rmsnorm_backward(be.context(), dx.p(), dw.p(), dy.p(), x.p(), w.p(), rstd.p(), rows, dim);
    Vec rdx(n), mdx(n), rdw(static_cast<size_t>(dim)), mdw(static_cast<size_t>(dim));
    for (int i = 0; i < dim; ++i) rdw[size_t(i)] = dw.host[size_t(i)], mdw[size_t(i)] = std::fabs(dw.host[size_t(i)]);
    for (int r = 0; r < rows; ++r) {
      const double s = rstd_got[size_t(r)];  // what the backend's backward reads, rounded to A as it is
      double dot = 0, dot_abs = 0;
      for (int i = 0; i < dim; ++i) {
        const size_t o = size_t(r) * dim + i;
        dot += dy.host[o] * w.host[size_t(i)] * x.host[o] * s;
        dot_abs += std::fabs(dy.host[o] * w.host[size_t(i)] * x.host[o] * s);
      }
      for (int i = 0; i < dim; ++i) {
        const size_t o = size_t(r) * dim + i;
        const double g = dy.host[o] * w.host[size_t(i)], nh = x.host[o] * s;
        rdx[o] = dx.host[o] + s * (g - nh * dot / dim);
        mdx[o] = std::fabs(dx.host[o]) + s * (std::fabs(g) + std::fabs(nh) * dot_abs / dim);
        rdw[size_t(i)] += dy.host[o] * x.host[o] * s;
        mdw[size_t(i)] += std::fabs(dy.host[o] * x.host[o] * s);
      }
    }
    check("dx", dx.get(be), rdx, bounds(rdx, mdx, dim + 8, uc, us));
    check("dw", dw.get(be), rdw, bounds(rdw, mdw, rows + 3, uc, uc));
  }

  // Rotate-half at angle pos·θ^(−2i/D): y_a = a c − b s, y_b = b c + a s with c, s rounded to fp32 once (1 each)
  // and two products and a sum (3): n = 4 on M = |a c| + |b s|; an odd head_dim's last dim passes through (n = 0).
  // Backward (+=) rotates by −angle: one more operation for the accumulation, M += |init|.
  static void rope_ref(const Vec& x, const Vec& init, const std::vector<int32_t>& pos, int rows, int heads, int D,
                       double theta, double sign, Vec& ref, Vec& mag) {
    const int half = D / 2;
    ref = init, mag.assign(x.size(), 0);
    for (size_t i = 0; i < x.size(); ++i) mag[i] = std::fabs(init[i]);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < heads; ++h) {
        const size_t base = (size_t(r) * heads + h) * D;
        for (int i = 0; i < half; ++i) {
          const double ang = double(pos[size_t(r)]) * std::pow(theta, -2.0 * i / D), c = std::cos(ang),
                       s = sign * std::sin(ang);
          const double a = x[base + i], b = x[base + i + half];
          ref[base + i] += a * c - b * s, ref[base + i + half] += b * c + a * s;
          mag[base + i] += std::fabs(a * c) + std::fabs(b * s), mag[base + i + half] += std::fabs(b * c) + std::fabs(a * s);
        }
        if (D % 2) ref[base + D - 1] += x[base + D - 1], mag[base + D - 1] += std::fabs(x[base + D - 1]);
      }
  }
  static std::vector<int32_t> positions(int rows) {
    std::vector<int32_t> p(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) p[size_t(r)] = int32_t((r * 7919) % 40961);  // up to 4e4: long-context angles
    return p;
  }
  DevArray<int32_t> upload_pos(const std::vector<int32_t>& p) {
    Vec v(p.begin(), p.end());
    return DevArray<int32_t>(be, v);
  }

  void rope(const OpCase& k) {
    const int rows = k.a, heads = k.b, D = k.c;
    const size_t n = size_t(rows) * heads * D;
    const double theta = 1e6;
    const auto pos = positions(rows);
    DevArray<int32_t> dpos = upload_pos(pos);
    DevArray<T> x(be, randn(n, 13)), y(be, Vec(n, std::numeric_limits<double>::quiet_NaN())), dx(be, randn(n, 14));
    be.rope_forward(be.context(), y.p(), x.p(), dpos.p(), rows, heads, D, theta);
    Vec ref, mag;
    rope_ref(x.host, Vec(n), pos, rows, heads, D, theta, +1, ref, mag);
    check("y", y.get(be), ref, bounds(ref, mag, 4, uc, us));
    be.rope_backward(be.context(), dx.p(), x.p(), dpos.p(), rows, heads, D, theta);
    rope_ref(x.host, dx.host, pos, rows, heads, D, theta, -1, ref, mag);
    check("dx", dx.get(be), ref, bounds(ref, mag, 5, uc, us));
  }

  // The fused per-head RMSNorm + RoPE: rmsnorm's forward (d/2 + 8) then the rotation (4) on the normed values
  // (M from the rotation of n̂ w); backward: the rotation back (4) then rmsnorm's backward (d + 8), M as rmsnorm's
  // with g = Rᵀ dy, |g| bounded by the rotation's M.
  void head_norm_rope(const OpCase& k) {
    const int rows = k.a, heads = k.b, D = k.c, nr = rows * heads;
    const size_t n = size_t(nr) * D;
    const double eps = 1e-6, theta = 1e4;
    const auto pos = positions(rows);
    DevArray<int32_t> dpos = upload_pos(pos);
    DevArray<T> x(be, randn(n, 15, 2.0)), w(be, randn(size_t(D), 16, 0.5, 1.0)), y(be, Vec(n)), dy(be, randn(n, 17));
    DevArray<T> dx(be, randn(n, 18));
    DevArray<A> rstd(be, Vec(static_cast<size_t>(nr))), dw(be, randn(size_t(D), 19));
    be.head_norm_rope_forward(be.context(), y.p(), rstd.p(), x.p(), w.p(), dpos.p(), rows, heads, D, eps, theta);
    const Vec rstd_got = rstd.get(be);
    Vec normed(n), rr(static_cast<size_t>(nr));
    std::vector<int32_t> head_pos(static_cast<size_t>(nr));
    for (int q = 0; q < nr; ++q) {
      double ss = 0;
      for (int i = 0; i < D; ++i) ss += x.host[size_t(q) * D + i] * x.host[size_t(q) * D + i];
      rr[size_t(q)] = 1 / std::sqrt(ss / D + eps);
      for (int i = 0; i < D; ++i) normed[size_t(q) * D + i] = x.host[size_t(q) * D + i] * rr[size_t(q)] * w.host[size_t(i)];
      head_pos[size_t(q)] = pos[size_t(q / heads)];
    }
    check("rstd", rstd_got, rr, bounds(rr, rr, D / 2.0 + 6, uc, uc));
    Vec ry, my;
    rope_ref(normed, Vec(n), head_pos, nr, 1, D, theta, +1, ry, my);
    check("y", y.get(be), ry, bounds(ry, my, D / 2.0 + 12, uc, us));

    be.head_norm_rope_backward(be.context(), dx.p(), dw.p(), dy.p(), x.p(), w.p(), rstd.p(), dpos.p(), rows, heads, D,
                               theta);
    Vec g, mg;
    rope_ref(dy.host, Vec(n), head_pos, nr, 1, D, theta, -1, g, mg);
    Vec rdx(n), mdx(n), rdw = dw.host, mdw(static_cast<size_t>(D));
    for (int i = 0; i < D; ++i) mdw[size_t(i)] = std::fabs(rdw[size_t(i)]);
    for (int q = 0; q < nr; ++q) {
      const double s = rstd_got[size_t(q)];
      double dot = 0, dot_abs = 0;
      for (int i = 0; i < D; ++i) {
        const size_t o = size_t(q) * D + i;
        dot += g[o] * w.host[size_t(i)] * x.host[o] * s;
        dot_abs += mg[o] * std::fabs(w.host[size_t(i)] * x.host[o] * s);
      }
      for (int i = 0; i < D; ++i) {
        const size_t o = size_t(q) * D + i;
        const double gw = g[o] * w.host[size_t(i)], nh = x.host[o] * s;
        rdx[o] = dx.host[o] + s * (gw - nh * dot / D);
        mdx[o] = std::fabs(dx.host[o]) + s * (mg[o] * std::fabs(w.host[size_t(i)]) + std::fabs(nh) * dot_abs / D);
        rdw[size_t(i)] += g[o] * x.host[o] * s;
        mdw[size_t(i)] += mg[o] * std::fabs(x.host[o] * s);
      }
    }
    check("dx", dx.get(be), rdx, bounds(rdx, mdx, D + 12, uc, us));
    check("dw", dw.get(be), rdw, bounds(rdw, mdw, nr + 7, uc, uc));
  }

  // The vocab loss rows (kernels/math/loss_rows.h). Statistics and values are doubles formed from fp32 exponentials
  // summed in double. With R the row's logit range (max − min of z and of u) and τ: each exponential's argument is
  // ≤ 3 fp32 operations on values ≤ R/τ (absolute error 3 u_c R/τ) and the exp is within 4 u_c, so every term of a
  // sum has relative error ε = u_c (4 + 3 R max(1, 1/τ)); a log of a sum of such terms is within ε (absolute).
  // CE = log-sum + (z_max − z_y): ε. CAP, a difference of two log-sums: 2ε. KL = τ acc/su − τ² (log su − log szτ):
  // acc/su is a mean of d_v = (u_v − u_max) − (z_v − z_max) (|d| ≤ 2R, 3 fp32 operations) under weights with
  // relative error ε: within 4 R ε + 6 u_c R; so KL within τ (4 R ε + 6 u_c R) + 2 τ² ε. Doubled.
  // The gradient: each element is Σ_j a_j e_j (p, p_τ, q_τ, the CAP term) with the statistics rounded to fp32
  // (log-sums ≤ L in magnitude: argument error u_c (3 R max(1, 1/τ) + 2 L)) and carrying their own ε; the exp 4 u_c,
  // a_j's rounding u_c, three adds: relative u_c (8 + 3R max(1, 1/τ) + 2L) + ε on M = Σ|a_j e_j| (+ |c λ_ce| at the
  // label, whose value comes from 1 − p_y), stored in T: + u_s |y|. Doubled.
  // With TV / LK / NLA (τ = 1): α = Σ min(p, q) sums terms each within ε (relative), so α and TV = 1 − α are within
  // ε and NLA = −log α within ε/α... relative ε of α: within ε; λ = exp(−η α) within λ η ε, so LK = λ KL + (1 − λ) TV
  // within λ·(KL's bound) + (1 − λ) ε + |KL − TV| λ η ε. Their gradient adds a·p_v (below − [p_v < q_v]) with
  // a = c (λ_tv + λ_lk (1 − λ) + λ_nla/α): the exp as above, `below` within ε, a within (η + 1) ε (λ, 1/α):
  // (rel + (η + 2) ε) on M_tv = |a| p_v (below + 1). Where p_v and q_v are within 8ε of each other the two sides
  // may put v on different sides of p < q: the bound there adds |a| p_v. Doubled.
  void vocab_loss_rows(const OpCase& k) {
    const int rows = k.a, V = k.b;
    const size_t n = size_t(rows) * V;
    const double tau = k.tau;
    kernels::VocabLossCoeffs coeffs{0.8, k.with_u ? 0.6 : 0.0, 0.3, tau};
    if (k.d == 1) coeffs.tv = 0.5, coeffs.lk = 0.4, coeffs.nla = 0.3, coeffs.lk_eta = 2.5;
    const bool ov = k.d == 1;
    Vec z0 = randn(n, 20, 3.0), u0 = randn(n, 21, 3.0);
    std::vector<int32_t> labels(static_cast<size_t>(rows));
    Vec weights(static_cast<size_t>(rows));
    Rng rng(22);
    for (int r = 0; r < rows; ++r) {
      labels[size_t(r)] = int32_t(rng.below(uint64_t(V)));
      weights[size_t(r)] = r == 4 ? 0.0 : 0.5 + 0.25 * r;  // row 4 is skipped (w = 0)
    }
    double* z = z0.data();
    // rows that reach every branch: the label is the argmax (r 1), ties at the maximum (r 2), a lone maximum
    // more than kExclShortcutGap above the rest (r 3: CAP's own pass), a peaked target (r 5)
    {
      const size_t o1 = size_t(1) * V;
      labels[1] = int32_t(std::max_element(z + o1, z + o1 + V) - (z + o1));
      if (V > 3) z[2 * size_t(V) + 1] = z[2 * size_t(V) + size_t(V) / 2] = z[3 * size_t(V) - 1] = 12.0;
      z[3 * size_t(V) + size_t(V) / 3] = 60.0;
      u0[5 * size_t(V) + size_t(labels[5])] = 30.0;
    }
    DevArray<T> dz(be, z0), du(be, u0);
    DevArray<int32_t> dl(be, Vec(labels.begin(), labels.end()));
    DevArray<A> dw(be, weights);
    Buffer rows_buf(be.memory(), sizeof(kernels::VocabLossRow) * size_t(rows));
    Buffer vals_buf(be.memory(), sizeof(kernels::VocabLossRowValues) * size_t(rows));
    const T* up = k.with_u ? du.p() : nullptr;
    be.vocab_loss_row_stats(be.context(), dz.p(), up, rows, V, dl.p(), dw.p(), coeffs, 5,
                            rows_buf.as<kernels::VocabLossRow>(), vals_buf.as<kernels::VocabLossRowValues>());
    std::vector<kernels::VocabLossRowValues> vals(static_cast<size_t>(rows));
    be.download(be.context(), vals.data(), vals_buf.data(), vals.size() * sizeof(vals[0]));
    const double grad_scale = 1.7;
    be.vocab_loss_row_grad(be.context(), dz.p(), up, rows, V, dl.p(), dw.p(), rows_buf.as<kernels::VocabLossRow>(),
                           grad_scale, coeffs);
    const Vec grad = dz.get(be);

    Vec got_v, ref_v, bnd_v, rg(n), bg(n);
    for (int r = 0; r < rows; ++r) {
      const double* zr = dz.host.data() + size_t(r) * V;
      const double* ur = du.host.data() + size_t(r) * V;
      const int y = labels[size_t(r)];
      if (weights[size_t(r)] == 0) {
        CHECK(vals[size_t(r)].scored == 0);
        CHECK(vals[size_t(r)].ce == 0);
        for (int v = 0; v < V; ++v) rg[size_t(r) * V + v] = 0, bg[size_t(r) * V + v] = 0;
        continue;
      }
      const double zmax = *std::max_element(zr, zr + V), zmin = *std::min_element(zr, zr + V);
      const double umax = *std::max_element(ur, ur + V), umin = *std::min_element(ur, ur + V);
      const int m = int(std::max_element(zr, zr + V) - zr);  // first maximum
      auto lse = [&](const double* x, double scale, int skip) {
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; ++v)
          if (v != skip) mx = std::max(mx, x[v] * scale);
        for (int v = 0; v < V; ++v)
          if (v != skip) s += std::exp(x[v] * scale - mx);
        return mx + std::log(s);
      };
      const double L = lse(zr, 1, -1), Lt = lse(zr, 1 / tau, -1), Lu = lse(ur, 1 / tau, -1);
      const double Lx = m != y && V > 1 ? lse(zr, 1, m) : 0;
      const double ce = L - zr[y], cap = m != y ? L - Lx : 0;
      double kl = 0;
      if (k.with_u)
        for (int v = 0; v < V; ++v) {
          const double q = std::exp(ur[v] / tau - Lu);
          kl += q * ((ur[v] / tau - Lu) - (zr[v] / tau - Lt));
        }
      kl *= tau * tau;
      const double R = std::max(zmax - zmin, k.with_u ? umax - umin : 0.0), rt = R * std::max(1.0, 1 / tau);
      const double eps = uc * (4 + 3 * rt);
      const auto& gv = vals[size_t(r)];
      CHECK(gv.scored == 1);
      CHECK(gv.finite == 1);
      CHECK(int(gv.correct) == int(m == y));
      int above = 0;
      for (int v = 0; v < V; ++v) above += v < y ? zr[v] >= zr[y] : (v > y && zr[v] > zr[y]);
      CHECK(int(gv.topk) == int(above < 5));
      const double kl_bound = 2 * (tau * (4 * R * eps + 6 * uc * R) + 2 * tau * tau * eps);
      got_v.insert(got_v.end(), {gv.ce, gv.cap, gv.kl});
      ref_v.insert(ref_v.end(), {ce, cap, kl});
      bnd_v.insert(bnd_v.end(), {2 * eps, 4 * eps, kl_bound});
      // the overlap terms (τ = 1: p_τ = p, q_τ = q)
      double alpha = 0, below = 0, lambda = 0, a_tv = 0;
      if (ov) {
        for (int v = 0; v < V; ++v) {
          const double p = std::exp(zr[v] - L), q = std::exp(ur[v] - Lu);
          alpha += std::min(p, q);
          below += p < q ? p : 0;
        }
        lambda = std::exp(-coeffs.lk_eta * alpha);
        const double tv = 1 - alpha, nla = -std::log(std::max(alpha, kernels::kNlaFloor));
        const double lk = lambda * kl + (1 - lambda) * tv;
        got_v.insert(got_v.end(), {gv.tv, gv.nla, gv.lk});
        ref_v.insert(ref_v.end(), {tv, nla, lk});
        bnd_v.insert(bnd_v.end(), {2 * eps, 2 * eps / alpha,
                                   2 * (lambda * kl_bound / 2 + (1 - lambda) * eps +
                                        std::fabs(kl - tv) * lambda * coeffs.lk_eta * eps)});
        a_tv = coeffs.tv + coeffs.lk * (1 - lambda) + (alpha > kernels::kNlaFloor ? coeffs.nla / alpha : 0);
      }

      const double c = grad_scale * weights[size_t(r)];
      const double Lmax = std::max({std::fabs(L - zmax), std::fabs(Lt - zmax / tau), std::fabs(Lu - umax / tau),
                                    std::fabs(Lx - zmax)});
      const double rel = uc * (8 + 3 * rt + 2 * Lmax) + eps;
      const double pm = std::exp(zr[m] - L);
      for (int v = 0; v < V; ++v) {
        const double p = std::exp(zr[v] - L);
        double d = c * coeffs.ce * (p - (v == y)), M = std::fabs(c * coeffs.ce * p) + (v == y ? std::fabs(c * coeffs.ce) : 0);
        if (k.with_u) {
          const double pt = std::exp(zr[v] / tau - Lt), qt = std::exp(ur[v] / tau - Lu);
          const double kl_coef = coeffs.kl * tau + (ov ? coeffs.lk * lambda : 0);  // LK's λ KL joins KL
          d += c * kl_coef * (pt - qt);
          M += std::fabs(c * kl_coef) * (pt + qt);
        }
        double tv_err = 0, tie = 0;  // the TV coefficient's own error; a near-tie p ≈ q may be classified apart
        if (ov) {
          const double q = std::exp(ur[v] - Lu), t = p * (below - (p < q ? 1 : 0));
          const double m_tv = std::fabs(c * a_tv) * p * (below + 1);
          d += c * a_tv * t;
          M += m_tv;
          tv_err = (coeffs.lk_eta + 2) * eps * m_tv;
          if (std::fabs(p - q) <= 8 * eps * std::max(p, q)) tie = std::fabs(c * a_tv) * p;
        }
        if (m != y) {
          const double t = v == m ? pm : -pm * std::exp(zr[v] - Lx);
          d += c * coeffs.cap * t;
          M += std::fabs(c * coeffs.cap * t);
        }
        rg[size_t(r) * V + v] = d;
        bg[size_t(r) * V + v] = 2 * (rel * M + tv_err + us * std::fabs(d) + tie);
      }
    }
    check(ov ? "ce, cap, kl, tv, nla, lk" : "ce, cap, kl", got_v, ref_v, bnd_v);
    check("d logits", grad, rg, bg);
  }

  // AdamW on fp32 master weights (whatever T is): m' = β1 m + (1 − β1) g and v' = β2 v + (1 − β2) g²: 3 and 4
  // operations on M = |β1 m| + |(1 − β1) g| (resp. for v); p' = p − λ p − s m' / (√v' c + ε): the update's
  // quotient carries m' (3), √v' (4/2 + 2), the product, the sum and the division: 10 relative to |update|, the
  // decay 2 relative to |λ p|, and the two subtractions 2 relative to |p'|. Stored in fp32.
  void adamw(const OpCase& k) {
    const size_t n = size_t(k.a);
    const double u32 = 0x1.0p-24;
    Vec v0 = randn(n, 25, 0.1);
    for (auto& x : v0) x = x * x;
    Vec mask(n);
    for (size_t i = 0; i < n; ++i) mask[i] = i % 3 != 0;
    DevArray<float> p(be, randn(n, 23)), g(be, randn(n, 24)), m(be, randn(n, 26, 0.1)), v(be, v0);
    DevArray<uint8_t> dm(be, mask);
    kernels::AdamWCoeffs c;
    c.step_size = 1e-3f / (1 - 0.9f * 0.9f);
    c.inv_sqrt_bc2 = 1.0f / std::sqrt(1 - 0.95f * 0.95f);
    c.decay = 1e-3f * 0.1f;
    be.adamw_step(be.context(), p.p(), g.p(), m.p(), v.p(), dm.p(), n, c);
    Vec rp(n), mp(n), rm(n), mm(n), rv(n), mv(n);
    const double b1 = c.beta1, b2 = c.beta2, ob1 = 1.0f - c.beta1, ob2 = 1.0f - c.beta2;  // as the fp32 code forms them
    for (size_t i = 0; i < n; ++i) {
      const double gi = g.host[i];
      rm[i] = b1 * m.host[i] + ob1 * gi, mm[i] = std::fabs(b1 * m.host[i]) + std::fabs(ob1 * gi);
      rv[i] = b2 * v.host[i] + ob2 * gi * gi, mv[i] = std::fabs(b2 * v.host[i]) + std::fabs(ob2 * gi * gi);
      const double decay = mask[i] != 0 ? double(c.decay) * p.host[i] : 0.0;
      const double upd = double(c.step_size) * rm[i] / (std::sqrt(rv[i]) * double(c.inv_sqrt_bc2) + double(c.eps));
      rp[i] = p.host[i] - decay - upd;
      mp[i] = 10 * std::fabs(upd) + 2 * std::fabs(decay) + 2 * std::fabs(rp[i]);
    }
    check("m", m.get(be), rm, bounds(rm, mm, 3, u32, u32));
    check("v", v.get(be), rv, bounds(rv, mv, 4, u32, u32));
    check("params", p.get(be), rp, bounds(rp, mp, 1, u32, u32));
  }

  // C = α op(A) op(B) + β C: a K-term dot (K operations, any order), α, β and the sum (3) on
  // M = |α| Σ|a||b| + |β c|, stored in T.
  void gemm(const OpCase& k) {
    const int M = k.a, N = k.b, K = k.c;
    const double alpha = 0.75, beta = k.beta;
    const int lda = k.trans_a ? M : K, ldb = k.trans_b ? K : N, ldc = N;
    DevArray<T> a(be, randn(size_t(M) * K, 27)), b(be, randn(size_t(K) * N, 28)), c(be, randn(size_t(M) * N, 29));
    be.gemm(be.context(), k.trans_a, k.trans_b, M, N, K, alpha, a.p(), lda, b.p(), ldb, beta, c.p(), ldc);
    Vec ref(size_t(M) * N), mag(size_t(M) * N);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = 0, sa = 0;
        for (int t = 0; t < K; ++t) {
          const double av = k.trans_a ? a.host[size_t(t) * lda + i] : a.host[size_t(i) * lda + t];
          const double bv = k.trans_b ? b.host[size_t(j) * ldb + t] : b.host[size_t(t) * ldb + j];
          s += av * bv, sa += std::fabs(av * bv);
        }
        const size_t o = size_t(i) * ldc + j;
        ref[o] = alpha * s + (beta != 0 ? beta * c.host[o] : 0.0);
        mag[o] = std::fabs(alpha) * sa + std::fabs(beta * c.host[o]);
      }
    check("C", c.get(be), ref, bounds(ref, mag, K + 3, uc, us));
  }

  // y (+=) x: 1 operation on |y| + |x|; then x (=) x · s: s rounded to the compute type and the product, 2 on |x s|.
  void accumulate_scale(const OpCase& k) {
    const size_t n = size_t(k.a);
    const double sc = 0.3;
    DevArray<T> y(be, randn(n, 40)), x(be, randn(n, 41));
    be.accumulate(be.context(), y.p(), x.p(), n);
    Vec ry(n), my(n);
    for (size_t i = 0; i < n; ++i) ry[i] = y.host[i] + x.host[i], my[i] = std::fabs(y.host[i]) + std::fabs(x.host[i]);
    check("accumulate", y.get(be), ry, bounds(ry, my, 1, uc, us));
    be.scale(be.context(), x.p(), sc, n);
    Vec rx(n), mx(n);
    for (size_t i = 0; i < n; ++i) rx[i] = x.host[i] * sc, mx[i] = std::fabs(rx[i]);
    check("scale", x.get(be), rx, bounds(rx, mx, 2, uc, us));
  }

  // x (=) x · σ(gate): σ's 6 operations (as swiglu's) and the product: 7 on |y|.
  void sigmoid_gate(const OpCase& k) {
    const size_t n = size_t(k.a);
    DevArray<T> x(be, randn(n, 42)), g(be, randn(n, 43, 3.0));
    be.sigmoid_gate(be.context(), x.p(), g.p(), n);
    Vec r(n), m(n);
    for (size_t i = 0; i < n; ++i) r[i] = x.host[i] / (1 + std::exp(-g.host[i])), m[i] = std::fabs(r[i]);
    check("x", x.get(be), r, bounds(r, m, 7, uc, us));
  }

  // x (= in place) x · scale / sqrt(Σx² + ε): the sum (d + 1), sqrt (2, halving the sum's part), the division and
  // the product: d/2 + 6 on |y|.
  void l2norm(const OpCase& k) {
    const int rows = k.a, dim = k.b;
    const size_t n = size_t(rows) * dim;
    const double eps = 1e-6, sc = 0.125;
    DevArray<T> x(be, randn(n, 44));
    be.l2norm_forward(be.context(), x.p(), rows, dim, eps, sc);
    Vec r(n), m(n);
    for (int q = 0; q < rows; ++q) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += x.host[size_t(q) * dim + i] * x.host[size_t(q) * dim + i];
      for (int i = 0; i < dim; ++i) {
        const size_t o = size_t(q) * dim + i;
        r[o] = x.host[o] * sc / std::sqrt(ss + eps), m[o] = std::fabs(r[o]);
      }
    }
    check("x", x.get(be), r, bounds(r, m, dim / 2.0 + 6, uc, us));
  }

  // y (=) w · (x · rstd) · silu(z): rstd as RMSNorm's (d/2 + 6), silu's 5, three products: d/2 + 14 on |y|.
  void gated_rmsnorm(const OpCase& k) {
    const int rows = k.a, dim = k.b;
    const size_t n = size_t(rows) * dim;
    const double eps = 1e-6;
    DevArray<T> x(be, randn(n, 45)), z(be, randn(n, 46, 2.0)), w(be, randn(size_t(dim), 47, 0.5, 1.0)), y(be, Vec(n));
    be.gated_rmsnorm_forward(be.context(), y.p(), x.p(), z.p(), w.p(), rows, dim, eps);
    Vec r(n), m(n);
    for (int q = 0; q < rows; ++q) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += x.host[size_t(q) * dim + i] * x.host[size_t(q) * dim + i];
      const double rstd = 1 / std::sqrt(ss / dim + eps);
      for (int i = 0; i < dim; ++i) {
        const size_t o = size_t(q) * dim + i;
        const double zz = z.host[o];
        r[o] = w.host[size_t(i)] * (x.host[o] * rstd) * (zz / (1 + std::exp(-zz))), m[o] = std::fabs(r[o]);
      }
    }
    check("y", y.get(be), r, bounds(r, m, dim / 2.0 + 14, uc, us));
  }

  // β (=) σ(b): 6 on |β|. g (=) −exp(a_log) · softplus(a + dt): the sum's absolute error u(|a| + |dt|) moves
  // log softplus by at most that (d log softplus / dx = σ(x) / softplus(x) ≤ 1), then exp, log1p, exp (2 each) and
  // the product: relative 7 + (|a| + |dt|), counted as n = 7 on M = |g| (1 + (|a| + |dt|)/7). Both in A.
  void deltanet_gates(const OpCase& k) {
    const int rows = k.a, heads = k.b;
    const size_t n = size_t(rows) * heads;
    Vec a0 = randn(n, 48, 4.0);
    if (n > 2) a0[1] = 25.0;  // softplus's linear branch
    DevArray<T> a(be, a0), b(be, randn(n, 49, 3.0)), a_log(be, randn(size_t(heads), 50, 0.5)),
        dt(be, randn(size_t(heads), 51));
    DevArray<A> g(be, Vec(n)), beta(be, Vec(n));
    be.deltanet_gates_forward(be.context(), g.p(), beta.p(), a.p(), b.p(), a_log.p(), dt.p(), rows, heads);
    Vec rg(n), mg(n), rb(n), mb(n);
    for (size_t i = 0; i < n; ++i) {
      const int j = int(i % size_t(heads));
      rb[i] = 1 / (1 + std::exp(-b.host[i])), mb[i] = rb[i];
      const double x = a.host[i] + dt.host[size_t(j)], sp = x > 20 ? x : std::log1p(std::exp(x));
      rg[i] = -std::exp(a_log.host[size_t(j)]) * sp;
      mg[i] = std::fabs(rg[i]) * (1 + (std::fabs(a.host[i]) + std::fabs(dt.host[size_t(j)])) / 7);
    }
    check("beta", beta.get(be), rb, bounds(rb, mb, 6, uc, uc));
    check("g", g.get(be), rg, bounds(rg, mg, 7, uc, uc));
  }

  // The first rot_dim dims rotate (rope's n = 4 with rot_dim as the period), the rest pass through exactly.
  void rope_partial(const OpCase& k) {
    const int rows = k.a, heads = 3, D = k.b, rot = k.c, half = rot / 2;
    const size_t n = size_t(rows) * heads * D;
    const double theta = 1e7;
    const auto pos = positions(rows);
    DevArray<int32_t> dpos = upload_pos(pos);
    DevArray<T> x(be, randn(n, 52)), y(be, Vec(n, std::numeric_limits<double>::quiet_NaN()));
    be.rope_partial_forward(be.context(), y.p(), x.p(), dpos.p(), rows, heads, D, rot, theta);
    Vec r = x.host, m(n);
    for (size_t i = 0; i < n; ++i) m[i] = std::fabs(x.host[i]);
    for (int q = 0; q < rows; ++q)
      for (int h = 0; h < heads; ++h) {
        const size_t base = (size_t(q) * heads + h) * D;
        for (int i = 0; i < half; ++i) {
          const double ang = double(pos[size_t(q)]) * std::pow(theta, -2.0 * i / rot), c = std::cos(ang), s = std::sin(ang);
          const double a = x.host[base + i], b = x.host[base + i + half];
          r[base + i] = a * c - b * s, r[base + i + half] = b * c + a * s;
          m[base + i] = std::fabs(a * c) + std::fabs(b * s), m[base + i + half] = std::fabs(b * c) + std::fabs(a * s);
        }
      }
    check("y", y.get(be), r, bounds(r, m, 4, uc, us));
  }

  // y (=) x Wᵀ: an in-term dot (in + 1) on Σ|x||W|. Backward: dx (+=) dy W, an out-term dot and the accumulation
  // (out + 2) on |init| + Σ|dy||W|; dW (+=, in A) dyᵀ x, an N-term dot (N + 2) on |init| + Σ|dy||x|.
  void linear(const OpCase& k) {
    const int N = k.a, in = k.b, out = k.c;
    DevArray<T> x(be, randn(size_t(N) * in, 53)), W(be, randn(size_t(out) * in, 54)), y(be, Vec(size_t(N) * out));
    DevArray<T> dy(be, randn(size_t(N) * out, 55)), dx(be, randn(size_t(N) * in, 56));
    DevArray<A> dW(be, randn(size_t(out) * in, 57));
    be.linear_forward(be.context(), y.p(), x.p(), W.p(), N, in, out);
    be.linear_backward(be.context(), dx.p(), dW.p(), dy.p(), x.p(), W.p(), N, in, out);
    Vec ry(size_t(N) * out), my(ry.size()), rdx = dx.host, mdx(rdx.size()), rdW = dW.host, mdW(rdW.size());
    for (size_t i = 0; i < mdx.size(); ++i) mdx[i] = std::fabs(rdx[i]);
    for (size_t i = 0; i < mdW.size(); ++i) mdW[i] = std::fabs(rdW[i]);
    for (int r = 0; r < N; ++r)
      for (int o = 0; o < out; ++o) {
        double s = 0, sa = 0;
        for (int i = 0; i < in; ++i) {
          const double t = x.host[size_t(r) * in + i] * W.host[size_t(o) * in + i];
          s += t, sa += std::fabs(t);
        }
        ry[size_t(r) * out + o] = s, my[size_t(r) * out + o] = sa;
        const double g = dy.host[size_t(r) * out + o];
        for (int i = 0; i < in; ++i) {
          rdx[size_t(r) * in + i] += g * W.host[size_t(o) * in + i];
          mdx[size_t(r) * in + i] += std::fabs(g * W.host[size_t(o) * in + i]);
          rdW[size_t(o) * in + i] += g * x.host[size_t(r) * in + i];
          mdW[size_t(o) * in + i] += std::fabs(g * x.host[size_t(r) * in + i]);
        }
      }
    check("y", y.get(be), ry, bounds(ry, my, in + 1, uc, us));
    check("dx", dx.get(be), rdx, bounds(rdx, mdx, out + 2, uc, us));
    check("dW", dW.get(be), rdW, bounds(rdW, mdW, N + 2, uc, uc));
  }

  // out (=) softmax(q kᵀ / sqrt(D)) v per query row i (at position past + i, keys 0 .. past + i), Q head h on KV
  // head h / (qh / kvh). A score s_j = scale·Σ_d q_d k_jd is off by δ_j ≤ (D + 2)·u·c_j, c_j = scale·Σ_d |q_d k_jd|;
  // subtracting the row maximum adds u·|s|max to each; exp (2) moves each weight p_j relatively by the difference of
  // two such errors plus 2u, and the normalisation and the keys-term sum of p_j v_j add (keys + 4)·u, all relative
  // to P = Σ_j p_j |v_jd|: n·u_c·M with n = 2·(D + 2)·c_max + 2·|s|max + keys + 6 on M = P. The tensor-core
  // kernels (bf16) round the weights p_j to the storage type for the P·V product: u_s·P more.
  void cached_attention(const OpCase& k) {
    const int n = k.a, past = k.b, qh = k.c, kvh = k.d, D = k.e, keys = past + n, g = qh / kvh;
    DevArray<T> q(be, randn(size_t(n) * qh * D, 60)), kk(be, randn(size_t(keys) * kvh * D, 61)),
        v(be, randn(size_t(keys) * kvh * D, 62)), out(be, Vec(size_t(n) * qh * D));
    if (k.op == Op::causal_attention)  // the prefill entry point: past = 0
      be.attention_causal_forward(be.context(), out.p(), q.p(), kk.p(), v.p(), n, qh, kvh, D);
    else
      be.attention_cached_forward(be.context(), out.p(), q.p(), kk.p(), v.p(), n, past, qh, kvh, D);
    const double scale = 1 / std::sqrt(double(D));
    Vec r(out.host.size()), b(out.host.size());
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < qh; ++h) {
        const double* qi = &q.host[(size_t(i) * qh + h) * D];
        const int kh = h / g, seen = past + i + 1;
        Vec sc(static_cast<size_t>(seen));
        double smax = -std::numeric_limits<double>::infinity(), cmax = 0, sabs = 0;
        for (int j = 0; j < seen; ++j) {
          const double* kj = &kk.host[(size_t(j) * kvh + kh) * D];
          double dot = 0, mag = 0;
          for (int d = 0; d < D; ++d) dot += qi[d] * kj[d], mag += std::fabs(qi[d] * kj[d]);
          sc[size_t(j)] = dot * scale;
          smax = std::max(smax, sc[size_t(j)]), cmax = std::max(cmax, mag * scale);
          sabs = std::max(sabs, std::fabs(sc[size_t(j)]));
        }
        double z = 0;
        for (double& e : sc) z += (e = std::exp(e - smax));
        const double nops = 2 * (D + 2) * cmax + 2 * sabs + keys + 6;
        for (int d = 0; d < D; ++d) {
          double acc = 0, P = 0;
          for (int j = 0; j < seen; ++j) {
            const double vj = v.host[(size_t(j) * kvh + kh) * D + d];
            acc += sc[size_t(j)] / z * vj, P += sc[size_t(j)] / z * std::fabs(vj);
          }
          const size_t o = (size_t(i) * qh + h) * D + d;
          r[o] = acc, b[o] = 2 * (nops * uc * P + us * P + us * std::fabs(acc));
        }
      }
    check("out", out.get(be), r, b);
  }

  // y (=) silu(Σ_{j<K} w[c, j] · in[t + j, c]), in = [tail ; x], the sequence given in three calls (the middle one
  // shorter than the tail) with the tail carried: a K-term sum (K + 1 on Σ|w x|, times |silu'| ≤ 1.1), then silu's
  // exp, sum and division (5 on |y|). The tail is copied inputs: exact.
  void causal_conv1d(const OpCase& k) {
    const int S = k.a, C = k.b, K = k.c;
    DevArray<T> x(be, randn(size_t(S) * C, 63)), w(be, randn(size_t(C) * K, 64, 0.5)), y(be, Vec(size_t(S) * C));
    DevArray<T> tail(be, Vec(size_t(std::max(K - 1, 0)) * C, 0.0));
    const int cut1 = S / 3, cut2 = std::min(S, cut1 + std::max(K - 2, 0));
    for (auto [t0, t1] : {std::pair{0, cut1}, std::pair{cut1, cut2}, std::pair{cut2, S}})
      be.causal_conv1d_silu_forward(be.context(), y.p() + size_t(t0) * C, x.p() + size_t(t0) * C, w.p(), tail.p(),
                                    t1 - t0, C, K);
    Vec r(size_t(S) * C), b(r.size()), rt(tail.host.size());
    for (int t = 0; t < S; ++t)
      for (int c = 0; c < C; ++c) {
        double acc = 0, mag = 0;
        for (int j = 0; j < K; ++j) {
          const int src = t - (K - 1) + j;
          if (src < 0) continue;
          const double e = w.host[size_t(c) * K + j] * x.host[size_t(src) * C + c];
          acc += e, mag += std::fabs(e);
        }
        const double yv = acc / (1 + std::exp(-acc));
        r[size_t(t) * C + c] = yv;
        b[size_t(t) * C + c] = 2 * ((K + 1) * uc * 1.1 * mag + 5 * uc * std::fabs(yv) + us * std::fabs(yv));
      }
    for (int j = 0; j < K - 1; ++j)
      for (int c = 0; c < C; ++c) {
        const int src = S - (K - 1) + j;
        rt[size_t(j) * C + c] = src >= 0 ? x.host[size_t(src) * C + c] : 0.0;
      }
    check("y", y.get(be), r, b);
    check("tail", tail.get(be), rt, Vec(rt.size(), 0.0));
  }

  // The recurrence per value head (kernels/cpu/gated_deltanet.h), a state carried in, the sequence in two calls.
  // Each step's update M ← e^g M + k uᵀ, u = β(v − Mᵀk) with unit k, e^g ≤ 1, β ≤ 1 does not expand M, so the
  // per-step roundings (two dk-term sums and the update: dk + 4) add up at most linearly over the S steps: n =
  // S·(dk + 4) on M = the largest |o| (resp. |state|) of the sequence. The chunked kernels (64-position chunks)
  // reorder the same sums through a triangular solve whose terms are bounded the same way (its matrix is unit
  // lower triangular with |β e^{γ_i−γ_j} k_i·k_j| ≤ 1); their extra sums over a chunk add 64·(dk + 4).
  void delta_rule(const OpCase& k) {
    const int S = k.a, kh = k.b, vh = k.c, dk = k.d, dv = k.e, grp = vh / kh;
    const size_t qn = size_t(S) * kh * dk, vn = size_t(S) * vh * dv, gn = size_t(S) * vh;
    auto unit_rows = [&](Vec x, double scale) {
      for (size_t r = 0; r < x.size() / size_t(dk); ++r) {
        double ss = 0;
        for (int i = 0; i < dk; ++i) ss += x[r * dk + i] * x[r * dk + i];
        for (int i = 0; i < dk; ++i) x[r * dk + i] *= scale / std::sqrt(ss);
      }
      return x;
    };
    Vec g0(gn), b0(gn);
    Rng rng(65);
    for (auto& e : g0) e = -2.0 * rng.uniform();
    for (auto& e : b0) e = 1.0 / (1.0 + std::exp(-rng.normal()));
    DevArray<T> q(be, unit_rows(randn(qn, 66), 1 / std::sqrt(double(dk)))), kk(be, unit_rows(randn(qn, 67), 1.0)),
        v(be, randn(vn, 68)), out(be, Vec(vn));
    DevArray<A> g(be, g0), beta(be, b0), state(be, randn(size_t(vh) * dk * dv, 69, 0.3));
    const int first = S / 2;
    const size_t qo = size_t(first) * kh * dk, vo = size_t(first) * vh * dv, go = size_t(first) * vh;
    be.gated_delta_rule_forward(be.context(), out.p(), q.p(), kk.p(), v.p(), g.p(), beta.p(), state.p(), first, kh, vh,
                                dk, dv, nullptr);
    be.gated_delta_rule_forward(be.context(), out.p() + vo, q.p() + qo, kk.p() + qo, v.p() + vo, g.p() + go,
                                beta.p() + go, state.p(), S - first, kh, vh, dk, dv, nullptr);
    Vec M = state.host, r(vn);
    double omax = 0, smax = 0;
    for (double e : M) smax = std::max(smax, std::fabs(e));
    for (int t = 0; t < S; ++t)
      for (int h = 0; h < vh; ++h) {
        double* Mh = &M[size_t(h) * dk * dv];
        const double* kt = &kk.host[(size_t(t) * kh + h / grp) * dk];
        const double* qt = &q.host[(size_t(t) * kh + h / grp) * dk];
        const double decay = std::exp(g.host[size_t(t) * vh + h]), bt = beta.host[size_t(t) * vh + h];
        for (size_t i = 0; i < size_t(dk) * dv; ++i) Mh[i] *= decay;
        for (int j = 0; j < dv; ++j) {
          double pred = 0;
          for (int i = 0; i < dk; ++i) pred += Mh[size_t(i) * dv + j] * kt[i];
          const double u = bt * (v.host[(size_t(t) * vh + h) * dv + j] - pred);
          for (int i = 0; i < dk; ++i) Mh[size_t(i) * dv + j] += kt[i] * u;
        }
        for (int j = 0; j < dv; ++j) {
          double o = 0;
          for (int i = 0; i < dk; ++i) o += Mh[size_t(i) * dv + j] * qt[i];
          r[(size_t(t) * vh + h) * dv + j] = o, omax = std::max(omax, std::fabs(o));
        }
        for (size_t i = 0; i < size_t(dk) * dv; ++i) smax = std::max(smax, std::fabs(Mh[i]));
      }
    const double nops = double(S + 64) * (dk + 4);
    check("out", out.get(be), r, bounds(r, Vec(vn, omax), nops, uc, us));
    check("state", state.get(be), M, bounds(M, Vec(M.size(), smax), nops, uc, uc));
  }

  // index (=) the first column of the row's largest value, NaNs never winning (−1 when all are NaN), value (=) it:
  // comparisons only, so both exact (the bound is 0). Ties, a NaN first, an all-NaN row, an all −inf row, +inf last.
  void argmax(const OpCase& k) {
    const int rows = k.a, cols = k.b;
    Vec x0 = randn(size_t(rows) * cols, 70, 3.0);
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    if (rows > 1) x0[size_t(cols) - 1] = x0[size_t(cols) / 2] = x0[0] = 50;  // ties in row 0: column 0 wins
    if (rows > 2) x0[size_t(cols)] = nan;
    if (rows > 3) std::fill_n(x0.begin() + 2 * size_t(cols), cols, nan);
    if (rows > 4) std::fill_n(x0.begin() + 3 * size_t(cols), cols, -inf);
    if (rows > 5) x0[5 * size_t(cols) - 1] = inf;
    DevArray<T> x(be, x0);
    DevArray<int32_t> index(be, Vec(size_t(rows), -5));
    DevArray<A> value(be, Vec(size_t(rows), 0));
    be.argmax_rows(be.context(), index.p(), value.p(), x.p(), rows, cols);
    Vec ri(size_t(rows), -1), rv(size_t(rows), -inf);
    for (int q = 0; q < rows; ++q)
      for (int c = 0; c < cols; ++c) {
        const double e = x.host[size_t(q) * cols + c];
        if (e == e && (ri[size_t(q)] < 0 || e > rv[size_t(q)])) ri[size_t(q)] = c, rv[size_t(q)] = e;
      }
    Vec gv = value.get(be);
    for (size_t i = 0; i < gv.size(); ++i)
      if (gv[i] == rv[i]) gv[i] = rv[i] = 0;  // equal infinities compare as equal
    check("index", index.get(be), ri, Vec(ri.size(), 0.0));
    check("value", gv, rv, Vec(rv.size(), 0.0));
  }

  // DFlash attention (kernels/attention_shape.h) forward, then backward from the backend's own out and lse (as the
  // drafter runs it) into randomly initialised gradients (+=). Per (row, head): the visible keys K_r (context
  // [lo, hi), block [0, nb)), s_j = scale·q·k_j, p = softmax(s), out = Σ p_j v_j, lse = log Σ e^{s_j}.
  // Forward bounds as the cached attention's (n = 2·(D + 2)·c_max + 2·|s|max + keys + 6 on P = Σ p_j |v_j|, + u_s·P
  // for the tensor-core P·V); lse: the score errors (D + 2)·u·c_max, the sum and log (keys + 4), plus u·|lse|.
  // Backward: the kernel's weights p_j = e^{s_j − lse} are off relatively by e_p = 2·(its score and lse errors),
  // dP_j = dO·v_j by (D + 1)·u·Σ|dO v_j|, delta = dO·O by (D + 1)·u·Σ|dO O| + Σ_d |dO_d|·ε(O_d) (ε: the forward's
  // bound of the output it reads); so dS_j = p_j (dP_j − delta) is off by E_j = p_j·(e_p·(|dP_j| + |delta|) +
  // ΔdP_j + Δdelta) + u_s·|dS_j| (the tensor-core kernels round dS and P to the storage type for their products).
  // Each gradient element is a sum of such terms (dq: over the row's keys; dk, dv: over every (row, head) that sees
  // the key, at most Q of them) plus its initial value: Σ (E·|x|) + (terms + 2)·u·(Σ|term| + |initial|) +
  // u_s·|result|, ×2.
  void dflash_attention(const OpCase& k) {
    kernels::DFlashAttentionShape sh;
    sh.n_blocks = k.a, sh.block = k.b, sh.ctx_len = k.c, sh.heads = k.d, sh.kv_heads = k.e, sh.head_dim = k.f;
    sh.window = k.g;
    const int NB = sh.n_blocks * sh.block, NH = sh.heads, KVH = sh.kv_heads, D = sh.head_dim, S = sh.ctx_len;
    const int G = NH / KVH;
    const size_t qn = size_t(NB) * NH * D, cn = size_t(S) * KVH * D, bn = size_t(NB) * KVH * D;
    DevArray<T> q(be, randn(qn, 80)), kc(be, randn(cn, 81)), vc(be, randn(cn, 82)), kb(be, randn(bn, 83)),
        vb(be, randn(bn, 84)), dout(be, randn(qn, 85)), out(be, Vec(qn));
    DevArray<A> lse(be, Vec(size_t(NB) * NH));
    DevArray<int32_t> anchors(be, Vec(k.anchors.begin(), k.anchors.end()));
    DevArray<T> dq(be, randn(qn, 86)), dkc(be, randn(cn, 87)), dvc(be, randn(cn, 88)), dkb(be, randn(bn, 89)),
        dvb(be, randn(bn, 90));
    be.dflash_attention_forward(be.context(), out.p(), lse.p(), q.p(), kc.p(), vc.p(), kb.p(), vb.p(), anchors.p(), sh);
    be.dflash_attention_backward(be.context(), dq.p(), dkc.p(), dvc.p(), dkb.p(), dvb.p(), dout.p(), out.p(), lse.p(),
                                 q.p(), kc.p(), vc.p(), kb.p(), vb.p(), anchors.p(), sh);
    const double scale = 1 / std::sqrt(double(D));
    // r*: the exact results; m*: the Σ E·|x| parts of the bounds; a*: the Σ |term| parts
    Vec ro(qn), bo(qn), rl(size_t(NB) * NH), bl(rl.size());
    Vec rdq = dq.host, rdkc = dkc.host, rdvc = dvc.host, rdkb = dkb.host, rdvb = dvb.host;
    Vec mdq(qn), adq(qn), mdkc(cn), adkc(cn), mdvc(cn), advc(cn), mdkb(bn), adkb(bn), mdvb(bn), advb(bn);
    std::vector<int> seen_ctx(size_t(S) * KVH), seen_blk(size_t(NB) * KVH);  // (row, head) pairs per key
    struct Key {
      const double *k, *v;
      double *dk, *dv, *mk, *ak, *mv, *av;
      int* seen;
    };
    for (int b = 0; b < sh.n_blocks; ++b)
      for (int j = 0; j < sh.block; ++j)
        for (int h = 0; h < NH; ++h) {
          const int row = b * sh.block + j, g = h / G;
          int lo, hi;
          kernels::dflash_ctx_range(sh, k.anchors[size_t(b)], j, lo, hi);
          std::vector<Key> keys;
          for (int t = lo; t < hi; ++t) {
            const size_t o = (size_t(t) * KVH + g) * D;
            keys.push_back({&kc.host[o], &vc.host[o], &rdkc[o], &rdvc[o], &mdkc[o], &adkc[o], &mdvc[o], &advc[o],
                            &seen_ctx[size_t(t) * KVH + g]});
          }
          for (int t = 0; t < kernels::dflash_blk_count(sh, j); ++t) {
            const size_t o = ((size_t(b) * sh.block + t) * KVH + g) * D;
            keys.push_back({&kb.host[o], &vb.host[o], &rdkb[o], &rdvb[o], &mdkb[o], &adkb[o], &mdvb[o], &advb[o],
                            &seen_blk[(size_t(b) * sh.block + t) * KVH + g]});
          }
          const size_t qo = (size_t(row) * NH + h) * D;
          const double* qi = &q.host[qo];
          const double* doi = &dout.host[qo];
          const int nk = int(keys.size());
          Vec sc(static_cast<size_t>(nk)), p(sc.size());
          double smax = -std::numeric_limits<double>::infinity(), cmax = 0, sabs = 0;
          for (int t = 0; t < nk; ++t) {
            double dot = 0, mag = 0;
            for (int d = 0; d < D; ++d) {
              dot += qi[d] * keys[size_t(t)].k[d];
              mag += std::fabs(qi[d] * keys[size_t(t)].k[d]);
            }
            sc[size_t(t)] = dot * scale, cmax = std::max(cmax, mag * scale);
            smax = std::max(smax, sc[size_t(t)]), sabs = std::max(sabs, std::fabs(sc[size_t(t)]));
          }
          double z = 0;
          for (int t = 0; t < nk; ++t) z += std::exp(sc[size_t(t)] - smax);
          const double L = smax + std::log(z);
          for (int t = 0; t < nk; ++t) p[size_t(t)] = std::exp(sc[size_t(t)] - L);
          const double e_s = (D + 2) * uc * cmax + (nk + 4) * uc + uc * std::fabs(L);  // a score's or lse's error
          rl[size_t(row) * NH + h] = L;
          bl[size_t(row) * NH + h] = 2 * e_s;
          const double nops = 2 * (D + 2) * cmax + 2 * sabs + nk + 6;
          double delta = 0, ddelta = 0;
          for (int d = 0; d < D; ++d) {
            double acc = 0, P = 0;
            for (int t = 0; t < nk; ++t) {
              acc += p[size_t(t)] * keys[size_t(t)].v[d];
              P += p[size_t(t)] * std::fabs(keys[size_t(t)].v[d]);
            }
            ro[qo + d] = acc;
            bo[qo + d] = 2 * (nops * uc * P + us * P + us * std::fabs(acc));
            delta += doi[d] * acc;
            ddelta += (D + 1) * uc * std::fabs(doi[d] * acc) + std::fabs(doi[d]) * bo[qo + d];
          }
          const double e_p = 2 * e_s;
          for (int t = 0; t < nk; ++t) {
            const Key& key = keys[size_t(t)];
            double dP = 0, dPmag = 0;
            for (int d = 0; d < D; ++d) dP += doi[d] * key.v[d], dPmag += std::fabs(doi[d] * key.v[d]);
            const double pj = p[size_t(t)], dS = pj * (dP - delta);
            const double E = pj * (e_p * (std::fabs(dP) + std::fabs(delta)) + (D + 1) * uc * dPmag + ddelta) +
                             us * std::fabs(dS);
            ++*key.seen;
            for (int d = 0; d < D; ++d) {
              rdq[qo + d] += scale * dS * key.k[d];
              mdq[qo + d] += scale * E * std::fabs(key.k[d]);
              adq[qo + d] += scale * std::fabs(dS * key.k[d]);
              key.dk[d] += scale * dS * qi[d];
              key.mk[d] += scale * E * std::fabs(qi[d]);
              key.ak[d] += scale * std::fabs(dS * qi[d]);
              key.dv[d] += pj * doi[d];
              key.mv[d] += (e_p + us) * pj * std::fabs(doi[d]);
              key.av[d] += pj * std::fabs(doi[d]);
            }
          }
        }
    int qmax = 0;
    for (int n : seen_ctx) qmax = std::max(qmax, n);
    for (int n : seen_blk) qmax = std::max(qmax, n);
    const int keys_max = S + sh.block;
    auto grad_bound = [&](const Vec& r, const Vec& m, const Vec& a, const Vec& init, int terms) {
      Vec b(r.size());
      for (size_t i = 0; i < r.size(); ++i)
        b[i] = 2 * (m[i] + (terms + 2) * uc * (a[i] + std::fabs(init[i])) + us * std::fabs(r[i]));
      return b;
    };
    check("out", out.get(be), ro, bo);
    check("lse", lse.get(be), rl, bl);
    check("dq", dq.get(be), rdq, grad_bound(rdq, mdq, adq, dq.host, keys_max));
    check("dk_ctx", dkc.get(be), rdkc, grad_bound(rdkc, mdkc, adkc, dkc.host, qmax));
    check("dv_ctx", dvc.get(be), rdvc, grad_bound(rdvc, mdvc, advc, dvc.host, qmax));
    check("dk_blk", dkb.get(be), rdkb, grad_bound(rdkb, mdkb, adkb, dkb.host, qmax));
    check("dv_blk", dvb.get(be), rdvb, grad_bound(rdvb, mdvb, advb, dvb.host, qmax));
  }

  void run(const OpCase& k) {
    switch (k.op) {
      case Op::residual: return residual(k);
      case Op::swiglu: return swiglu(k);
      case Op::rmsnorm: return rmsnorm(k);
      case Op::rope: return rope(k);
      case Op::head_norm_rope: return head_norm_rope(k);
      case Op::vocab_loss_rows: return vocab_loss_rows(k);
      case Op::adamw: return adamw(k);
      case Op::gemm: return gemm(k);
      case Op::accumulate_scale: return accumulate_scale(k);
      case Op::sigmoid_gate: return sigmoid_gate(k);
      case Op::l2norm: return l2norm(k);
      case Op::gated_rmsnorm: return gated_rmsnorm(k);
      case Op::deltanet_gates: return deltanet_gates(k);
      case Op::rope_partial: return rope_partial(k);
      case Op::linear: return linear(k);
      case Op::cached_attention:
      case Op::causal_attention: return cached_attention(k);
      case Op::causal_conv1d: return causal_conv1d(k);
      case Op::delta_rule: return delta_rule(k);
      case Op::argmax: return argmax(k);
      case Op::dflash_attention: return dflash_attention(k);
    }
  }
};

// Every case of the table the backend takes, each output within its bound; prints one line per op with the worst
// measured |got − ref| / bound of its cases.
template <typename T>
void run_table(Backend<T>& be, bool is_cuda) {
  std::vector<std::pair<Op, double>> worst_by_op;
  int ran = 0;
  for (const OpCase& k : op_cases()) {
    if (is_cuda && !k.cuda) continue;
    Runner<T> r{be, {}};
    r.run(k);
    ++ran;
    double case_worst = 0;
    for (const auto& [what, w] : r.results) {
      INFO(be.name() << " " << type_name<T>() << ": " << k.describe() << ", " << what << ": element " << w.at << " got "
                     << w.got << " ref " << w.ref << " bound " << w.bound);
      CHECK_FALSE(w.nan);
      CHECK(w.ratio <= 1.0);
      case_worst = std::max(case_worst, w.ratio);
    }
    auto it = std::find_if(worst_by_op.begin(), worst_by_op.end(), [&](const auto& p) { return p.first == k.op; });
    if (it == worst_by_op.end())
      worst_by_op.push_back({k.op, case_worst});
    else
      it->second = std::max(it->second, case_worst);
  }
  CHECK(ran > 0);
  for (const auto& [op, w] : worst_by_op)
    std::printf("backend ops %s %s: %-36s worst |got - ref| / bound %.3g\n", be.name(), type_name<T>(), op_name(op), w);
}

}  // namespace dflash::test::ops
