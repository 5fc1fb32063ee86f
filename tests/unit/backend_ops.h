#pragma once
// One table of op cases with a plain double reference, run through the Backend<T> interface against every backend
// the build has (as ggml's test-backend-ops): tests/unit/test_backend_ops.cpp runs the CPU in float and
// double, tests/cuda/test_cuda_backend_ops.cpp runs CUDA in float and bf16 where the build has CUDA (the emulated
// GPU in CI; a build or machine without it reports those skipped, never passed). There is no CPU bf16 backend
// (make_backend<bf16>(Device::cpu) is a user error), so bf16 is CUDA's alone.
//
// An op case is one struct (its shape as named fields, vars() to print them, eval<T>() to run it on a backend and
// compute its reference and bounds) and one registration line in op_cases(). Whether a backend runs a case is the
// backend's answer (Backend::supports, asked by the case's supported_by), never a flag of the case.
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
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
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

// The bound of a result that must be the reference to the bit (copies, aliasing, run to run).
inline Vec exact(size_t n) { return Vec(n, 0.0); }

// Bound from the derivation in the header: 2·(n·u_c·M + u_s·|y|).
inline Vec bounds(const Vec& ref, const Vec& mag, double n, double u_c, double u_s) {
  Vec b(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) b[i] = 2.0 * (n * u_c * mag[i] + u_s * std::fabs(ref[i]));
  return b;
}

// ---- the harness: what a case checks with, the case interface ----
// What eval() runs on and records into: the backend, the unit roundoffs of its compute and storage types, and the
// worst |got − ref| / bound of every output the case checks.
template <typename T>
struct Check {
  Backend<T>& be;
  static constexpr double uc = std::is_same_v<T, double> ? 0x1.0p-53 : 0x1.0p-24;  // compute
  static constexpr double us = unit<T>();                                           // T storage
  std::vector<std::pair<std::string, Worst>> results;

  void check(const std::string& what, const Vec& got, const Vec& ref, const Vec& bound) {
    results.push_back({what, compare(got, ref, bound)});
  }
};

// One op case. Case<D> below turns a struct's eval<T>() and supported_by<T>() into these.
struct OpCase {
  virtual ~OpCase() = default;
  virtual const char* op() const = 0;    // the op, as the summary names it: "rmsnorm forward and backward"
  virtual std::string vars() const = 0;  // the case's shape: "rows 7, dim 33"
  virtual bool supported(const Backend<float>& be) const = 0;
  virtual bool supported(const Backend<double>& be) const = 0;
  virtual bool supported(const Backend<bf16>& be) const = 0;
  virtual void run(Check<float>& chk) const = 0;
  virtual void run(Check<double>& chk) const = 0;
  virtual void run(Check<bf16>& chk) const = 0;
};

template <typename D>
struct Case : OpCase {
  // every backend runs every shape of an op unless the case asks the backend (its own supported_by)
  template <typename T>
  bool supported_by(const Backend<T>&) const { return true; }
  bool supported(const Backend<float>& be) const override { return self().supported_by(be); }
  bool supported(const Backend<double>& be) const override { return self().supported_by(be); }
  bool supported(const Backend<bf16>& be) const override { return self().supported_by(be); }
  void run(Check<float>& chk) const override { self().eval(chk); }
  void run(Check<double>& chk) const override { self().eval(chk); }
  void run(Check<bf16>& chk) const override { self().eval(chk); }

 private:
  const D& self() const { return static_cast<const D&>(*this); }
};

