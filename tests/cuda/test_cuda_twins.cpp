// The CUDA kernels where the op table cannot reach them (run only where a GPU is; main.cpp skips otherwise).
// Test-case names start with "cuda twin <family>:" (tests/cuda/CMakeLists.txt filters on them). Every op that is a
// plain function of its inputs is a case of the op table instead (tests/unit/backend_ops.h, family `ops`: each op
// against a double reference with a derived bound, on the CPU in float and double and on CUDA in float and bf16,
// with its aliasing, run-to-run, null-gradient and padded-stride variants). What stays here is what a case of the
// table cannot express, because it is not a property of an op's result on the backend:
//   * path selection: a GEMM layout cuBLASLt has no algorithm for (the fallback kernel, forced on the emulated GPU;
//     cuda twin gemm), the tensor-core kernels' shape and alignment policy and the split-K policy (attention_tc);
//   * kernels run directly, below the backend: the bf16 tensor-core DFlash and causal attention against a double
//     reference and against the CUDA-core kernels on the same inputs, split-K against one split (attention_tc);
//   * pointer alignment: 16-byte packs against the scalar loops on misaligned pointers (elementwise, vocab_loss).
// The whole-model twins (the target forward, the drafter step, the chunked delta rule's streams and scratch) are
// test_cuda_target_model.cpp, test_cuda_drafter_step.cpp and test_cuda_delta_chunked.cpp.
//
// Tolerances (u = 2^-24, fp32 unit roundoff; every comparison is |gpu − cpu| ≤ bound):
//   * A sum of n products computed in any order has error ≤ n·u·Σ|terms| on each side (Higham, recursive
//     summation; tree orders do better), so two fp32 results differ by at most 2·n·u·Σ|terms|. GEMMs use that
//     bound per element from the exact Σ|a||b|; row reductions (RMSNorm, attention) use n = the reduction length.
//   * Elementwise transcendental kernels: device expf/sqrtf are within 2 ulp, glibc's within 1: a few ulp.
//   * bf16 (8 significant bits): each rounding of a value to bf16 adds a relative 2^-8 (half an ulp at 2^-7);
//     inputs are rounded to bf16 first and the CPU reference runs in fp32 on the rounded values, so only the
//     kernel's own roundings count: depth d roundings → d·2^-8 relative, plus the fp32 accumulation bound above.
#include <doctest/doctest.h>

#if DFLASH_WITH_CUDA
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/launch.h"
#include "lib/core/named_enum.h"
#include "lib/core/rng.h"
#include "lib/model/vocab_loss.h"

using namespace dflash;
using namespace dflash::kernels;

namespace {

constexpr double kU = 0x1.0p-24;  // fp32 unit roundoff
constexpr double kB = 0x1.0p-8;   // bf16 relative rounding

std::vector<float> randn(size_t n, uint64_t seed, double sd = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(sd * rng.normal());
  return v;
}

// One CUDA context and the two backends under test, shared by all test cases of the process.
struct Gpu {
  cuda::CudaContext context{0};
  std::unique_ptr<Backend<float>> f32 = make_cuda_backend<float>();
  std::unique_ptr<Backend<bf16>> b16 = make_cuda_backend<bf16>();
  ExecContext& ex() { return context.exec(); }
};
Gpu& gpu() {
  static Gpu g;
  return g;
}
template <typename T>
std::vector<T> zeros(size_t n) {
  return std::vector<T>(n);
}
Backend<float>& cpu() { return cpu_backend<float>(); }
ExecContext& hx() { return host_exec_context(); }

// Device copy of a host vector.
template <typename T>
struct Dev {
  Buffer buf;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : buf(MemoryKind::device, std::max<size_t>(1, h.size()) * sizeof(T)), n(h.size()) {
    gpu().f32->upload(gpu().ex(), buf.data(), h.data(), n * sizeof(T));
  }
  T* p() const { return buf.as<T>(); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    gpu().f32->download(gpu().ex(), h.data(), buf.data(), n * sizeof(T));
    return h;
  }
};

// |got − want| ≤ tol[i] (or one tolerance for all), reporting the worst element.
void require_within(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& tol,
                    const char* what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;  // equal infinities: their difference is NaN, and they match
    const double d = std::fabs(double(got[i]) - double(want[i]));
    const double t = tol.size() == 1 ? tol[0] : tol[i];
    if (!(d <= t)) {
      INFO(what << ": element " << i << " of " << got.size() << ": gpu " << got[i] << " cpu " << want[i]
                << " |diff| " << d << " > tolerance " << t);
      REQUIRE(d <= t);
    }
  }
}

std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16(x[i]);
  return y;
}
std::vector<float> to_f32(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = float(x[i]);
  return y;
}
// The tests hold bf16 as kernels::bf16 (what the backend takes); direct kernel launches take the same bits as
// cuda::bf16 (__nv_bfloat16).
cuda::bf16* dev(bf16* p) { return reinterpret_cast<cuda::bf16*>(p); }
template <typename T>
T* dev(T* p) {
  return p;
}

// x rounded to bf16 and back: the values both sides compute on in the bf16 tests.
std::vector<float> bf16_round(const std::vector<float>& x) { return to_f32(to_bf16(x)); }

// Per-element GEMM tolerance: 2·K·u·(|α| Σ_k |a_ik b_kj| + |β c_ij|) + a floor for K = 0 / exact zeros.
std::vector<double> gemm_tolerance(bool ta, bool tb, int M, int N, int K, double alpha, const std::vector<float>& a,
                                   int lda, const std::vector<float>& b, int ldb, double beta,
                                   const std::vector<float>& c, int ldc, double extra_rel = 0) {
  std::vector<double> tol(c.size(), 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) {
        const double av = ta ? a[size_t(k) * lda + i] : a[size_t(i) * lda + k];
        const double bv = tb ? b[size_t(j) * ldb + k] : b[size_t(k) * ldb + j];
        s += std::fabs(av * bv);
      }
      const double mag = std::fabs(alpha) * s + std::fabs(beta * c[size_t(i) * ldc + j]);
      tol[size_t(i) * ldc + j] = 2.0 * (K + 2) * kU * mag + extra_rel * mag + 1e-30;
    }
  return tol;
}

}  // namespace

// ============================== GEMM ==============================