// ---- what several cases share ----
// Rotate-half at angle pos·θ^(−2i/D): y_a = a c − b s, y_b = b c + a s with c, s rounded to fp32 once (1 each)
// and two products and a sum (3): n = 4 on M = |a c| + |b s|; an odd head_dim's last dim passes through (n = 0).
// Backward (+=) rotates by −angle: one more operation for the accumulation, M += |init|.
inline void rope_ref(const Vec& x, const Vec& init, const std::vector<int32_t>& pos, int rows, int heads, int D,
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
inline std::vector<int32_t> positions(int rows) {
  std::vector<int32_t> p(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) p[size_t(r)] = int32_t((r * 7919) % 40961);  // up to 4e4: long-context angles
  return p;
}
template <typename T>
DevArray<int32_t> upload_pos(Backend<T>& be, const std::vector<int32_t>& p) {
  Vec v(p.begin(), p.end());
  return DevArray<int32_t>(be, v);
}

// ---- the op cases ----
// out = a + b: one operation, M = |a| + |b|.
struct Residual : Case<Residual> {
  int elements;
  explicit Residual(int elements_) : elements(elements_) {}
  const char* op() const override { return "residual_forward"; }
  std::string vars() const override { return fmt::format("n {}", elements); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const size_t n = size_t(elements);
    DevArray<T> a(be, randn(n, 1)), b(be, randn(n, 2)), out(be, Vec(n));
    be.residual_forward(be.context(), out.p(), a.p(), b.p(), n);
    Vec ref(n), mag(n);
    for (size_t i = 0; i < n; ++i) ref[i] = a.host[i] + b.host[i], mag[i] = std::fabs(a.host[i]) + std::fabs(b.host[i]);
    chk.check("out", out.get(be), ref, bounds(ref, mag, 1, uc, us));
  }
};

// h = g σ(g) u: exp (2), 1 + e, the division, two products: 6 operations on M = |h| (σ = 1/(1 + e^−g) has at
// most the relative error of e^−g plus its own two). Backward dgate (+=) dh·u·σ(1 + g(1 − σ)): 1 − σ has an
// absolute error of about 6 u_c when σ → 1, which g multiplies: M = |init| + |dh u σ| (1 + |g|(1 − σ))(1 + |g|)
// bounds it, n = 10 (σ's 6, the sum, the products); dup (+=) dh·g·σ: the same n on |init| + |dh g σ|(1 + |g|).
struct Swiglu : Case<Swiglu> {
  int elements;
  explicit Swiglu(int elements_) : elements(elements_) {}
  const char* op() const override { return "swiglu forward and backward"; }
  std::string vars() const override { return fmt::format("n {}", elements); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const size_t n = size_t(elements);
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
    chk.check("h", h.get(be), rh, bounds(rh, mh, 6, uc, us));
    chk.check("dgate", dg.get(be), rg, bounds(rg, mg, 10, uc, us));
    chk.check("dup", du.get(be), ru, bounds(ru, mu, 10, uc, us));
  }
};

// rstd = 1/sqrt(Σx²/d + ε): the sum of d squares (d + 1), the division, +ε, sqrt (2), the reciprocal: n = d + 6
// relative to rstd (Σx² is a sum of positive terms: its relative error is its absolute error over itself), of
// which sqrt halves the sum's part. y = x·rstd·w: 2 more on M = |y|. Backward, with g = dy·w, n̂ = x·rstd:
// dx (+=) rstd (g − n̂ · mean(g n̂)): the dot of d terms (d + 3 operations) and the rest (5) on
// M = |init| + rstd (|g| + |n̂| mean|g n̂|); dw (+=) Σ_rows dy x rstd: rows + 3 on M = |init| + Σ|dy x rstd|. rstd is
// the input the backend's forward stored (in A), the reference reads the same rounded value.
struct Rmsnorm : Case<Rmsnorm> {
  int rows;
  int dim;
  Rmsnorm(int rows_, int dim_) : rows(rows_), dim(dim_) {}
  const char* op() const override { return "rmsnorm forward and backward"; }
  std::string vars() const override { return fmt::format("rows {}, dim {}", rows, dim); }
  template <typename T>
  void eval(Check<T>& chk) const {
    using A = acc_t<T>;
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
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
    chk.check("rstd", rstd_got, rr, bounds(rr, mr, dim / 2.0 + 6, uc, uc));
    chk.check("y", y.get(be), ry, bounds(ry, my, dim / 2.0 + 8, uc, us));

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
    chk.check("dx", dx.get(be), rdx, bounds(rdx, mdx, dim + 8, uc, us));
    chk.check("dw", dw.get(be), rdw, bounds(rdw, mdw, rows + 3, uc, uc));
    // y may alias x: in place, the same bits; dw is deterministic: the backward again gives the same bits
    DevArray<T> xa(be, x.host), dx2(be, dx.host);
    DevArray<A> rstd2(be, Vec(static_cast<size_t>(rows))), dw2(be, dw.host);
    be.rmsnorm_forward(be.context(), xa.p(), rstd2.p(), xa.p(), w.p(), rows, dim, eps);
    chk.check("y aliasing x", xa.get(be), y.get(be), exact(n));
    be.rmsnorm_backward(be.context(), dx2.p(), dw2.p(), dy.p(), x.p(), w.p(), rstd.p(), rows, dim);
    chk.check("dw run to run", dw2.get(be), dw.get(be), exact(size_t(dim)));
  }
};


struct Rope : Case<Rope> {
  int rows;
  int heads;
  int head_dim;
  Rope(int rows_, int heads_, int head_dim_) : rows(rows_), heads(heads_), head_dim(head_dim_) {}
  const char* op() const override { return "rope forward and backward"; }
  std::string vars() const override { return fmt::format("rows {}, heads {}, head_dim {}", rows, heads, head_dim); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const int D = head_dim;
    const size_t n = size_t(rows) * heads * D;
    const double theta = 1e6;
    const auto pos = positions(rows);
    DevArray<int32_t> dpos = upload_pos(be, pos);
    DevArray<T> x(be, randn(n, 13)), y(be, Vec(n, std::numeric_limits<double>::quiet_NaN())), dx(be, randn(n, 14));
    be.rope_forward(be.context(), y.p(), x.p(), dpos.p(), rows, heads, D, theta);
    Vec ref, mag;
    rope_ref(x.host, Vec(n), pos, rows, heads, D, theta, +1, ref, mag);
    chk.check("y", y.get(be), ref, bounds(ref, mag, 4, uc, us));
    DevArray<T> xa(be, x.host);  // y may alias x: in place, the same bits
    be.rope_forward(be.context(), xa.p(), xa.p(), dpos.p(), rows, heads, D, theta);
    chk.check("y aliasing x", xa.get(be), y.get(be), exact(n));
    be.rope_backward(be.context(), dx.p(), x.p(), dpos.p(), rows, heads, D, theta);
    rope_ref(x.host, dx.host, pos, rows, heads, D, theta, -1, ref, mag);
    chk.check("dx", dx.get(be), ref, bounds(ref, mag, 5, uc, us));
  }
};

// The fused per-head RMSNorm + RoPE: rmsnorm's forward (d/2 + 8) then the rotation (4) on the normed values
// (M from the rotation of n̂ w); backward: the rotation back (4) then rmsnorm's backward (d + 8), M as rmsnorm's
// with g = Rᵀ dy, |g| bounded by the rotation's M.
struct HeadNormRope : Case<HeadNormRope> {
  int rows;
  int heads;
  int head_dim;
  HeadNormRope(int rows_, int heads_, int head_dim_) : rows(rows_), heads(heads_), head_dim(head_dim_) {}
  const char* op() const override { return "head_norm_rope forward and backward"; }
  std::string vars() const override { return fmt::format("rows {}, heads {}, head_dim {}", rows, heads, head_dim); }
  // the CUDA backend's fused kernel takes an even head_dim up to 256 (Backend::supports says so)
  template <typename T>
  bool supported_by(const Backend<T>& be) const {
    return be.supports(kernels::Feature::head_norm_rope, head_dim);
  }
  template <typename T>
  void eval(Check<T>& chk) const {
    using A = acc_t<T>;
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const int D = head_dim, nr = rows * heads;
    const size_t n = size_t(nr) * D;
    const double eps = 1e-6, theta = 1e4;
    const auto pos = positions(rows);
    DevArray<int32_t> dpos = upload_pos(be, pos);
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
    chk.check("rstd", rstd_got, rr, bounds(rr, rr, D / 2.0 + 6, uc, uc));
    Vec ry, my;
    rope_ref(normed, Vec(n), head_pos, nr, 1, D, theta, +1, ry, my);
    chk.check("y", y.get(be), ry, bounds(ry, my, D / 2.0 + 12, uc, us));

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
    chk.check("dx", dx.get(be), rdx, bounds(rdx, mdx, D + 12, uc, us));
    chk.check("dw", dw.get(be), rdw, bounds(rdw, mdw, nr + 7, uc, uc));
    // y may alias x; dw is deterministic; a null dw leaves dx as it was with one
    DevArray<T> xa(be, x.host), dx2(be, dx.host), dx3(be, dx.host);
    DevArray<A> rstd2(be, Vec(static_cast<size_t>(nr))), dw2(be, dw.host);
    be.head_norm_rope_forward(be.context(), xa.p(), rstd2.p(), xa.p(), w.p(), dpos.p(), rows, heads, D, eps, theta);
    chk.check("y aliasing x", xa.get(be), y.get(be), exact(n));
    be.head_norm_rope_backward(be.context(), dx2.p(), dw2.p(), dy.p(), x.p(), w.p(), rstd.p(), dpos.p(), rows, heads,
                               D, theta);
    chk.check("dw run to run", dw2.get(be), dw.get(be), exact(size_t(D)));
    be.head_norm_rope_backward(be.context(), dx3.p(), nullptr, dy.p(), x.p(), w.p(), rstd.p(), dpos.p(), rows, heads,
                               D, theta);
    chk.check("dx without dw", dx3.get(be), dx.get(be), exact(n));
  }
};

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
struct VocabLossRows : Case<VocabLossRows> {
  int rows;
  int V;
  double tau;
  bool with_u;
  bool overlap;  // the TV, LK-hybrid and NLA terms too (defined at τ = 1, with the target)
  VocabLossRows(int rows_, int V_, double tau_, bool with_u_, bool overlap_ = false)
      : rows(rows_), V(V_), tau(tau_), with_u(with_u_), overlap(overlap_) {}
  const char* op() const override { return "vocab_loss row_stats and row_grad"; }
  std::string vars() const override {
    return fmt::format("rows {}, V {}, tau {}, {}{}", rows, V, tau, with_u ? "with u" : "no u",
                       overlap ? ", +TV/LK/NLA" : "");
  }
  template <typename T>
  void eval(Check<T>& chk) const {
    using A = acc_t<T>;
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const size_t n = size_t(rows) * V;
    kernels::VocabLossCoeffs coeffs{0.8, with_u ? 0.6 : 0.0, 0.3, tau};
    if (overlap) coeffs.tv = 0.5, coeffs.lk = 0.4, coeffs.nla = 0.3, coeffs.lk_eta = 2.5;
    const bool ov = overlap;
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
    const T* up = with_u ? du.p() : nullptr;
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
      if (with_u)
        for (int v = 0; v < V; ++v) {
          const double q = std::exp(ur[v] / tau - Lu);
          kl += q * ((ur[v] / tau - Lu) - (zr[v] / tau - Lt));
        }
      kl *= tau * tau;
      const double R = std::max(zmax - zmin, with_u ? umax - umin : 0.0), rt = R * std::max(1.0, 1 / tau);
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
        if (with_u) {
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
    chk.check(ov ? "ce, cap, kl, tv, nla, lk" : "ce, cap, kl", got_v, ref_v, bnd_v);
    chk.check("d logits", grad, rg, bg);
  }
};

// AdamW on fp32 master weights (whatever T is): m' = β1 m + (1 − β1) g and v' = β2 v + (1 − β2) g²: 3 and 4
// operations on M = |β1 m| + |(1 − β1) g| (resp. for v); p' = p − λ p − s m' / (√v' c + ε): the update carries the
// error of m' (3 on its M, scaled by s / (√v' c + ε): m' may cancel to near 0) and its own √v' (4/2 + 2), product, sum
// and division (7 relative to |update|), the decay 2 relative to |λ p|, and the two subtractions one each, relative
// to their results |p − λ p| and |p'| (p' too may cancel). Stored in fp32.
struct AdamW : Case<AdamW> {
  int elements;
  explicit AdamW(int elements_) : elements(elements_) {}
  const char* op() const override { return "adamw_step"; }
  std::string vars() const override { return fmt::format("n {}", elements); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const size_t n = size_t(elements);
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
      const double step = double(c.step_size) / (std::sqrt(rv[i]) * double(c.inv_sqrt_bc2) + double(c.eps));
      const double upd = step * rm[i];
      rp[i] = p.host[i] - decay - upd;
      mp[i] = 7 * std::fabs(upd) + 3 * step * mm[i] + 2 * std::fabs(decay) + std::fabs(p.host[i] - decay) +
              std::fabs(rp[i]);
    }
    chk.check("m", m.get(be), rm, bounds(rm, mm, 3, u32, u32));
    chk.check("v", v.get(be), rv, bounds(rv, mv, 4, u32, u32));
    chk.check("params", p.get(be), rp, bounds(rp, mp, 1, u32, u32));
  }
};

// C = α op(A) op(B) + β C: a K-term dot (K operations, any order), α, β and the sum (3) on
// M = |α| Σ|a||b| + |β c|, stored in T. K = 0 leaves β C.
struct Gemm : Case<Gemm> {
  int M, N, K;
  bool trans_a, trans_b;
  double alpha, beta;
  bool padded;  // rows of A, B, C padded by 3, 1, 2 elements: the strides are honoured and the padding untouched
  Gemm(int M_, int N_, int K_, bool trans_a_, bool trans_b_, double alpha_, double beta_, bool padded_)
      : M(M_), N(N_), K(K_), trans_a(trans_a_), trans_b(trans_b_), alpha(alpha_), beta(beta_), padded(padded_) {}
  const char* op() const override { return "gemm"; }
  std::string vars() const override {
    return fmt::format("M {}, N {}, K {}{}{}, alpha {}, beta {}{}", M, N, K, trans_a ? ", Aᵀ" : "", trans_b ? ", Bᵀ" : "",
                       alpha, beta, padded ? ", padded rows" : "");
  }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const int a_rows = trans_a ? K : M, b_rows = trans_b ? N : K;
    const int lda = (trans_a ? M : K) + (padded ? 3 : 0), ldb = (trans_b ? K : N) + (padded ? 1 : 0),
              ldc = N + (padded ? 2 : 0);
    DevArray<T> a(be, randn(size_t(a_rows) * lda, 27)), b(be, randn(size_t(b_rows) * ldb, 28)),
        c(be, randn(size_t(M) * ldc, 29));
    be.gemm(be.context(), trans_a, trans_b, M, N, K, alpha, a.p(), lda, b.p(), ldb, beta, c.p(), ldc);
    Vec ref = c.host, mag(ref.size());  // the padding keeps its values (bound 0)
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = 0, sa = 0;
        for (int t = 0; t < K; ++t) {
          const double av = trans_a ? a.host[size_t(t) * lda + i] : a.host[size_t(i) * lda + t];
          const double bv = trans_b ? b.host[size_t(j) * ldb + t] : b.host[size_t(t) * ldb + j];
          s += av * bv, sa += std::fabs(av * bv);
        }
        const size_t o = size_t(i) * ldc + j;
        ref[o] = alpha * s + (beta != 0 ? beta * c.host[o] : 0.0);
        mag[o] = std::fabs(alpha) * sa + std::fabs(beta * c.host[o]);
      }
    chk.check("C", c.get(be), ref, bounds(ref, mag, K + 3, uc, us));
  }
};