TEST_CASE("cuda twin gemm: a layout cuBLASLt has no algorithm for runs on the fallback kernel (odd leading dims)") {
  // The DeltaNet b/a projections of a TP-5 shard have rows of 9 or 12 bf16 values. On the emulated GPU the
  // heuristic is told to refuse leading dimensions that are not a multiple of 16 bytes (a real cuBLASLt may);
  // the result must then come from gemm_fallback.cu, within the same fp32 bound as cuBLASLt's.
#if defined(DFLASH_CUDA_EMULATED)
  setenv("DFLASH_EMU_CUBLASLT_REFUSE_LD", "16", 1);
#endif
  struct Unset {
    ~Unset() { unsetenv("DFLASH_EMU_CUBLASLT_REFUSE_LD"); }
  } unset;
  const int M = 37, N = 9, K = 40;  // y [37, 9] = x [37, 40] · Wᵀ, W [9, 40]: ldc 9 (18 bytes in bf16)
  const auto x = bf16_round(randn(size_t(M) * K, 170)), w = bf16_round(randn(size_t(N) * K, 171));
  std::vector<float> want(size_t(M) * N, 0.0f);
  cpu().gemm(hx(), false, true, M, N, K, 1.0, x.data(), K, w.data(), K, 0.0, want.data(), N);
  Dev<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gy(std::vector<bf16>(want.size()));
  Dev<float> gx32(x), gw32(w), gy32(std::vector<float>(want.size())), gacc(randn(want.size(), 172));
  cuda::LtGemm lt;
  lt.run(gpu().ex(), cuda::DType::bf16, cuda::DType::bf16, false, true, M, N, K, 1.0f, gx.p(), K, gw.p(), K, 0.0f,
         gy.p(), N);
  lt.run(gpu().ex(), cuda::DType::f32, cuda::DType::f32, false, true, M, N, K, 1.0f, gx32.p(), K, gw32.p(), K, 0.0f,
         gy32.p(), N);
  // beta = 1 into fp32 (the weight-gradient form): acc + x·Wᵀ
  const auto acc0 = gacc.get();
  lt.run(gpu().ex(), cuda::DType::bf16, cuda::DType::f32, false, true, M, N, K, 1.0f, gx.p(), K, gw.p(), K, 1.0f,
         gacc.p(), N);
  std::vector<float> want_acc(want.size());
  for (size_t i = 0; i < want.size(); ++i) want_acc[i] = acc0[i] + want[i];
  const auto tol = gemm_tolerance(false, true, M, N, K, 1.0, x, K, w, K, 0.0, want, N);
  auto tol_bf16 = tol;
  for (size_t i = 0; i < tol.size(); ++i) tol_bf16[i] += kB * std::fabs(want[i]);  // one rounding of y
  require_within(to_f32(gy.get()), want, tol_bf16, "bf16 y, ldc 9");
  require_within(gy32.get(), want, tol, "fp32 y, ldc 9");
  auto tol_acc = tol;
  for (size_t i = 0; i < tol.size(); ++i) tol_acc[i] += 2 * kU * std::fabs(want_acc[i]);
  require_within(gacc.get(), want_acc, tol_acc, "fp32 acc += bf16 x·Wᵀ, ldc 9");
#if defined(DFLASH_CUDA_EMULATED)
  CHECK(lt.fallback_layouts() == 3);  // all three: each has ldc 9
#else
  MESSAGE("on this GPU cuBLASLt had no algorithm for " << lt.fallback_layouts() << " of the 3 layouts");
#endif
}

// ============================== elementwise ==============================

namespace {

// The streaming kernels on pointers `off` elements into their buffers: off = 0 takes the 16-byte packs and the
// scalar tail, off = 1 or 3 the scalar loop for all of it. Returns every output, as fp32.
template <typename T>
std::vector<std::vector<float>> streaming_outputs(Backend<T>& be, size_t n, int off) {
  auto dev = [&](const std::vector<float>& v) {
    std::vector<float> padded(v.size() + 8, 0.0f);
    std::copy(v.begin(), v.end(), padded.begin() + off);
    if constexpr (std::is_same_v<T, bf16>) return Dev<bf16>(to_bf16(padded)); else return Dev<float>(padded);
  };
  auto host = [&](const Dev<T>& d) {
    std::vector<float> all;
    if constexpr (std::is_same_v<T, bf16>) all = to_f32(d.get()); else all = d.get();
    return std::vector<float>(all.begin() + off, all.begin() + off + long(n));
  };
  const auto gate = randn(n, 41, 4.0), up = randn(n, 42), dh = randn(n, 43), acc0 = randn(n, 44);
  Dev<T> ggate = dev(gate), gup = dev(up), gdh = dev(dh), gh = dev(zeros<float>(n)), gdg = dev(acc0), gdu = dev(acc0),
         gres = dev(zeros<float>(n)), gacc = dev(acc0), gscl = dev(acc0), gconv = dev(zeros<float>(n));
  std::vector<float> padded(n + 8, -3.0f);
  std::copy(up.begin(), up.end(), padded.begin() + off);
  Dev<float> gf(padded), gwide(std::vector<float>(n + 8, 0.0f));
  ExecContext& ex = gpu().ex();
  be.swiglu_forward(ex, gh.p() + off, ggate.p() + off, gup.p() + off, n);
  be.swiglu_backward(ex, gdg.p() + off, gdu.p() + off, gdh.p() + off, ggate.p() + off, gup.p() + off, n);
  be.residual_forward(ex, gres.p() + off, ggate.p() + off, gup.p() + off, n);
  be.accumulate(ex, gacc.p() + off, gup.p() + off, n);
  be.scale(ex, gscl.p() + off, -0.37, n);
  be.convert_from_float(ex, gconv.p() + off, gf.p() + off, n);
  be.convert_to_float(ex, gwide.p() + off, gdh.p() + off, n);
  const auto wide = gwide.get();
  return {host(gh), host(gdg), host(gdu), host(gres), host(gacc), host(gscl), host(gconv),
          std::vector<float>(wide.begin() + off, wide.begin() + off + long(n))};
}

}  // namespace

TEST_CASE("cuda twin elementwise: 16-byte packs and the scalar tail give the same bits (misaligned, odd lengths)") {
  // the same per-element formula on both paths: aligned (packs + tail) and misaligned (scalar) runs agree exactly,
  // in fp32 and bf16; fp32 residual / accumulate / scale / conversions also equal the CPU's
  for (size_t n : {size_t(1), size_t(7), size_t(1001), size_t(4103)}) {
    INFO("n " << n);
    const auto f0 = streaming_outputs(*gpu().f32, n, 0), f1 = streaming_outputs(*gpu().f32, n, 1),
               f3 = streaming_outputs(*gpu().f32, n, 3);
    const auto b0 = streaming_outputs(*gpu().b16, n, 0), b1 = streaming_outputs(*gpu().b16, n, 1),
               b3 = streaming_outputs(*gpu().b16, n, 3);
    for (size_t k = 0; k < f0.size(); ++k) {
      INFO("output " << k);
      require_within(f1[k], f0[k], {0.0}, "fp32 misaligned by 1 vs aligned");
      require_within(f3[k], f0[k], {0.0}, "fp32 misaligned by 3 vs aligned");
      require_within(b1[k], b0[k], {0.0}, "bf16 misaligned by 1 vs aligned");
      require_within(b3[k], b0[k], {0.0}, "bf16 misaligned by 3 vs aligned");
    }
    const auto gate = randn(n, 41, 4.0), up = randn(n, 42), dh = randn(n, 43), acc0 = randn(n, 44);
    std::vector<float> res(n), acc = acc0, scl = acc0;
    cpu().residual_forward(hx(), res.data(), gate.data(), up.data(), n);
    cpu().accumulate(hx(), acc.data(), up.data(), n);
    cpu().scale(hx(), scl.data(), -0.37, n);
    require_within(f0[3], res, {0.0}, "residual");
    require_within(f0[4], acc, {0.0}, "accumulate");
    require_within(f0[5], scl, {0.0}, "scale");
    require_within(f0[6], up, {0.0}, "convert_from_float (fp32 copy)");
    require_within(f0[7], dh, {0.0}, "convert_to_float (fp32 copy)");
    require_within(b0[6], bf16_round(up), {0.0}, "convert_from_float (bf16, nearest even)");
    require_within(b0[7], bf16_round(dh), {0.0}, "convert_to_float (bf16 widened)");
  }
}


// ============================== vocab loss ==============================

namespace {

// Per-element tolerance of the row gradient: each element is a sum of ≤ 4 terms coefficient × exp (float): each
// term within 8 ulp (2 ulp exp with a few ulp in its argument, 1 per product), so 16·u·Σ|terms| + the output
// rounding (extra_rel: 2^-8 for bf16); the label and argmax (formed in double, rounded once): 4·u + extra_rel.
// With TV / LK / NLA (τ = 1) the TV term a·p_v·(below − [p_v < q_v]) joins Σ|terms| (a = c (λ_tv + λ_lk (1 − λ) +
// λ_nla/α), LK's λ joins KL's coefficient); both sides compute p_v and q_v by the same float expressions from the same
// statistics, but where p_v and q_v are within a few ulp of each other an FMA on the GPU may classify v apart:
// there the tolerance adds |a| p_v.
std::vector<double> grad_tolerance(const std::vector<float>& z, const float* u, int n, int V,
                                   const std::vector<int32_t>& labels, const std::vector<float>& w,
                                   const std::vector<VocabLossRow>& rows, double grad_scale,
                                   const VocabLossCoeffs& k, double extra_rel) {
  std::vector<double> tol(size_t(n) * V, 1e-30);
  for (int i = 0; i < n; ++i) {
    const double c = grad_scale * w[i];
    if (c == 0) continue;  // exact zeros
    const VocabLossRow& s = rows[i];
    const float* zr = &z[size_t(i) * V];
    const float* ur = u ? u + size_t(i) * V : nullptr;
    const double p_m = std::exp(-s.z_logsum);
    const bool ov = ur && (k.tv != 0 || k.lk != 0 || k.nla != 0);
    const double lambda = ov ? std::exp(-k.lk_eta * s.overlap) : 0;
    const double kl_coef = k.kl * k.tau + (ov ? k.lk * lambda : 0);
    const double a_tv = ov ? k.tv + k.lk * (1 - lambda) + (s.overlap > kNlaFloor ? k.nla / s.overlap : 0) : 0;
    for (int v = 0; v < V; ++v) {
      const double p = std::exp((zr[v] - s.z_max) - s.z_logsum);
      double mag = std::fabs(c * k.ce) * p, tie = 0;
      if (ur && kl_coef != 0) {
        mag += std::fabs(c * kl_coef) * std::exp((zr[v] - s.z_max) / k.tau - s.zt_logsum);
        mag += std::fabs(c * kl_coef) * std::exp((ur[v] - s.u_max) / k.tau - s.ut_logsum);
      }
      if (s.cap_active && k.cap != 0) mag += std::fabs(c * k.cap) * p_m * std::exp((zr[v] - s.excl_max) - s.excl_logsum);
      if (ov) {
        const double q = std::exp((ur[v] - s.u_max) - s.ut_logsum);
        mag += std::fabs(c * a_tv) * p * (s.overlap_below + 1);
        if (std::fabs(p - q) <= 64 * kU * std::max(p, q)) tie = std::fabs(c * a_tv) * p;
      }
      tol[size_t(i) * V + v] = 16 * kU * mag * (1 + extra_rel) + extra_rel * mag + tie + 1e-30;
    }
    for (int v : {labels[i], s.argmax}) {
      // |at_y|, |at_m| ≤ c·(ce + 2·kl·τ + cap + 2 a_tv) ≤ 4c (+ the TV coefficient) here
      const double exact_ish = std::fabs(c) * (4 + 2 * a_tv + 2 * std::fabs(kl_coef));
      tol[size_t(i) * V + v] = (4 * kU + extra_rel) * exact_ish;
    }
  }
  return tol;
}

// off > 0: the logits start off floats into their buffers (every row misaligned for V a multiple of 4: the scalar
// loops; off = 0 with such V: the 16-byte packs).
void vocab_twin(int n, int V, bool with_u, double tau, const VocabLossCoeffs& k, int off = 0) {
  auto z = randn(size_t(n) * V, 70, 3.0), u = randn(size_t(n) * V, 71, 3.0);
  std::vector<int32_t> labels(n);
  std::vector<float> w(n);
  Rng rng(72);
  for (int i = 0; i < n; ++i) {
    labels[i] = int32_t(rng.below(V));
    w[i] = i % 5 == 3 ? 0.0f : float(0.5 + rng.uniform());  // some rows skipped
  }
  if (n > 1) z[size_t(1) * V + labels[1]] = 40.f;           // a correct row
  if (n > 2) z[size_t(2) * V + (labels[2] + 1) % V] = 90.f;  // a lone maximum: CAP's own pass
  const float* up = with_u ? u.data() : nullptr;
  std::vector<VocabLossRow> rows(n);
  std::vector<VocabLossRowValues> vals(n);
  cpu().vocab_loss_row_stats(hx(), z.data(), up, n, V, labels.data(), w.data(), k, 5, rows.data(), vals.data());
  std::vector<float> grad = z;
  cpu().vocab_loss_row_grad(hx(), grad.data(), up, n, V, labels.data(), w.data(), rows.data(), 0.25, k);

  auto shifted = [&](const std::vector<float>& v) {
    std::vector<float> p(v.size() + size_t(off), 0.0f);
    std::copy(v.begin(), v.end(), p.begin() + off);
    return p;
  };
  Dev<float> gz_buf(shifted(z)), gu_buf(shifted(u)), gw(w);
  struct {
    Dev<float>* d;
    int off;
    float* p() const { return d->p() + off; }
    std::vector<float> get() const {
      const auto all = d->get();
      return std::vector<float>(all.begin() + off, all.end());
    }
  } gz{&gz_buf, off}, gu{&gu_buf, off};
  Dev<int32_t> glab(labels);
  Dev<VocabLossRow> grows(zeros<VocabLossRow>(n));
  Dev<VocabLossRowValues> gvals(zeros<VocabLossRowValues>(n));
  auto& be = *gpu().f32;
  be.vocab_loss_row_stats(gpu().ex(), gz.p(), with_u ? gu.p() : nullptr, n, V, glab.p(), gw.p(), k, 5, grows.p(),
                          gvals.p());
  const auto rows_g = grows.get();
  const auto vals_g = gvals.get();
  // Same float exponential polynomial (≤ 2 ulp apart with FMA), double sums in another order: every statistic
  // within a few float ulp relative of its magnitude.
  auto near = [](double a, double b, double scale) { return std::fabs(a - b) <= 64 * kU * (std::fabs(b) + scale); };
  for (int i = 0; i < n; ++i) {
    INFO("row " << i << " V " << V << " u " << with_u << " tau " << tau);
    CHECK(vals_g[i].scored == vals[i].scored);
    CHECK(vals_g[i].finite == vals[i].finite);
    CHECK(vals_g[i].correct == vals[i].correct);
    CHECK(vals_g[i].topk == vals[i].topk);
    CHECK(near(vals_g[i].ce, vals[i].ce, 1));
    CHECK(near(vals_g[i].kl, vals[i].kl, 1));
    CHECK(near(vals_g[i].cap, vals[i].cap, 1));
    CHECK(near(vals_g[i].tv, vals[i].tv, 1));
    CHECK(near(vals_g[i].lk, vals[i].lk, 1));
    CHECK(near(vals_g[i].nla, vals[i].nla, 1));
    if (!vals[i].scored) continue;
    CHECK(near(rows_g[i].overlap, rows[i].overlap, 1));
    CHECK(near(rows_g[i].overlap_below, rows[i].overlap_below, 1));
    CHECK(rows_g[i].argmax == rows[i].argmax);
    CHECK(rows_g[i].z_max == rows[i].z_max);
    CHECK(near(rows_g[i].z_logsum, rows[i].z_logsum, 1));
    CHECK(near(rows_g[i].excl_logsum, rows[i].excl_logsum, 1));
    CHECK(near(rows_g[i].zt_logsum, rows[i].zt_logsum, 1));
    CHECK(near(rows_g[i].one_minus_py, rows[i].one_minus_py, 0));
  }
  // gradient from the CPU's statistics (isolates the gradient kernel)
  Dev<VocabLossRow> crows(rows);
  be.vocab_loss_row_grad(gpu().ex(), gz.p(), with_u ? gu.p() : nullptr, n, V, glab.p(), gw.p(), crows.p(), 0.25, k);
  require_within(gz.get(), grad, grad_tolerance(z, up, n, V, labels, w, rows, 0.25, k, 0), "d logits");
}

}  // namespace