// y (+=) x: 1 operation on |y| + |x|; then x (=) x · s: s rounded to the compute type and the product, 2 on |x s|.
struct AccumulateScale : Case<AccumulateScale> {
  int elements;
  explicit AccumulateScale(int elements_) : elements(elements_) {}
  const char* op() const override { return "accumulate and scale"; }
  std::string vars() const override { return fmt::format("n {}", elements); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const size_t n = size_t(elements);
    const double sc = 0.3;
    DevArray<T> y(be, randn(n, 40)), x(be, randn(n, 41));
    be.accumulate(be.context(), y.p(), x.p(), n);
    Vec ry(n), my(n);
    for (size_t i = 0; i < n; ++i) ry[i] = y.host[i] + x.host[i], my[i] = std::fabs(y.host[i]) + std::fabs(x.host[i]);
    chk.check("accumulate", y.get(be), ry, bounds(ry, my, 1, uc, us));
    be.scale(be.context(), x.p(), sc, n);
    Vec rx(n), mx(n);
    for (size_t i = 0; i < n; ++i) rx[i] = x.host[i] * sc, mx[i] = std::fabs(rx[i]);
    chk.check("scale", x.get(be), rx, bounds(rx, mx, 2, uc, us));
  }
};

// x (=) x · σ(gate): σ's 6 operations (as swiglu's) and the product: 7 on |y|.
struct SigmoidGate : Case<SigmoidGate> {
  int elements;
  explicit SigmoidGate(int elements_) : elements(elements_) {}
  const char* op() const override { return "sigmoid_gate"; }
  std::string vars() const override { return fmt::format("n {}", elements); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const size_t n = size_t(elements);
    DevArray<T> x(be, randn(n, 42)), g(be, randn(n, 43, 3.0));
    be.sigmoid_gate(be.context(), x.p(), g.p(), n);
    Vec r(n), m(n);
    for (size_t i = 0; i < n; ++i) r[i] = x.host[i] / (1 + std::exp(-g.host[i])), m[i] = std::fabs(r[i]);
    chk.check("x", x.get(be), r, bounds(r, m, 7, uc, us));
  }
};

// x (= in place) x · scale / sqrt(Σx² + ε): the sum (d + 1), sqrt (2, halving the sum's part), the division and
// the product: d/2 + 6 on |y|.
struct L2norm : Case<L2norm> {
  int rows;
  int dim;
  L2norm(int rows_, int dim_) : rows(rows_), dim(dim_) {}
  const char* op() const override { return "l2norm_forward"; }
  std::string vars() const override { return fmt::format("rows {}, dim {}", rows, dim); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
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
    chk.check("x", x.get(be), r, bounds(r, m, dim / 2.0 + 6, uc, us));
  }
};

// y (=) w · (x · rstd) · silu(z): rstd as RMSNorm's (d/2 + 6), silu's 5, three products: d/2 + 14 on |y|.
struct GatedRmsnorm : Case<GatedRmsnorm> {
  int rows;
  int dim;
  GatedRmsnorm(int rows_, int dim_) : rows(rows_), dim(dim_) {}
  const char* op() const override { return "gated_rmsnorm_forward"; }
  std::string vars() const override { return fmt::format("rows {}, dim {}", rows, dim); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
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
    chk.check("y", y.get(be), r, bounds(r, m, dim / 2.0 + 14, uc, us));
    DevArray<T> xa(be, x.host);  // y may alias x: in place, the same bits
    be.gated_rmsnorm_forward(be.context(), xa.p(), xa.p(), z.p(), w.p(), rows, dim, eps);
    chk.check("y aliasing x", xa.get(be), y.get(be), exact(n));
  }
};

// β (=) σ(b): 6 on |β|. g (=) −exp(a_log) · softplus(a + dt): the sum's absolute error u(|a| + |dt|) moves
// log softplus by at most that (d log softplus / dx = σ(x) / softplus(x) ≤ 1), then exp, log1p, exp (2 each) and
// the product: relative 7 + (|a| + |dt|), counted as n = 7 on M = |g| (1 + (|a| + |dt|)/7). Both in A.
struct DeltanetGates : Case<DeltanetGates> {
  int rows;
  int heads;
  DeltanetGates(int rows_, int heads_) : rows(rows_), heads(heads_) {}
  const char* op() const override { return "deltanet_gates_forward"; }
  std::string vars() const override { return fmt::format("rows {}, heads {}", rows, heads); }
  template <typename T>
  void eval(Check<T>& chk) const {
    using A = acc_t<T>;
    Backend<T>& be = chk.be;
    const double uc = chk.uc;
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
    chk.check("beta", beta.get(be), rb, bounds(rb, mb, 6, uc, uc));
    chk.check("g", g.get(be), rg, bounds(rg, mg, 7, uc, uc));
  }
};

// The first rot_dim dims rotate (rope's n = 4 with rot_dim as the period), the rest pass through exactly.
struct RopePartial : Case<RopePartial> {
  int rows;
  int head_dim;
  int rot_dim;
  RopePartial(int rows_, int head_dim_, int rot_dim_) : rows(rows_), head_dim(head_dim_), rot_dim(rot_dim_) {}
  const char* op() const override { return "rope_partial_forward"; }
  std::string vars() const override { return fmt::format("rows {}, head_dim {}, rot_dim {}", rows, head_dim, rot_dim); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const int heads = 3, D = head_dim, rot = rot_dim, half = rot / 2;
    const size_t n = size_t(rows) * heads * D;
    const double theta = 1e7;
    const auto pos = positions(rows);
    DevArray<int32_t> dpos = upload_pos(be, pos);
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
    chk.check("y", y.get(be), r, bounds(r, m, 4, uc, us));
    DevArray<T> xa(be, x.host);  // y may alias x: in place, the same bits
    be.rope_partial_forward(be.context(), xa.p(), xa.p(), dpos.p(), rows, heads, D, rot, theta);
    chk.check("y aliasing x", xa.get(be), y.get(be), exact(n));
  }
};

// y (=) x Wᵀ: an in-term dot (in + 1) on Σ|x||W|. Backward: dx (+=) dy W, an out-term dot and the accumulation
// (out + 2) on |init| + Σ|dy||W| (and the product's own rounding to T, below); dW (+=, in A) dyᵀ x, an N-term dot (N + 2) on |init| + Σ|dy||x|. A null dx or dW
// (a frozen weight) is skipped.
struct Linear : Case<Linear> {
  enum Grads { both, dx_only, dW_only };  // which gradients the backward forms (a null one is skipped: frozen)
  int N, in, out;
  Grads grads;
  Linear(int N_, int in_, int out_, Grads grads_ = both) : N(N_), in(in_), out(out_), grads(grads_) {}
  const char* op() const override { return "linear forward and backward"; }
  std::string vars() const override {
    return fmt::format("N {}, in {}, out {}{}", N, in, out,
                       grads == dx_only ? ", dW null" : grads == dW_only ? ", dx null" : "");
  }
  template <typename T>
  void eval(Check<T>& chk) const {
    using A = acc_t<T>;
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    DevArray<T> x(be, randn(size_t(N) * in, 53)), W(be, randn(size_t(out) * in, 54)), y(be, Vec(size_t(N) * out));
    DevArray<T> dy(be, randn(size_t(N) * out, 55)), dx(be, randn(size_t(N) * in, 56));
    DevArray<A> dW(be, randn(size_t(out) * in, 57));
    const bool want_dx = grads != dW_only, want_dW = grads != dx_only;
    be.linear_forward(be.context(), y.p(), x.p(), W.p(), N, in, out);
    be.linear_backward(be.context(), want_dx ? dx.p() : nullptr, want_dW ? dW.p() : nullptr, dy.p(), x.p(), W.p(), N,
                       in, out);
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
          if (want_dx) rdx[size_t(r) * in + i] += g * W.host[size_t(o) * in + i];
          mdx[size_t(r) * in + i] += std::fabs(g * W.host[size_t(o) * in + i]);
          if (want_dW) rdW[size_t(o) * in + i] += g * x.host[size_t(r) * in + i];
          mdW[size_t(o) * in + i] += std::fabs(g * x.host[size_t(r) * in + i]);
        }
      }
    chk.check("y", y.get(be), ry, bounds(ry, my, in + 1, uc, us));
    // a skipped gradient keeps its values to the bit
    // dx += dy W with C in T: cuBLASLt may round the product to T before it adds C and rounds again (an H200 did in
    // bf16: 0.104 from the exact value at 16.85, past one rounding's 0.102): one more rounding, of Σ|dy||W| at most
    Vec bdx = bounds(rdx, mdx, out + 2, uc, us);
    for (size_t i = 0; i < bdx.size(); ++i) bdx[i] += 2.0 * us * mdx[i];
    chk.check("dx", dx.get(be), rdx, want_dx ? bdx : Vec(rdx.size(), 0.0));
    chk.check("dW", dW.get(be), rdW, want_dW ? bounds(rdW, mdW, N + 2, uc, uc) : Vec(rdW.size(), 0.0));
  }
};