TEST_CASE("cuda twin vocab_loss: the overlap pass and gradient of TV, LK-hybrid and NLA (tau 1) give the CPU's results") {
  VocabLossCoeffs k{1, 0.5, 0.2, 1};
  k.tv = 0.7, k.lk = 0.6, k.lk_eta = 2.5, k.nla = 0.3;
  vocab_twin(9, 1000, true, 1.0, k);
  vocab_twin(5, 4096, true, 1.0, k);     // packs only
  vocab_twin(5, 4096, true, 1.0, k, 1);  // scalar loops only
  VocabLossCoeffs tv_only{0, 0, 0, 1};
  tv_only.tv = 1;  // TV without KL: the TV path still reads q
  vocab_twin(6, 32003, true, 1.0, tv_only);
}

TEST_CASE("cuda twin vocab_loss: rows in 16-byte packs and misaligned rows (scalar loops) give the CPU's results") {
  vocab_twin(5, 4096, true, 2.0, {1, 0.5, 0.2, 2});      // every row aligned: packs only
  vocab_twin(5, 4096, true, 2.0, {1, 0.5, 0.2, 2}, 1);   // every row misaligned: scalar only
  vocab_twin(5, 1003, false, 1.0, {1, 0, 0.3, 1}, 2);    // rows of mixed alignment, a tail of 3
}

namespace {

// The whole chunked loss (lib/model/vocab_loss) on the CUDA backend in T against the CPU backend in float, from the
// same T-exact inputs: D-PACE factors formed on the host from each chunk's CE (chunks of whole blocks), the fused
// gradient with the chunk's w · d, recompute's backward from the context's w · d, and the overlap terms.
template <typename T>
void chunked_loss_twin(Backend<T>& be, const model::VocabLossSettings& s, double tol) {
  const int blocks = 7, B = 8, R = blocks * (B - 1), H = 24, V = 503;
  auto X = randn(size_t(R) * H, 110), Y = randn(size_t(R) * H, 111), W = randn(size_t(V) * H, 112, 3.0 / std::sqrt(24.0));
  for (size_t i = 0; i < Y.size(); ++i) Y[i] = X[i] + 0.6f * Y[i];
  if constexpr (!std::is_same_v<T, float>) X = bf16_round(X), Y = bf16_round(Y), W = bf16_round(W);
  std::vector<int32_t> labels(R), kpos(R), bid(R);
  std::vector<float> w(R);
  Rng rng(113);
  for (int r = 0; r < R; ++r) {
    labels[r] = int32_t(rng.below(V));
    kpos[r] = 1 + r % (B - 1);
    bid[r] = r / (B - 1);
    w[r] = (bid[r] == 2 || (bid[r] == 4 && kpos[r] == 3)) ? 0.0f : 1.0f;  // a masked block, a masked row inside one
  }
  model::VocabLossBatch<float> hb;
  hb.rows = R, hb.hidden = X.data(), hb.target_hidden = Y.data(), hb.labels = labels.data(), hb.weights = w.data();
  hb.block_pos = kpos.data(), hb.block_id = bid.data();
  model::VocabLoss<float> cpu_loss(s, W.data(), V, H);
  model::VocabLossContext cctx;
  std::vector<float> dX_cpu(size_t(R) * H);
  const auto want = cpu_loss.forward(hb, cctx, 0.5, dX_cpu.data());
  cpu_loss.backward(hb, cctx, 0.5, dX_cpu.data());

  auto to_t = [](const std::vector<float>& v) {
    if constexpr (std::is_same_v<T, float>) return v; else return to_bf16(v);
  };
  Dev<T> gX(to_t(X)), gY(to_t(Y)), gW(to_t(W)), gdX(std::vector<T>(size_t(R) * H));
  model::VocabLossBatch<T> db;
  db.rows = R, db.hidden = gX.p(), db.target_hidden = gY.p(), db.labels = labels.data(), db.weights = w.data();
  db.block_pos = kpos.data(), db.block_id = bid.data();
  model::VocabLoss<T> gpu_loss(s, be, gpu().ex(), gW.p(), V, H);
  model::VocabLossContext gctx;
  const auto got = gpu_loss.forward(db, gctx, 0.5, gdX.p());
  gpu_loss.backward(db, gctx, 0.5, gdX.p());
  std::vector<float> dX_gpu;
  if constexpr (std::is_same_v<T, float>) dX_gpu = gdX.get(); else dX_gpu = to_f32(gdX.get());
  const std::pair<double, double> sums[] = {{got.sums.loss, want.sums.loss}, {got.sums.ce, want.sums.ce},
                                            {got.sums.tv, want.sums.tv},     {got.sums.lk, want.sums.lk},
                                            {got.sums.nla, want.sums.nla},   {got.sums.dpace, want.sums.dpace}};
  for (const auto& [g, c] : sums) {
    INFO("gpu " << g << " cpu " << c);
    CHECK(std::fabs(g - c) <= tol * (std::fabs(c) + 1e-3));
  }
  CHECK(got.metrics.accepted_sum == want.metrics.accepted_sum);
  double err = 0, scale = 0;
  for (size_t i = 0; i < dX_cpu.size(); ++i) {
    err = std::max(err, std::fabs(double(dX_gpu[i]) - double(dX_cpu[i])));
    scale = std::max(scale, std::fabs(double(dX_cpu[i])));
  }
  INFO("dX: max |gpu − cpu| " << err << " of scale " << scale);
  CHECK(err <= tol * scale);
}

}  // namespace

TEST_CASE("cuda twin vocab_loss: the chunked loss with D-PACE and TV / LK / NLA on CUDA (fp32, bf16) equals the CPU's") {
  // each variant in one schedule (both schedules are covered across them; the CPU tests run every combination)
  using PW = model::PositionWeight;
  using Mode = model::VocabLossMode;
  const std::pair<PW, Mode> runs[] = {{PW::dpace, Mode::fused},
                                      {PW::dpace, Mode::recompute},
                                      {PW::dpace_cumulative_confidence, Mode::fused},
                                      {PW::dpace_continuation_value, Mode::recompute}};
  for (const auto& [pw, mode] : runs) {
    {
      model::VocabLossSettings s;
      s.block_size = 8;
      s.chunk_size = 10;  // whole blocks of 7 rows: chunks of 7 (the recompute backward: 10, cutting blocks)
      s.mode = mode;
      s.kl_weight = 0.5, s.cap_weight = 0.1, s.tv_weight = 0.3, s.lk_weight = 0.4, s.nla_weight = 0.2;
      s.position_weight = pw;
      s.dpace_alpha = 0.4;
      INFO(name_of(pw) << " mode " << name_of(mode));
      // fp32: the same float math, double sums in another order; bf16: the GEMM inputs are the same bf16 values,
      // the logits and d(logits) are rounded to bf16 (2^-9 each)
      chunked_loss_twin<float>(*gpu().f32, s, 1e-5);
      chunked_loss_twin<bf16>(*gpu().b16, s, 3e-2);
    }
  }
}

// ============================== the target's forward ==============================