// out (=) softmax(q kᵀ / sqrt(D)) v per query row i (at position past + i, keys 0 .. past + i), Q head h on KV
// head h / (qh / kvh). A score s_j = scale·Σ_d q_d k_jd is off by δ_j ≤ (D + 2)·u·c_j, c_j = scale·Σ_d |q_d k_jd|;
// subtracting the row maximum adds u·|s|max to each; exp (2) moves each weight p_j relatively by the difference of
// two such errors plus 2u, and the normalisation and the keys-term sum of p_j v_j add (keys + 4)·u, all relative
// to P = Σ_j p_j |v_jd|: n·u_c·M with n = 2·(D + 2)·c_max + 2·|s|max + keys + 6 on M = P. The tensor-core
// kernels (bf16) round the weights p_j to the storage type for the P·V product: u_s·P more.
struct CachedAttention : Case<CachedAttention> {
  int rows;
  int past;
  int q_heads;
  int kv_heads;
  int head_dim;
  bool prefill;
  CachedAttention(int rows_, int past_, int q_heads_, int kv_heads_, int head_dim_, bool prefill_)
      : rows(rows_), past(past_), q_heads(q_heads_), kv_heads(kv_heads_), head_dim(head_dim_), prefill(prefill_) {}
  const char* op() const override { return prefill ? "attention_causal_forward" : "attention_cached_forward"; }
  std::string vars() const override {
    return fmt::format("rows {}, past {}, q_heads {}, kv_heads {}, head_dim {}", rows, past, q_heads, kv_heads,
                       head_dim);
  }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const int n = rows, qh = q_heads, kvh = kv_heads, D = head_dim, keys = past + n, g = qh / kvh;
    DevArray<T> q(be, randn(size_t(n) * qh * D, 60)), kk(be, randn(size_t(keys) * kvh * D, 61)),
        v(be, randn(size_t(keys) * kvh * D, 62)), out(be, Vec(size_t(n) * qh * D));
    if (prefill)  // the prefill entry point: past = 0
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
    chk.check("out", out.get(be), r, b);
  }
};

// y (=) silu(Σ_{j<K} w[c, j] · in[t + j, c]), in = [tail ; x], the sequence given in three calls (the middle one
// shorter than the tail) with the tail carried: a K-term sum (K + 1 on Σ|w x|, times |silu'| ≤ 1.1), then silu's
// exp, sum and division (5 on |y|). The tail is copied inputs: exact.
struct CausalConv1d : Case<CausalConv1d> {
  int S;
  int C;
  int K;
  CausalConv1d(int S_, int C_, int K_) : S(S_), C(C_), K(K_) {}
  const char* op() const override { return "causal_conv1d_silu_forward"; }
  std::string vars() const override { return fmt::format("S {}, C {}, K {}", S, C, K); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
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
    chk.check("y", y.get(be), r, b);
    chk.check("tail", tail.get(be), rt, Vec(rt.size(), 0.0));
  }
};

// The recurrence per value head (kernels/cpu/gated_deltanet.h), a state carried in, the sequence in two calls.
// Each step's update M ← e^g M + k uᵀ, u = β(v − Mᵀk) with unit k, e^g ≤ 1, β ≤ 1 does not expand M, so the
// per-step roundings (two dk-term sums and the update: dk + 4) add up at most linearly over the S steps: n =
// S·(dk + 4) on M = the largest |o| (resp. |state|) of the sequence. The chunked kernels (64-position chunks)
// reorder the same sums through a triangular solve whose terms are bounded the same way (its matrix is unit
// lower triangular with |β e^{γ_i−γ_j} k_i·k_j| ≤ 1); their extra sums over a chunk add 64·(dk + 4).
struct DeltaRule : Case<DeltaRule> {
  int S;
  int k_heads;
  int v_heads;
  int dk;
  int dv;
  DeltaRule(int S_, int k_heads_, int v_heads_, int dk_, int dv_)
      : S(S_), k_heads(k_heads_), v_heads(v_heads_), dk(dk_), dv(dv_) {}
  const char* op() const override { return "gated_delta_rule_forward"; }
  std::string vars() const override {
    return fmt::format("S {}, k_heads {}, v_heads {}, dk {}, dv {}", S, k_heads, v_heads, dk, dv);
  }
  template <typename T>
  void eval(Check<T>& chk) const {
    using A = acc_t<T>;
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const int kh = k_heads, vh = v_heads, grp = vh / kh;
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
    chk.check("out", out.get(be), r, bounds(r, Vec(vn, omax), nops, uc, us));
    chk.check("state", state.get(be), M, bounds(M, Vec(M.size(), smax), nops, uc, uc));
  }
};

// index (=) the first column of the row's largest value, NaNs never winning (−1 when all are NaN), value (=) it:
// comparisons only, so both exact (the bound is 0). Ties, a NaN first, an all-NaN row, an all −inf row, +inf last.
struct Argmax : Case<Argmax> {
  int rows;
  int cols;
  Argmax(int rows_, int cols_) : rows(rows_), cols(cols_) {}
  const char* op() const override { return "argmax_rows"; }
  std::string vars() const override { return fmt::format("rows {}, cols {}", rows, cols); }
  template <typename T>
  void eval(Check<T>& chk) const {
    using A = acc_t<T>;
    Backend<T>& be = chk.be;
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
    chk.check("index", index.get(be), ri, Vec(ri.size(), 0.0));
    chk.check("value", gv, rv, Vec(rv.size(), 0.0));
  }
};

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
struct DflashAttention : Case<DflashAttention> {
  kernels::DFlashAttentionShape shape;
  std::vector<int32_t> anchors;
  DflashAttention(kernels::DFlashAttentionShape shape_, std::vector<int32_t> anchors_)
      : shape(shape_), anchors(std::move(anchors_)) {}
  const char* op() const override { return "dflash_attention forward and backward"; }
  std::string vars() const override {
    return fmt::format("n_blocks {}, block {}, ctx_len {}, heads {}, kv_heads {}, head_dim {}, window {}, "
                       "anchors [{}]", shape.n_blocks, shape.block, shape.ctx_len, shape.heads, shape.kv_heads,
                       shape.head_dim, shape.window, fmt::join(anchors, ", "));
  }
  template <typename T>
  void eval(Check<T>& chk) const {
    using A = acc_t<T>;
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const kernels::DFlashAttentionShape& sh = shape;
    const int NB = sh.n_blocks * sh.block, NH = sh.heads, KVH = sh.kv_heads, D = sh.head_dim, S = sh.ctx_len;
    const int G = NH / KVH;
    const size_t qn = size_t(NB) * NH * D, cn = size_t(S) * KVH * D, bn = size_t(NB) * KVH * D;
    DevArray<T> q(be, randn(qn, 80)), kc(be, randn(cn, 81)), vc(be, randn(cn, 82)), kb(be, randn(bn, 83)),
        vb(be, randn(bn, 84)), dout(be, randn(qn, 85)), out(be, Vec(qn));
    DevArray<A> lse(be, Vec(size_t(NB) * NH));
    DevArray<int32_t> danchors(be, Vec(anchors.begin(), anchors.end()));
    DevArray<T> dq(be, randn(qn, 86)), dkc(be, randn(cn, 87)), dvc(be, randn(cn, 88)), dkb(be, randn(bn, 89)),
        dvb(be, randn(bn, 90));
    be.dflash_attention_forward(be.context(), out.p(), lse.p(), q.p(), kc.p(), vc.p(), kb.p(), vb.p(), danchors.p(), sh);
    be.dflash_attention_backward(be.context(), dq.p(), dkc.p(), dvc.p(), dkb.p(), dvb.p(), dout.p(), out.p(), lse.p(),
                                 q.p(), kc.p(), vc.p(), kb.p(), vb.p(), danchors.p(), sh);
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
          kernels::dflash_ctx_range(sh, anchors[size_t(b)], j, lo, hi);
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
    chk.check("out", out.get(be), ro, bo);
    chk.check("lse", lse.get(be), rl, bl);
    chk.check("dq", dq.get(be), rdq, grad_bound(rdq, mdq, adq, dq.host, keys_max));
    chk.check("dk_ctx", dkc.get(be), rdkc, grad_bound(rdkc, mdkc, adkc, dkc.host, qmax));
    chk.check("dv_ctx", dvc.get(be), rdvc, grad_bound(rdvc, mdvc, advc, dvc.host, qmax));
    chk.check("dk_blk", dkb.get(be), rdkb, grad_bound(rdkb, mdkb, adkb, dkb.host, qmax));
    chk.check("dv_blk", dvb.get(be), rdvb, grad_bound(rdvb, mdvb, advb, dvb.host, qmax));
  }
};

// ---- copies and row moves: exact (bound 0) ----
// Row ids for `rows` rows of a table of `vocab`: both ends of the table, a repeat, the rest spread out; distinct
// (a permutation's first rows) when `distinct`.
inline std::vector<int32_t> row_ids(int rows, int vocab, bool distinct) {
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) ids[size_t(r)] = int32_t(distinct ? (int64_t(r) * 7 + 3) % vocab : (r * 13) % vocab);
  if (!distinct && rows > 2) ids[0] = vocab - 1, ids[2] = ids[1];
  return ids;
}

// out[r, :] (=) table[ids[r], :] (embedding_forward) or in[ids[r], :] (gather_rows): copies.
struct GatherRows : Case<GatherRows> {
  int rows, dim, vocab;
  bool embedding;  // embedding_forward (ids checked against vocab by the caller) or gather_rows
  GatherRows(int rows_, int dim_, int vocab_, bool embedding_)
      : rows(rows_), dim(dim_), vocab(vocab_), embedding(embedding_) {}
  const char* op() const override { return embedding ? "embedding_forward" : "gather_rows"; }
  std::string vars() const override { return fmt::format("rows {}, dim {}, table rows {}", rows, dim, vocab); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const std::vector<int32_t> ids = row_ids(rows, vocab, false);
    DevArray<T> table(be, randn(size_t(vocab) * dim, 91)), out(be, Vec(size_t(rows) * dim, -1.0));
    DevArray<int32_t> dids(be, Vec(ids.begin(), ids.end()));
    if (embedding)
      be.embedding_forward(be.context(), out.p(), table.p(), dids.p(), rows, dim, vocab);
    else
      be.gather_rows(be.context(), out.p(), table.p(), dids.p(), rows, dim);
    Vec ref(out.host.size());
    for (int r = 0; r < rows; ++r)
      for (int d = 0; d < dim; ++d) ref[size_t(r) * dim + d] = table.host[size_t(ids[size_t(r)]) * dim + d];
    chk.check("out", out.get(be), ref, exact(ref.size()));
  }
};

// out[ids[i], :] (=) in[i, :] (scatter_rows) or (+=) weight[i] · in[i, :] (scatter_add_rows: the product and the sum
// in A, one rounding to T: 2 operations on |out| + |w in|), ids distinct; the rows no id names keep their bits.
struct ScatterRows : Case<ScatterRows> {
  int rows, dim, out_rows;
  bool add;  // scatter_add_rows (the MoE's weighted add back) or scatter_rows
  ScatterRows(int rows_, int dim_, int out_rows_, bool add_) : rows(rows_), dim(dim_), out_rows(out_rows_), add(add_) {}
  const char* op() const override { return add ? "scatter_add_rows" : "scatter_rows"; }
  std::string vars() const override { return fmt::format("rows {}, dim {}, into {} rows", rows, dim, out_rows); }
  template <typename T>
  void eval(Check<T>& chk) const {
    using A = acc_t<T>;
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    const std::vector<int32_t> ids = row_ids(rows, out_rows, true);
    Vec w0 = randn(size_t(rows), 92, 1.5);
    if (rows > 3) w0[3] = 0.0;
    DevArray<T> in(be, randn(size_t(rows) * dim, 93)), out(be, randn(size_t(out_rows) * dim, 94));
    DevArray<A> weight(be, w0);
    DevArray<int32_t> dids(be, Vec(ids.begin(), ids.end()));
    if (add)
      be.scatter_add_rows(be.context(), out.p(), in.p(), dids.p(), weight.p(), rows, dim);
    else
      be.scatter_rows(be.context(), out.p(), in.p(), dids.p(), rows, dim);
    Vec ref = out.host, b = exact(ref.size());
    for (int i = 0; i < rows; ++i)
      for (int d = 0; d < dim; ++d) {
        const size_t o = size_t(ids[size_t(i)]) * dim + d, src = size_t(i) * dim + d;
        if (!add) {
          ref[o] = in.host[src];
          continue;
        }
        const double term = weight.host[size_t(i)] * in.host[src];
        b[o] = 2 * (2 * uc * (std::fabs(ref[o]) + std::fabs(term)) + us * std::fabs(ref[o] + term));
        ref[o] += term;
      }
    chk.check("out", out.get(be), ref, b);
  }
};

// x[i, :] (*=) weight[i] in A, one rounding: 1 operation on |y| (the shared-expert gate).
struct ScaleRows : Case<ScaleRows> {
  int rows, dim;
  ScaleRows(int rows_, int dim_) : rows(rows_), dim(dim_) {}
  const char* op() const override { return "scale_rows"; }
  std::string vars() const override { return fmt::format("rows {}, dim {}", rows, dim); }
  template <typename T>
  void eval(Check<T>& chk) const {
    using A = acc_t<T>;
    Backend<T>& be = chk.be;
    const double uc = chk.uc, us = chk.us;
    DevArray<T> x(be, randn(size_t(rows) * dim, 95));
    DevArray<A> weight(be, randn(size_t(rows), 96, 2.0));
    be.scale_rows(be.context(), x.p(), weight.p(), rows, dim);
    Vec ref(x.host.size()), mag(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = x.host[i] * weight.host[i / size_t(dim)], mag[i] = std::fabs(ref[i]);
    chk.check("x", x.get(be), ref, bounds(ref, mag, 1, uc, us));
  }
};

// dst[r, 0:cols] (=) src[r, 0:cols] with row strides (copy_strided: fused projections split per head), or the same
// widened to fp32 (convert_to_float_strided: a tap into its columns of the taps): copies, exact; the columns of dst
// outside [0, cols) keep their bits.
struct CopyStrided : Case<CopyStrided> {
  int rows, cols, ld_dst, ld_src, src_offset;
  bool to_float;
  CopyStrided(int rows_, int cols_, int ld_dst_, int ld_src_, int src_offset_, bool to_float_)
      : rows(rows_), cols(cols_), ld_dst(ld_dst_), ld_src(ld_src_), src_offset(src_offset_), to_float(to_float_) {}
  const char* op() const override { return to_float ? "convert_to_float_strided" : "copy_strided"; }
  std::string vars() const override {
    return fmt::format("rows {}, cols {}, ld_dst {}, ld_src {}, from column {}", rows, cols, ld_dst, ld_src,
                       src_offset);
  }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    DevArray<T> src(be, randn(size_t(rows) * ld_src, 97));
    auto expected = [&](const Vec& initial) {
      Vec ref = initial;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          const double v = src.host[size_t(r) * ld_src + src_offset + c];
          ref[size_t(r) * ld_dst + c] = to_float ? double(float(v)) : v;  // fp32 of T's value (double: rounded)
        }
      return ref;
    };
    if (to_float) {
      DevArray<float> dst(be, randn(size_t(rows) * ld_dst, 98));
      be.convert_to_float_strided(be.context(), dst.p(), ld_dst, src.p() + src_offset, ld_src, rows, cols);
      chk.check("dst", dst.get(be), expected(dst.host), exact(dst.host.size()));
    } else {
      DevArray<T> dst(be, randn(size_t(rows) * ld_dst, 98));
      be.copy_strided(be.context(), dst.p(), ld_dst, src.p() + src_offset, ld_src, rows, cols);
      chk.check("dst", dst.get(be), expected(dst.host), exact(dst.host.size()));
    }
  }
};