// ============================== attention on tensor cores ==============================
// The bf16 DFlash kernels of attention_dflash_tc.cu against a double reference written from the mask's
// definition (kernels/attention_shape.h), and against the CUDA-core bf16 kernels on the same inputs.
//
// Tolerances, per element, from the kernels' roundings (bf16: 2^-9 relative per rounding; the fp32 accumulations
// of exact bf16 products are orders of magnitude below and covered by the ×2 headroom):
//   out  P is rounded to bf16 for P·V: |Δ| ≤ 2^-9 Σ p|v|; out itself is rounded: 2^-9 |out|.
//   dV   P rounded likewise: 2^-9 Σ p|dO|; the += result rounded: 2^-9 |dV|.
//   dQ, dK  dS = p (dP − delta): delta comes from the bf16 O (≤ 2^-9 p Σ|dO||O|) and dS is rounded for the
//        product (≤ 2^-9 p (|dP| + |delta|)): |ΔdS| ≤ 2^-8 w with w = p (|dP| + Σ|dO||O|), so
//        |ΔdQ| ≤ 2^-8 scale Σ_k w |k| (dK: Σ_q w |q|); the += result rounded: 2^-9 |dQ|.
// Each bound is doubled; a floor of 1e-6 covers exact zeros.
namespace {

struct AttnReference {
  std::vector<double> out, lse, dq, dkc, dvc, dkb, dvb;              // values (the += gradients from dq0 … dvb0)
  std::vector<double> m_out, m_dq, m_dkc, m_dvc, m_dkb, m_dvb;       // the magnitudes of the bounds above
};

AttnReference dflash_reference(const DFlashAttentionShape& s, const std::vector<int32_t>& anchors,
                               const std::vector<float>& q, const std::vector<float>& kc,
                               const std::vector<float>& vc, const std::vector<float>& kb,
                               const std::vector<float>& vb, const std::vector<float>& dout,
                               const std::vector<float>& dq0, const std::vector<float>& dkc0,
                               const std::vector<float>& dvc0, const std::vector<float>& dkb0,
                               const std::vector<float>& dvb0) {
  const int NB = s.n_blocks * s.block, NH = s.heads, KVH = s.kv_heads, D = s.head_dim, G = NH / KVH;
  const double scale = 1.0 / std::sqrt(double(D));
  AttnReference R;
  auto widen = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  R.out.assign(q.size(), 0.0);
  R.lse.assign(size_t(NB) * NH, 0.0);
  R.dq = widen(dq0), R.dkc = widen(dkc0), R.dvc = widen(dvc0), R.dkb = widen(dkb0), R.dvb = widen(dvb0);
  R.m_out.assign(q.size(), 0.0), R.m_dq.assign(q.size(), 0.0);
  R.m_dkc.assign(kc.size(), 0.0), R.m_dvc.assign(kc.size(), 0.0);
  R.m_dkb.assign(kb.size(), 0.0), R.m_dvb.assign(kb.size(), 0.0);
  for (int r = 0; r < NB; ++r)
    for (int h = 0; h < NH; ++h) {
      const int b = r / s.block, j = r % s.block, g = h / G;
      const size_t qo = (size_t(r) * NH + h) * D;
      struct Key {
        bool ctx;
        size_t off;
      };
      std::vector<Key> keys;
      const int a = anchors[b], hi = std::min(a, s.ctx_len);
      for (int c = 0; c < hi; ++c)
        if (s.window <= 0 || c >= a + j - (s.window - 1)) keys.push_back({true, (size_t(c) * KVH + g) * D});
      for (int i = 0; i < s.block; ++i)
        if (s.window <= 0 || i <= j) keys.push_back({false, (size_t(b * s.block + i) * KVH + g) * D});
      std::vector<double> sc(keys.size());
      double mx = -INFINITY;
      for (size_t t = 0; t < keys.size(); ++t) {
        const float* k = (keys[t].ctx ? kc.data() : kb.data()) + keys[t].off;
        double acc = 0;
        for (int d = 0; d < D; ++d) acc += double(q[qo + d]) * k[d];
        sc[t] = acc * scale;
        mx = std::max(mx, sc[t]);
      }
      double l = 0;
      for (double x : sc) l += std::exp(x - mx);
      const double lse = mx + std::log(l);
      R.lse[size_t(r) * NH + h] = lse;
      std::vector<double> p(keys.size());
      for (size_t t = 0; t < keys.size(); ++t) {
        p[t] = std::exp(sc[t] - lse);
        const float* v = (keys[t].ctx ? vc.data() : vb.data()) + keys[t].off;
        for (int d = 0; d < D; ++d) {
          R.out[qo + d] += p[t] * v[d];
          R.m_out[qo + d] += p[t] * std::fabs(v[d]);
        }
      }
      double delta = 0, delta_mag = 0;
      for (int d = 0; d < D; ++d) {
        delta += double(dout[qo + d]) * R.out[qo + d];
        delta_mag += std::fabs(double(dout[qo + d]) * R.out[qo + d]);
      }
      for (size_t t = 0; t < keys.size(); ++t) {
        const bool ctx = keys[t].ctx;
        const size_t ko = keys[t].off;
        const float* k = (ctx ? kc.data() : kb.data()) + ko;
        const float* v = (ctx ? vc.data() : vb.data()) + ko;
        double dp = 0;
        for (int d = 0; d < D; ++d) dp += double(dout[qo + d]) * v[d];
        const double ds = p[t] * (dp - delta), w = p[t] * (std::fabs(dp) + delta_mag);
        auto& dk = ctx ? R.dkc : R.dkb;
        auto& dv = ctx ? R.dvc : R.dvb;
        auto& mdk = ctx ? R.m_dkc : R.m_dkb;
        auto& mdv = ctx ? R.m_dvc : R.m_dvb;
        for (int d = 0; d < D; ++d) {
          R.dq[qo + d] += scale * ds * k[d];
          R.m_dq[qo + d] += scale * w * std::fabs(k[d]);
          dk[ko + d] += scale * ds * q[qo + d];
          mdk[ko + d] += scale * w * std::fabs(q[qo + d]);
          dv[ko + d] += p[t] * dout[qo + d];
          mdv[ko + d] += p[t] * std::fabs(dout[qo + d]);
        }
      }
    }
  return R;
}

// |got − want| ≤ 2·(c_mag·mag + 2^-9·|want|) + 1e-6 elementwise (the bounds of the comment above).
void require_bound(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& mag,
                   double c_mag, const char* what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    const double t = 2.0 * (c_mag * mag[i] + 0x1.0p-9 * std::fabs(want[i])) + 1e-6;
    worst = std::max(worst, d / t);
    if (!(d <= t)) {
      INFO(what << ": element " << i << " of " << got.size() << ": gpu " << got[i] << " reference " << want[i]
                << " |diff| " << d << " > bound " << t);
      REQUIRE(d <= t);
    }
  }
  MESSAGE(std::string(what) << ": worst |diff| / bound " << worst);
}

struct TcRun {  // one forward + backward of the bf16 DFlash attention on the device
  std::vector<float> out, lse, dq, dkc, dvc, dkb, dvb;
};

template <typename Forward, typename Backward>
TcRun run_bf16_attention(const DFlashAttentionShape& s, const std::vector<int32_t>& anchors,
                         const std::vector<std::vector<float>>& in, const std::vector<float>& out_for_backward,
                         const std::vector<float>& lse_for_backward, Forward fwd, Backward bwd) {
  // in: q, kc, vc, kb, vb, dout, dq0, dkc0, dvc0, dkb0, dvb0 (already bf16-exact)
  std::vector<Dev<bf16>> d;
  for (const auto& x : in) d.emplace_back(to_bf16(x));
  Dev<bf16> gout(std::vector<bf16>(in[0].size())), gout_b(to_bf16(out_for_backward));
  Dev<float> glse(std::vector<float>(size_t(s.n_blocks) * s.block * s.heads)), glse_b(lse_for_backward),
      gdelta(std::vector<float>(std::max<size_t>(1, lse_for_backward.size())));
  Dev<int32_t> ganch(anchors);
  const cudaStream_t st = static_cast<cudaStream_t>(gpu().ex().stream);
  auto p = [&](int i) { return dev(d[size_t(i)].p()); };
  fwd(st, dev(gout.p()), glse.p(), p(0), p(1), p(2), p(3), p(4), ganch.p(), s);
  bwd(st, p(6), p(7), p(8), p(9), p(10), p(5), dev(gout_b.p()), glse_b.p(), p(0), p(1), p(2), p(3), p(4), ganch.p(), s,
      gdelta.p());
  return {to_f32(gout.get()), glse.get(),        to_f32(d[6].get()), to_f32(d[7].get()),
          to_f32(d[8].get()), to_f32(d[9].get()), to_f32(d[10].get())};
}