// dst[n] (=) src[n] rounded to T (convert_from_float: bf16 to nearest even, float a copy, double exact) or widened to
// fp32 (convert_to_float: exact for bf16 and float): the reference is the host conversion, to the bit.
struct Convert : Case<Convert> {
  int elements;
  bool from_float;
  Convert(int elements_, bool from_float_) : elements(elements_), from_float(from_float_) {}
  const char* op() const override { return from_float ? "convert_from_float" : "convert_to_float"; }
  std::string vars() const override { return fmt::format("n {}", elements); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const size_t n = size_t(elements);
    Vec x = randn(n, 99, 3.0);
    if (n > 2) x[1] = 0.0, x[2] = -1.0 + 1.0 / 512;  // zero, and halfway between two bf16 values: ties to even
    if (from_float) {
      DevArray<float> src(be, x);
      DevArray<T> dst(be, Vec(n, -7.0));
      be.convert_from_float(be.context(), dst.p(), src.p(), n);
      Vec ref(n);
      for (size_t i = 0; i < n; ++i) ref[i] = widen(store<T>(src.host[i]));
      chk.check("dst", dst.get(be), ref, exact(n));
    } else {
      DevArray<T> src(be, x);
      DevArray<float> dst(be, Vec(n, -7.0));
      be.convert_to_float(be.context(), dst.p(), src.p(), n);
      Vec ref(n);
      for (size_t i = 0; i < n; ++i) ref[i] = double(float(src.host[i]));  // T's value as fp32 (double: rounded)
      chk.check("dst", dst.get(be), ref, exact(n));
    }
  }
};

// ---- the optimizer's reductions on fp32 master gradients ----
// Σ x² accumulated in double in a fixed order: n + 1 double operations on Σ x² (u = 2^-53 whatever T is), and the
// same bits run to run. Then x (=) x · s in fp32: s rounded and the product, 2 on |y|.
struct SumSquaresScale : Case<SumSquaresScale> {
  int elements;
  explicit SumSquaresScale(int elements_) : elements(elements_) {}
  const char* op() const override { return "sum_squares and scale_master"; }
  std::string vars() const override { return fmt::format("n {}", elements); }
  template <typename T>
  void eval(Check<T>& chk) const {
    Backend<T>& be = chk.be;
    const size_t n = size_t(elements);
    const double u32 = 0x1.0p-24, u64 = 0x1.0p-53;
    DevArray<float> g(be, randn(n, 100));
    const double s1 = be.sum_squares(be.context(), g.p(), n), s2 = be.sum_squares(be.context(), g.p(), n);
    double ref = 0;
    for (double v : g.host) ref += v * v;
    chk.check("sum_squares", {s1}, {ref}, {2 * (double(n) + 1) * u64 * ref});
    chk.check("sum_squares run to run", {s2}, {s1}, exact(1));
    const double sc = 0.125 + 1.0 / 3;
    be.scale_master(be.context(), g.p(), sc, n);
    Vec r(n), m(n);
    for (size_t i = 0; i < n; ++i) r[i] = g.host[i] * sc, m[i] = std::fabs(r[i]);
    chk.check("scale_master", g.get(be), r, bounds(r, m, 2, u32, u32));
  }
};