// The DFlash attention through the backend (CUDA cores in fp32, tensor cores in bf16) is a case of the op table
// (tests/unit/backend_ops.h); here the two bf16 kernels are run directly and against each other.
struct AttnCase {
  DFlashAttentionShape s;
  std::vector<int32_t> anchors;
};

void dflash_tc_twin(const AttnCase& c) {
  const auto& s = c.s;
  const size_t NB = size_t(s.n_blocks) * s.block, NH = s.heads, KVH = s.kv_heads, D = s.head_dim;
  INFO("NB " << NB << " S " << s.ctx_len << " NH " << NH << " KVH " << KVH << " D " << D << " window " << s.window);
  REQUIRE(cuda::dflash_attention_tc_supports(s, {}));
  const size_t nq = NB * NH * D, nc = size_t(s.ctx_len) * KVH * D, nb = NB * KVH * D;
  const std::vector<std::vector<float>> in = {
      bf16_round(randn(nq, 140)),      bf16_round(randn(nc, 141)),      bf16_round(randn(nc, 142)),
      bf16_round(randn(nb, 143)),      bf16_round(randn(nb, 144)),      bf16_round(randn(nq, 145)),
      bf16_round(randn(nq, 146, 0.1)), bf16_round(randn(nc, 147, 0.1)), bf16_round(randn(nc, 148, 0.1)),
      bf16_round(randn(nb, 149, 0.1)), bf16_round(randn(nb, 150, 0.1))};
  const AttnReference R = dflash_reference(s, c.anchors, in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7],
                                           in[8], in[9], in[10]);
  // the backward of both kernels gets the reference's O (as bf16) and lse: its check is independent of the forward
  std::vector<float> out_b(R.out.size()), lse_b(R.lse.size());
  for (size_t i = 0; i < out_b.size(); ++i) out_b[i] = float(R.out[i]);
  for (size_t i = 0; i < lse_b.size(); ++i) lse_b[i] = float(R.lse[i]);
  const TcRun tc = run_bf16_attention(s, c.anchors, in, bf16_round(out_b), lse_b,
                                      cuda::launch_dflash_attention_forward_tc,
                                      cuda::launch_dflash_attention_backward_tc);
  const TcRun cores = run_bf16_attention(s, c.anchors, in, bf16_round(out_b), lse_b,
                                         cuda::launch_dflash_attention_forward_cores<cuda::bf16>,
                                         cuda::launch_dflash_attention_backward_cores<cuda::bf16>);
  const double keys = double(s.ctx_len + s.block);
  const std::vector<double> lse_tol(R.lse.size(), 8.0 * (keys + D) * kU * (std::sqrt(double(D)) * 4 + 5));
  for (const TcRun* run : {&tc, &cores}) {
    const char* who = run == &tc ? "tensor cores" : "CUDA cores";
    INFO(who);
    require_bound(run->out, R.out, R.m_out, 0x1.0p-9, "out");
    require_bound(run->lse, R.lse, lse_tol, 1.0, "lse (fp32)");
    require_bound(run->dq, R.dq, R.m_dq, 0x1.0p-8, "dq");
    require_bound(run->dkc, R.dkc, R.m_dkc, 0x1.0p-8, "dk_ctx");
    require_bound(run->dkb, R.dkb, R.m_dkb, 0x1.0p-8, "dk_blk");
    require_bound(run->dvc, R.dvc, R.m_dvc, 0x1.0p-9, "dv_ctx");
    require_bound(run->dvb, R.dvb, R.m_dvb, 0x1.0p-9, "dv_blk");
  }
  // the two kernels against each other: within the sum of their bounds
  std::vector<double> cores_out(cores.out.begin(), cores.out.end()), cores_dq(cores.dq.begin(), cores.dq.end());
  std::vector<double> mag2(R.m_out.size());
  for (size_t i = 0; i < mag2.size(); ++i) mag2[i] = 2 * R.m_out[i] + 0x1.0p-8 * std::fabs(R.out[i]) / 0x1.0p-9;
  require_bound(tc.out, cores_out, mag2, 0x1.0p-9, "out: tensor cores vs CUDA cores");
  for (size_t i = 0; i < mag2.size(); ++i) mag2[i] = 2 * R.m_dq[i] + 0x1.0p-8 * std::fabs(R.dq[i]) / 0x1.0p-8;
  require_bound(tc.dq, cores_dq, mag2, 0x1.0p-8, "dq: tensor cores vs CUDA cores");
}

}  // namespace

TEST_CASE("cuda twin attention_tc: DFlash forward/backward on tensor cores (D 64/128/256, GQA 1/4/6, sliding)") {
  // {n_blocks, block, ctx_len, heads, kv_heads, head_dim, window}
  dflash_tc_twin({{5, 16, 300, 8, 2, 128, 0}, {0, 1, 150, 299, 300}});   // G 4, partial tiles, anchors 0 and S
  dflash_tc_twin({{5, 16, 300, 8, 2, 128, 64}, {0, 1, 150, 299, 300}});  // a sliding window across tiles
  dflash_tc_twin({{3, 16, 130, 2, 2, 64, 0}, {130, 64, 65}});            // G 1
  dflash_tc_twin({{3, 8, 100, 12, 2, 64, 20}, {0, 50, 100}});            // G 6: 48 rows, a short window
  dflash_tc_twin({{3, 7, 77, 8, 2, 64, 16}, {76, 13, 40}});              // 28 rows: a partial warp
  dflash_tc_twin({{2, 32, 100, 4, 1, 256, 0}, {40, 100}});               // D 256, 128 rows (8 warps)
}

// The shapes the published drafters and the shipped configs use, per kv head (the launch depends on G, head_dim and
// the block, not on the head count): 32 Q / 8 KV heads (G 4) at head_dim 128 with block 16 (the shipped configs)
// and 32 (the seed's recipe), a 2048 sliding window (the Qwen3.6 drafter's 4 sliding layers: causal within the
// block), and G 8 (64 / 8 heads) where block 32 makes 256 query rows: more warps than 255 registers (dQ) or 174
// (forward) leave a thread block on any GPU, so the tile is cut into slices of blockIdx.z (row_slices). Under
// DFLASH_EMU_ARCH=sm_120 and sm_90 alike (ctest runs both): a launch the register file refuses fails here.
TEST_CASE("cuda twin attention_tc: the published drafters' shapes, query tiles wider than a thread block sliced") {
  dflash_tc_twin({{2, 16, 96, 4, 1, 128, 0}, {40, 96}});     // G 4, block 16: 64 rows
  dflash_tc_twin({{2, 32, 96, 4, 1, 128, 0}, {10, 96}});     // G 4, block 32: 128 rows, 8 warps
  dflash_tc_twin({{2, 16, 96, 4, 1, 128, 2048}, {40, 96}});  // the 2048 window (past the context: causal block keys)
  dflash_tc_twin({{2, 16, 96, 8, 1, 128, 0}, {40, 96}});     // G 8, block 16: 128 rows
  dflash_tc_twin({{2, 32, 96, 8, 1, 128, 0}, {40, 96}});     // G 8, block 32: 256 rows, sliced
  dflash_tc_twin({{2, 32, 64, 8, 1, 256, 64}, {20, 64}});    // head_dim 256, 256 rows: two slices of 8 warps
}

TEST_CASE("cuda twin attention_tc: what the tensor-core kernels take, and the fallback for the rest") {
  CHECK(cuda::dflash_attention_tc_supports({4, 16, 100, 8, 2, 128, 0}, {}));
  CHECK_FALSE(cuda::dflash_attention_tc_supports({4, 16, 100, 8, 2, 96, 0}, {}));    // head_dim
  CHECK_FALSE(cuda::dflash_attention_tc_supports({4, 16, 100, 8, 3, 128, 0}, {}));   // heads % kv_heads
  CHECK_FALSE(cuda::dflash_attention_tc_supports({4, 64, 100, 64, 4, 128, 0}, {}));  // 1024 rows per block
  alignas(16) static const char bytes[32] = {};
  CHECK(cuda::dflash_attention_tc_supports({4, 16, 100, 8, 2, 128, 0}, {bytes}));
  CHECK_FALSE(cuda::dflash_attention_tc_supports({4, 16, 100, 8, 2, 128, 0}, {bytes + 2}));  // cp.async alignment
}

// ---- split-K (flash-decoding) of the cached attention on tensor cores ----
// A split's rows hold an unnormalised fp32 output and (max, sum); the merge rescales them in fp32 and rounds the
// output once, so the split result has the bound of the unsplit kernel (P rounded to bf16 relative to the split's
// own max: still 2^-9 Σ p|v|; out rounded once: 2^-9 |out|) and the two differ by at most the sum of their bounds.
namespace {

struct CachedCase {
  int n, past, NH, KVH, D;
};

// The double reference of causal attention over a cache (row i at position past + i sees keys 0 .. past + i),
// and the magnitude Σ p|v| of the P-rounding bound.
void cached_reference(const CachedCase& c, const std::vector<float>& q, const std::vector<float>& k,
                      const std::vector<float>& v, std::vector<double>& want, std::vector<double>& mag) {
  const int G = c.NH / c.KVH;
  const double scale = 1.0 / std::sqrt(double(c.D));
  want.assign(q.size(), 0.0);
  mag.assign(q.size(), 0.0);
  for (int i = 0; i < c.n; ++i)
    for (int h = 0; h < c.NH; ++h) {
      const size_t qo = (size_t(i) * c.NH + h) * c.D;
      const int seen = c.past + i + 1, g = h / G;
      std::vector<double> sc(seen);
      double mx = -INFINITY, l = 0;
      for (int t = 0; t < seen; ++t) {
        double acc = 0;
        for (int d = 0; d < c.D; ++d) acc += double(q[qo + d]) * k[(size_t(t) * c.KVH + g) * c.D + d];
        mx = std::max(mx, sc[t] = acc * scale);
      }
      for (double x : sc) l += std::exp(x - mx);
      for (int t = 0; t < seen; ++t) {
        const double p = std::exp(sc[t] - mx) / l;
        for (int d = 0; d < c.D; ++d) {
          const double vv = v[(size_t(t) * c.KVH + g) * c.D + d];
          want[qo + d] += p * vv;
          mag[qo + d] += p * std::fabs(vv);
        }
      }
    }
}

}  // namespace

TEST_CASE("cuda twin attention_tc: causal attention of the target on tensor cores (prefill, cached, decode)") {
  struct Case {
    int n, past, NH, KVH, D;
  };
  // the bound of the DFlash forward above: P rounded to bf16 for P·V, then out rounded
  for (const Case c : {Case{40, 0, 6, 1, 256}, Case{70, 0, 8, 2, 128}, Case{5, 100, 4, 4, 64}, Case{1, 300, 12, 2, 128},
                       Case{33, 64, 24, 4, 256}}) {
    INFO("n " << c.n << " past " << c.past << " NH " << c.NH << " KVH " << c.KVH << " D " << c.D);
    REQUIRE(cuda::attention_causal_tc_supports(c.NH, c.KVH, c.D, {}));
    const int keys = c.past + c.n;
    const auto q = bf16_round(randn(size_t(c.n) * c.NH * c.D, 160)),
               k = bf16_round(randn(size_t(keys) * c.KVH * c.D, 161)),
               v = bf16_round(randn(size_t(keys) * c.KVH * c.D, 162));
    std::vector<double> want, mag;
    cached_reference({c.n, c.past, c.NH, c.KVH, c.D}, q, k, v, want, mag);
    Dev<bf16> gq(to_bf16(q)), gk(to_bf16(k)), gv(to_bf16(v)), tc(std::vector<bf16>(q.size())),
        cores(std::vector<bf16>(q.size()));
    const cudaStream_t st = static_cast<cudaStream_t>(gpu().ex().stream);
    cuda::launch_attention_cached_forward_tc(st, dev(tc.p()), dev(gq.p()), dev(gk.p()), dev(gv.p()), c.n, c.past, c.NH,
                                             c.KVH, c.D);
    cuda::launch_attention_cached_forward_cores<cuda::bf16>(st, dev(cores.p()), dev(gq.p()), dev(gk.p()), dev(gv.p()),
                                                            c.n, c.past, c.NH, c.KVH, c.D);
    require_bound(to_f32(tc.get()), want, mag, 0x1.0p-9, "causal out, tensor cores");
    require_bound(to_f32(cores.get()), want, mag, 0x1.0p-9, "causal out, CUDA cores");
  }
  CHECK_FALSE(cuda::attention_causal_tc_supports(8, 3, 128, {}));
  CHECK_FALSE(cuda::attention_causal_tc_supports(8, 2, 80, {}));
}


TEST_CASE("cuda twin attention_tc: the published targets' causal shapes (G 4 to 16, head_dim 128 and 256)") {
  struct Case {
    int n, past, NH, KVH, D;
  };
  // G 8 (Qwen3-30B-A3B: 32 / 4 heads), G 16 (Qwen3-235B-A22B: 64 / 4 at 128; 32 / 2 at 256): a tile of 128 / G
  // positions × G heads, 8 warps, prefill and decode
  for (const Case c : {Case{40, 0, 8, 1, 128}, Case{17, 0, 16, 1, 128}, Case{1, 90, 16, 1, 128},
                       Case{9, 30, 16, 1, 256}}) {
    INFO("n " << c.n << " past " << c.past << " NH " << c.NH << " KVH " << c.KVH << " D " << c.D);
    REQUIRE(cuda::attention_causal_tc_supports(c.NH, c.KVH, c.D, {}));
    const int keys = c.past + c.n;
    const auto q = bf16_round(randn(size_t(c.n) * c.NH * c.D, 180)),
               k = bf16_round(randn(size_t(keys) * c.KVH * c.D, 181)),
               v = bf16_round(randn(size_t(keys) * c.KVH * c.D, 182));
    std::vector<double> want, mag;
    cached_reference({c.n, c.past, c.NH, c.KVH, c.D}, q, k, v, want, mag);
    Dev<bf16> gq(to_bf16(q)), gk(to_bf16(k)), gv(to_bf16(v)), tc(std::vector<bf16>(q.size()));
    const cudaStream_t st = static_cast<cudaStream_t>(gpu().ex().stream);
    cuda::launch_attention_cached_forward_tc(st, dev(tc.p()), dev(gq.p()), dev(gk.p()), dev(gv.p()), c.n, c.past, c.NH,
                                             c.KVH, c.D);
    require_bound(to_f32(tc.get()), want, mag, 0x1.0p-9, "causal out, tensor cores");
  }
  CHECK_FALSE(cuda::attention_causal_tc_supports(256, 1, 128, {}));  // one position's heads beyond 8 warps
}