// ---- the table: one line per case ----
// Partial tiles and odd sizes: 1, primes, one past a power of two (the CUDA kernels' 256-thread blocks, 16-byte
// packs of 4 / 8 elements, 32-key tiles, 64-row dw chunks).
inline std::vector<std::unique_ptr<OpCase>> op_cases() {
  std::vector<std::unique_ptr<OpCase>> c;
  const auto add = [&](OpCase* k) { c.emplace_back(k); };
  for (int n : {1, 7, 257, 4099, 70001}) add(new Residual(n));
  for (int n : {1, 13, 1031, 70001}) add(new Swiglu(n));
  // dims on both sides of the CUDA warp-per-row kernels' limit (512) and the block-per-row ones above it; 4100 rows:
  // more than 64 dw chunks
  for (auto [rows, dim] : {std::pair{1, 1}, std::pair{7, 33}, std::pair{130, 96}, std::pair{3, 1027}, std::pair{9, 512},
                           std::pair{5, 513}, std::pair{300, 1000}, std::pair{4100, 64}})
    add(new Rmsnorm(rows, dim));
  for (auto [rows, heads, hd] : {std::array{1, 1, 2}, std::array{5, 3, 8}, std::array{9, 2, 64}, std::array{3, 4, 128},
                                 std::array{40, 3, 128}})
    add(new Rope(rows, heads, hd));
  for (int hd : {1, 5, 9}) add(new Rope(4, 2, hd));  // an odd head_dim's last dim passes through
  // CUDA: 1 to 4 rotate-half pairs a lane, a quarter warp (16), 17 pairs (34), warps of 8 items that cross rows,
  // 4100 x 8 items (a warp's dw partial row takes 9); odd head dims: the CPU's (the CUDA backend does not take them)
  for (auto [rows, heads, hd] : {std::array{1, 1, 2}, std::array{5, 3, 8}, std::array{7, 2, 64}, std::array{3, 2, 256},
                                 std::array{2, 3, 30}, std::array{5, 3, 16}, std::array{7, 1, 34}, std::array{9, 12, 64},
                                 std::array{6, 3, 128}, std::array{4100, 8, 16}, std::array{3, 2, 5}, std::array{3, 2, 9}})
    add(new HeadNormRope(rows, heads, hd));
  for (int V : {2, 301, 4099})
    for (double tau : {1.0, 2.0})
      for (bool with_u : {false, true}) {
        add(new VocabLossRows(6, V, tau, with_u));
        if (with_u && tau == 1.0) add(new VocabLossRows(6, V, tau, with_u, /*overlap=*/true));  // TV, LK, NLA
      }
  add(new VocabLossRows(6, 32003, 2.0, true));  // a vocabulary of the size the row passes stream in chunks
  for (int n : {1, 5, 1025, 3000017}) add(new AdamW(n));
  for (int n : {1, 1000, 3000017}) add(new SumSquaresScale(n));
  for (auto [M, N, K] : {std::array{1, 1, 1}, std::array{7, 5, 3}, std::array{33, 17, 65}, std::array{64, 48, 129}})
    for (int t = 0; t < 4; ++t) add(new Gemm(M, N, K, t & 1, t & 2, 0.75, t == 3 ? 0.5 : 0.0, false));
  // padded rows (strides honoured, padding untouched), α 1 β 0 and α 0.5 β 1.5, and K = 0 (C = β C)
  for (auto [M, N, K] : {std::array{17, 33, 65}, std::array{128, 96, 256}, std::array{5, 300, 7}, std::array{64, 64, 0}})
    for (int t = 0; t < 4; ++t)
      for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{0.5, 1.5}})
        add(new Gemm(M, N, K, t & 1, t & 2, alpha, beta, true));
  for (int n : {1, 9, 1029, 70001}) add(new AccumulateScale(n));
  for (int n : {1, 9, 1029}) add(new SigmoidGate(n));
  for (auto [rows, dim] : {std::pair{1, 1}, std::pair{5, 33}, std::pair{3, 257}, std::pair{300, 128}, std::pair{7, 1000}}) {
    add(new L2norm(rows, dim));
    add(new GatedRmsnorm(rows, dim));
  }
  for (auto [rows, heads] : {std::pair{1, 1}, std::pair{7, 6}, std::pair{33, 32}}) add(new DeltanetGates(rows, heads));
  // Qwen3.5's quarter of head_dim 256, and the whole head
  for (auto [rows, hd, rot] : {std::array{3, 8, 8}, std::array{5, 64, 16}, std::array{4, 10, 6}, std::array{2, 256, 64},
                               std::array{40, 256, 64}, std::array{40, 256, 256}})
    add(new RopePartial(rows, hd, rot));
  for (auto [N, in, out] : {std::array{1, 1, 1}, std::array{7, 33, 5}, std::array{65, 48, 17}, std::array{70, 96, 40}})
    add(new Linear(N, in, out));
  for (Linear::Grads g : {Linear::dx_only, Linear::dW_only}) add(new Linear(37, 48, 20, g));  // a frozen weight
  // the embedding and the MoE's row moves: repeated ids and both ends of the table; scatters into more rows
  for (bool embedding : {true, false}) {
    add(new GatherRows(1, 1, 1, embedding));
    add(new GatherRows(9, 300, 50, embedding));
  }
  for (bool weighted : {false, true}) {
    add(new ScatterRows(1, 1, 1, weighted));
    add(new ScatterRows(9, 300, 11, weighted));
  }
  for (auto [rows, dim] : {std::pair{1, 1}, std::pair{9, 300}}) add(new ScaleRows(rows, dim));
  // fused projections split per head (Qwen3.5's query | gate rows; a q | k | v channel split), and one tap written
  // into its columns of the taps
  add(new CopyStrided(37, 256, 256, 512, 0, false));
  add(new CopyStrided(37, 256, 256, 512, 256, false));
  add(new CopyStrided(9, 96, 96, 192, 96, false));
  add(new CopyStrided(20, 30, 40, 30, 0, true));
  add(new CopyStrided(3, 7, 9, 8, 1, true));
  for (int n : {1, 7, 1003}) {
    add(new Convert(n, /*from_float=*/true));
    add(new Convert(n, /*from_float=*/false));
  }
  // the target's attention: prefill (past 0), a cached chunk, decode steps (n 1: the split-K path on CUDA), GQA
  // groups 1 to 6, head dims the tensor-core kernels take (64/128/256) and ones they do not (4, 33)
  for (auto [n, past, qh, kvh, D] :
       {std::array{100, 0, 8, 2, 128}, std::array{1, 300, 6, 1, 256}, std::array{17, 70, 3, 3, 33},
        std::array{1, 0, 2, 1, 4}, std::array{5, 37, 4, 2, 64}})
    add(new CachedAttention(n, past, qh, kvh, D, /*prefill=*/false));
  // the prefill entry point of the same attention (keys = the S rows themselves)
  for (auto [S, qh, kvh, D] : {std::array{1, 2, 1, 4}, std::array{100, 8, 2, 128}, std::array{65, 3, 3, 33}})
    add(new CachedAttention(S, 0, qh, kvh, D, /*prefill=*/true));
  for (auto [S, C, K] : {std::array{1, 1, 1}, std::array{9, 33, 4}, std::array{66, 300, 4}, std::array{5, 7, 2}})
    add(new CausalConv1d(S, C, K));
  // the delta rule: value heads over key heads (groups 1 to 3), dv not a multiple of 32, S across chunk sizes
  for (auto [S, kh, vh, dk, dv] : {std::array{70, 2, 6, 128, 80}, std::array{3, 1, 3, 256, 32},
                                   std::array{1, 4, 4, 16, 7}, std::array{65, 1, 1, 33, 5}})
    add(new DeltaRule(S, kh, vh, dk, dv));
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{7, 257}, std::pair{6, 49664}}) add(new Argmax(rows, cols));
  // the drafter's attention {n_blocks, block, ctx_len, heads, kv_heads, head_dim, window} + anchors: full
  // (bidirectional block) and sliding (causal block) layers, GQA 1 to 6, anchors at 0 and at S and unsorted,
  // ragged head dims (CUDA cores) and 64/128/256 (bf16: the tensor-core kernels), partial key tiles and warps
  using Shape = kernels::DFlashAttentionShape;
  for (auto& [s, anchors] : std::vector<std::pair<Shape, std::vector<int32_t>>>{
           {{4, 3, 9, 4, 2, 4, 0}, {0, 4, 5, 9}}, {{4, 3, 9, 4, 2, 4, 4}, {0, 4, 5, 9}}, {{3, 4, 8, 2, 1, 5, 1}, {2, 7, 1}},
           {{3, 16, 130, 8, 2, 128, 0}, {0, 129, 130}}, {{3, 16, 130, 8, 2, 128, 40}, {1, 70, 130}},
           {{3, 7, 77, 6, 3, 33, 0}, {76, 13, 40}}, {{3, 16, 130, 2, 2, 64, 0}, {130, 64, 65}},
           {{3, 8, 100, 12, 2, 64, 20}, {0, 50, 100}}, {{3, 7, 77, 8, 2, 64, 16}, {76, 13, 40}},
           {{2, 32, 100, 4, 1, 256, 0}, {40, 100}}})
    add(new DflashAttention(s, anchors));
  return c;
}

// Every case of the table the backend runs (Backend::supports decides), each output within its bound; prints one
// line per op with the worst measured |got − ref| / bound of its cases, and the cases the backend does not run.
template <typename T>
void run_table(Backend<T>& be) {
  std::vector<std::pair<std::string, double>> worst_by_op;
  int ran = 0, not_run = 0;
  for (const std::unique_ptr<OpCase>& k : op_cases()) {
    if (!k->supported(be)) {
      ++not_run;
      continue;
    }
    Check<T> chk{be, {}};
    k->run(chk);
    ++ran;
    double case_worst = 0;
    for (const auto& [what, w] : chk.results) {
      // one std::string: doctest prints a const char* it captures as a pointer
      const std::string where = std::string(be.name()) + " " + type_name<T>() + ": " + k->op() + " [" + k->vars() +
                                "], " + what;
      INFO(where << ": element " << w.at << " got " << w.got << " ref " << w.ref << " bound " << w.bound);
      CHECK_FALSE(w.nan);
      CHECK(w.ratio <= 1.0);
      case_worst = std::max(case_worst, w.ratio);
    }
    auto it = std::find_if(worst_by_op.begin(), worst_by_op.end(), [&](const auto& p) { return p.first == k->op(); });
    if (it == worst_by_op.end())
      worst_by_op.push_back({k->op(), case_worst});
    else
      it->second = std::max(it->second, case_worst);
  }
  CHECK(ran > 0);
  for (const auto& [op, w] : worst_by_op)
    std::printf("backend ops %s %s: %-36s worst |got - ref| / bound %.3g\n", be.name(), type_name<T>(), op.c_str(), w);
  std::printf("backend ops %s %s: %d cases run, %d the backend does not take\n", be.name(), type_name<T>(), ran,
              not_run);
}

}  // namespace dflash::test::ops