TEST_CASE("cuda twin attention_tc: split-K cached attention (decode, verify, past 0) vs the reference and 1 split") {
  struct Case {
    CachedCase c;
    // splits asked, and those the launcher uses: ⌈tiles / ⌈tiles / splits⌉⌉ (tiles of 64 keys, 32 at D 256)
    int splits, used;
  };
  for (const Case& tc : {Case{{1, 300, 12, 2, 128}, 3, 3},   // decode, G 6: 301 keys = 5 tiles (the last of 45)
                         Case{{1, 200, 4, 1, 256}, 4, 4},    // decode, G 4, D 256: 7 tiles (the last of 9), 2 a split
                         Case{{16, 150, 4, 4, 64}, 2, 2},    // verify, G 1: 166 keys, 3 tiles; the mask across splits
                         Case{{100, 0, 8, 2, 256}, 4, 4},    // past 0, 4 query tiles: the first's splits 1..3 empty
                         Case{{64, 200, 6, 1, 64}, 4, 3},    // verify n 64, G 6: 4 query tiles (the last of 1 row)
                         Case{{1, 500, 24, 4, 256}, 4, 4}}) {  // the 27B's heads, 16 tiles
    const CachedCase& c = tc.c;
    INFO("n " << c.n << " past " << c.past << " NH " << c.NH << " KVH " << c.KVH << " D " << c.D << " splits "
              << tc.splits);
    REQUIRE(cuda::attention_causal_tc_supports(c.NH, c.KVH, c.D, {}));
    const int keys = c.past + c.n;
    const auto q = bf16_round(randn(size_t(c.n) * c.NH * c.D, 170)),
               k = bf16_round(randn(size_t(keys) * c.KVH * c.D, 171)),
               v = bf16_round(randn(size_t(keys) * c.KVH * c.D, 172));
    std::vector<double> want, mag;
    cached_reference(c, q, k, v, want, mag);
    const size_t floats = cuda::attention_cached_split_scratch_floats(c.n, c.NH, c.D, tc.splits);
    REQUIRE(floats == size_t(tc.splits) * c.n * c.NH * (c.D + 2));
    Dev<bf16> gq(to_bf16(q)), gk(to_bf16(k)), gv(to_bf16(v)), one(std::vector<bf16>(q.size())),
        split(std::vector<bf16>(q.size())), again(std::vector<bf16>(q.size()));
    // scratch full of NaN: a partial the merge reads but no split wrote would poison the output
    Dev<float> scratch(std::vector<float>(floats, std::numeric_limits<float>::quiet_NaN()));
    const cudaStream_t st = static_cast<cudaStream_t>(gpu().ex().stream);
    cuda::launch_attention_cached_forward_tc(st, dev(one.p()), dev(gq.p()), dev(gk.p()), dev(gv.p()), c.n, c.past, c.NH,
                                             c.KVH, c.D);
    cuda::launch_attention_cached_forward_tc(st, dev(split.p()), dev(gq.p()), dev(gk.p()), dev(gv.p()), c.n, c.past,
                                             c.NH, c.KVH, c.D, tc.splits, scratch.p());
    // every partial of the `used` splits was written (empty splits included), none past them
    const std::vector<float> parts = scratch.get();
    const size_t written = size_t(tc.used) * c.n * c.NH * (c.D + 2);
    CHECK(std::none_of(parts.begin(), parts.begin() + written, [](float x) { return std::isnan(x); }));
    CHECK(std::all_of(parts.begin() + written, parts.end(), [](float x) { return std::isnan(x); }));
    // the same bits from other scratch contents (zeros): nothing unwritten is read
    Dev<float> zeros_scratch(std::vector<float>(floats, 0.0f));
    cuda::launch_attention_cached_forward_tc(st, dev(again.p()), dev(gq.p()), dev(gk.p()), dev(gv.p()), c.n, c.past,
                                             c.NH, c.KVH, c.D, tc.splits, zeros_scratch.p());
    const std::vector<bf16> split_bits = split.get(), again_bits = again.get();
    CHECK(std::memcmp(split_bits.data(), again_bits.data(), split_bits.size() * sizeof(bf16)) == 0);

    const std::vector<float> got_one = to_f32(one.get()), got_split = to_f32(split_bits);
    require_bound(got_one, want, mag, 0x1.0p-9, "cached out, 1 split");
    require_bound(got_split, want, mag, 0x1.0p-9, "cached out, split-K");
    // split against unsplit: within the sum of the two bounds
    std::vector<double> one_d(got_one.begin(), got_one.end()), mag2(mag.size());
    for (size_t i = 0; i < mag2.size(); ++i) mag2[i] = 2 * mag[i] + 2 * std::fabs(want[i]);
    require_bound(got_split, one_d, mag2, 0x1.0p-9, "cached out, split-K vs 1 split");
  }
}

TEST_CASE("cuda twin attention_tc: split-K through the bf16 backend against the CPU, and the split policy") {
  // the policy: about 132 thread blocks, at least 4 key tiles a split, at most 64 splits; 1 where the unsplit grid
  // already fills the GPU (prefill) or the cache is short
  CHECK(cuda::attention_cached_splits(1, 8191, 24, 4, 256) == 32);    // 4 blocks: 33 for 132, 256 tiles: 8 a split
  CHECK(cuda::attention_cached_splits(16, 8176, 24, 4, 256) == 32);   // 16 rows × 6 heads: still 1 query tile
  CHECK(cuda::attention_cached_splits(64, 8128, 24, 4, 256) == 9);    // 4 query tiles of 21 rows × 4 kv heads
  CHECK(cuda::attention_cached_splits(1, 300, 8, 8, 128) == 1);       // 5 tiles: too short to split
  CHECK(cuda::attention_cached_splits(1, 1000, 128, 1, 64) == 4);     // G 128: 16 tiles, 4 a split
  CHECK(cuda::attention_cached_splits(1, 1000, 512, 1, 64) == 1);     // G 512: not a tensor-core shape
  CHECK(cuda::attention_cached_splits(8192, 0, 24, 4, 256) == 1);     // prefill: 1564 blocks
  CHECK(cuda::attention_cached_splits(1, 8191, 8, 2, 96) == 1);       // not a tensor-core shape
  CHECK(cuda::attention_cached_split_scratch_floats(16, 24, 256, 32) == size_t(32) * 16 * 24 * 258);
  CHECK(cuda::attention_cached_split_scratch_floats(16, 24, 256, 1) == 0);

  for (const CachedCase c : {CachedCase{1, 1100, 4, 1, 64}, CachedCase{16, 1100, 8, 2, 128}}) {
    INFO("n " << c.n << " past " << c.past << " NH " << c.NH << " KVH " << c.KVH << " D " << c.D);
    REQUIRE(cuda::attention_cached_splits(c.n, c.past, c.NH, c.KVH, c.D) == 4);  // 18 tiles
    const int keys = c.past + c.n;
    const auto q = bf16_round(randn(size_t(c.n) * c.NH * c.D, 173)),
               k = bf16_round(randn(size_t(keys) * c.KVH * c.D, 174)),
               v = bf16_round(randn(size_t(keys) * c.KVH * c.D, 175));
    std::vector<double> want, mag;
    cached_reference(c, q, k, v, want, mag);
    std::vector<float> cpu_out(q.size());
    cpu().attention_cached_forward(hx(), cpu_out.data(), q.data(), k.data(), v.data(), c.n, c.past, c.NH, c.KVH, c.D);
    Dev<bf16> gq(to_bf16(q)), gk(to_bf16(k)), gv(to_bf16(v)), gout(std::vector<bf16>(q.size()));
    gpu().b16->attention_cached_forward(gpu().ex(), gout.p(), gq.p(), gk.p(), gv.p(), c.n, c.past, c.NH, c.KVH, c.D);
    const std::vector<float> got = to_f32(gout.get());
    require_bound(got, want, mag, 0x1.0p-9, "cached out through the backend, split-K");
    // the CPU twin (fp32 on the same bf16 inputs): its fp32 bound (as the target family's) plus the kernel's
    const double t_out = 8.0 * (keys + c.D) * kU * (std::sqrt(double(c.D)) * 4 + 5);
    std::vector<double> tol(cpu_out.size());
    for (size_t i = 0; i < tol.size(); ++i)
      tol[i] = t_out + 2 * (0x1.0p-9 * mag[i] + 0x1.0p-9 * std::fabs(cpu_out[i]));
    require_within(got, cpu_out, tol, "cached out through the backend vs the CPU backend");
  }
}

#endif  // DFLASH_WITH_CUDA
