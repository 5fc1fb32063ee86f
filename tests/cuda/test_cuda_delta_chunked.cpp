// The chunk-parallel tensor-core delta rule (kernels/cuda/deltanet_chunked.cu, bf16) against the double per-token
// recurrence (cpu::gated_delta_rule_reference), the fp32 per-token CUDA kernel, and its CPU twin
// (cpu::gated_delta_rule_chunked_ut) line by line: exact in double, and with the kernel's bf16 roundings; the kernel's
// scratch (γ, W, every chunk's start state) against the twin's trace. S from 1 to 8192 (128 chunks), partial chunks,
// GQA, a state carried over two calls, the null state, dk 64 / 128, dv 64 … 192, inputs without decay and with three
// repeated keys, slow decay over 128 chunks; the backend's bf16 dispatch (its own scratch or the caller's) gives the
// same bits; S = 1 goes to the per-token kernel; the bf16 hybrid target runs it with its scratch planned in the
// activation arena; misaligned inputs; refused shapes. Family `delta_chunked`
// (tests/cuda/CMakeLists.txt): on the emulated GPU under two thread orders; CI runs it with DFLASH_EMU_ARCH sm_90
// and sm_120 (the state pass in 3 and in 2 cp.async stages).
//
// The bound (derived, per element; kB = 2⁻⁸ per rounding to bf16, round to nearest). The references see the
// kernel's inputs exactly (bf16-valued q, k, v; fp32 g, β, state), so only the kernel's own roundings count. To first
// order in kB, by running error analysis (Wilkinson) alongside a double evaluation of the kernel's formulas in its
// order (first_order_bound below): a value x rounded to bf16 gains kB·|x|; a product's error bound is
// Σ (E(a)·|b| + |a|·E(b)). Per chunk, starting from the exact state S₀ (local errors):
//   E(T) = kB|T|, E(X) = kB|X| (X = β e^γ K), E(βV) = kB|βV|;  E(W) = |T| E(X) + E(T) |X| + kB|W|, E(U) likewise;
//   E(S₀ as operand) = kB|S₀|;  E(V') = E(U) + E(W)|S₀| + |W| E(S₀);  E(V' as read) = E(V') + kB|V'|;
//   E(e^{γl−γ}V') = e^{γl−γ} E(V') + kB|e^{γl−γ}V'|;  E(S_new) = |K|ᵀ E(e^{γl−γ}V');
//   E(O) = e^γ |Q| E(S₀) + kB|P| |V'| + |P| E(V' as read) + kB|O|   (P = Q Kᵀ ⊙ D ⊙ causal, rounded to bf16).
// The error carried in the state is bounded by the recurrence itself, not by absolute values (which would compound
// over chunks): each token's map m ← e^g (I − β k kᵀ) m of a state column has 2-norm ≤ e^g (unit k, 0 ≤ β ≤ 1), so
// with c_d the bound on the 2-norm of column d's carried error at a chunk's start,
//   c_d ← e^{γl} c_d + ‖E(S_new)[:, d]‖₂,   and an output adds ‖q_i‖₂ e^{γ_i} c_d (its sensitivity to S₀).
// The final state's elements are bounded by c_d. The kernel's fp32 sums (≤ dk·2⁻²⁴ relative to Σ|a||b|), its fp32
// exponentials and the bf16x3 products in T's merge (~2⁻¹⁶) are second order beside kB: the bound is taken × 17/16
// plus 2⁻²⁰·max|o| for them, and second-order terms in kB (kB² relative) are below that margin.
// Line by line: the twin with the kernel's roundings differs from the kernel only where fp32 and double round a
// value to different bf16 neighbours (the kernel's fp32 error, ~2⁻²⁰ relative, against bf16's 2⁻⁸ spacing: a
// fraction ~2⁻¹² of the roundings, each one bf16 step): RMS(kernel − twin) ≤ kB/4 · rms(o) holds with a wide margin
// (measured below) and fails for any misplaced rounding (a whole kB on most elements).
// Measured numbers are printed (MESSAGE).
#include <doctest/doctest.h>

#if DFLASH_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/gated_delta_chunked.h"
#include "kernels/cpu/gated_deltanet.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/deltanet_chunked.h"
#include "kernels/delta_rule_chunks.h"
#include "lib/comm/transport.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"
#include "lib/model/target_layers.h"
#include "tests/unit/test_util.h"

using namespace dflash;
using namespace dflash::kernels;
// The kernels' type, for the direct launches; the backend takes kernels::bf16, bit for bit the same.
using dbf16 = __nv_bfloat16;

namespace {

constexpr double kB = 0x1.0p-8;  // bf16 relative rounding
// Line by line (the header): over the first 256 positions. Later, once fp32 and double have rounded one value of the
// carried state to different bf16 neighbours, every later rounding sees inputs ~kB apart and the kernel's and the
// twin's rounding patterns decorrelate: both stay within the derived bound (checked everywhere), not near each other.
constexpr int kLineTokens = 256;

struct DeltaGpu {
  cuda::CudaContext context{0};
  std::unique_ptr<Backend<kernels::bf16>> b16 = make_cuda_backend<kernels::bf16>();
  ExecContext& ex() { return context.exec(); }
  cudaStream_t stream() { return static_cast<cudaStream_t>(context.exec().stream); }
};
kernels::bf16* storage(dbf16* p) { return reinterpret_cast<kernels::bf16*>(p); }

DeltaGpu& dgpu() {
  static DeltaGpu g;
  return g;
}

template <typename T>
struct DevBuf {
  Buffer buf;
  size_t n = 0;
  explicit DevBuf(const std::vector<T>& h)
      : buf(MemoryKind::device, std::max<size_t>(1, h.size()) * sizeof(T)), n(h.size()) {
    dgpu().b16->upload(dgpu().ex(), buf.data(), h.data(), n * sizeof(T));
  }
  T* p() const { return buf.as<T>(); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    dgpu().b16->download(dgpu().ex(), h.data(), buf.data(), n * sizeof(T));
    return h;
  }
};

enum class Kind {
  random,  // g ∈ [−2, 0) (every fifth near 0), β ∈ (0, 1), random unit keys
  hard,    // no decay (g = 0), β = 0.99, three distinct keys repeated: T far from the identity
  slow,    // g ∈ [−0.004, 0): the state remembers ~8 chunks, its rounding errors accumulate over them
};

struct Shape {
  int S, KH, VH, dk, dv;
  bool with_state;
  int split;  // first call's length (the state carried to a second call); 0: one call
  Kind kind = Kind::random;
  bool backend = false;  // also through the backend's bf16 entry (its own scratch and the caller's)
};

// The rule's inputs as the layer gives them: q, k unit rows (q scaled by 1/sqrt(dk)) and v rounded to bf16;
// the state N(0, 0.3²).
struct Inputs {
  std::vector<float> q, k, v, g, beta, state;
  Inputs(const Shape& c, uint64_t seed) {
    Rng rng(seed);
    auto normal = [&](size_t n, double sd) {
      std::vector<float> x(n);
      for (auto& e : x) e = float(sd * rng.normal());
      return x;
    };
    auto round = [](std::vector<float>& x) {
      for (auto& e : x) e = __bfloat162float(__float2bfloat16(e));
    };
    q = normal(size_t(c.S) * c.KH * c.dk, 1.0);
    k = normal(q.size(), 1.0);
    v = normal(size_t(c.S) * c.VH * c.dv, 1.0);
    cpu::l2norm_forward<float>(q.data(), c.S * c.KH, c.dk, 1e-6f, 1.0f / std::sqrt(float(c.dk)));
    cpu::l2norm_forward<float>(k.data(), c.S * c.KH, c.dk, 1e-6f, 1.0f);
    round(q), round(k), round(v);
    g.resize(size_t(c.S) * c.VH);
    beta.resize(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      if (c.kind == Kind::slow) g[i] = float(-0.004 * rng.uniform());
      else g[i] = float(i % 5 == 0 ? -0.01 * rng.uniform() : -2.0 * rng.uniform());
    }
    for (auto& x : beta) x = float(1.0 / (1.0 + std::exp(-rng.normal())));
    state = normal(size_t(c.VH) * c.dk * c.dv, 0.3);
    if (c.kind == Kind::hard) {
      std::fill(g.begin(), g.end(), 0.f);
      std::fill(beta.begin(), beta.end(), 0.99f);
      const size_t row = size_t(c.KH) * c.dk;
      for (int t = 3; t < c.S; ++t) std::copy_n(&k[size_t(t % 3) * row], row, &k[size_t(t) * row]);
    }
  }
};

std::vector<double> to_d(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }
std::vector<dbf16> to_bf16(const std::vector<float>& x) {
  std::vector<dbf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16(x[i]);
  return y;
}
std::vector<double> to_d(const std::vector<dbf16>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = __bfloat162float(x[i]);
  return y;
}
double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}
double rms(const std::vector<double>& x) {
  double s = 0;
  for (double e : x) s += e * e;
  return x.empty() ? 0.0 : std::sqrt(s / double(x.size()));
}
struct Diff {
  double max = 0, rms = 0;
  double worst = 0;  // max |a − b| / bound (with a bound)
};
Diff diff(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>* bound = nullptr) {
  REQUIRE(a.size() == b.size());
  Diff d;
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(a[i] - b[i]);
    REQUIRE(std::isfinite(a[i]));
    d.max = std::max(d.max, e);
    if (bound) d.worst = std::max(d.worst, e / (*bound)[i]);
    s += e * e;
  }
  d.rms = a.empty() ? 0.0 : std::sqrt(s / double(a.size()));
  return d;
}

// The calls a shape makes: [t0, t0 + len) each, the state carried.
std::vector<std::pair<int, int>> calls_of(const Shape& c) {
  if (c.split) return {{0, c.split}, {c.split, c.S - c.split}};
  return {{0, c.S}};
}

// The first-order error bound of the header, per element of out [S, VH, dv] and of the final state [VH, dk, dv],
// over the kernel's chunks of the given calls.
struct Bound {
  std::vector<double> out, state;
};
Bound first_order_bound(const Shape& c, const Inputs& in) {
  const int S = c.S, KH = c.KH, VH = c.VH, dk = c.dk, dv = c.dv, r = VH / KH, C = kDeltaChunk;
  Bound b;
  b.out.assign(size_t(S) * VH * dv, 0.0);
  b.state.assign(size_t(VH) * dk * dv, 0.0);
  const auto q = to_d(in.q), k = to_d(in.k), v = to_d(in.v), g = to_d(in.g), beta = to_d(in.beta);
  std::vector<double> M, carried, gam(C), bet(C), A(C * C), T(C * C), X, EX, Vb, W, EW, U, EU, Vp, EVp, Vs, EVs, ES;
  for (int h = 0; h < VH; ++h) {
    const int kh = h / r;
    M.assign(size_t(dk) * dv, 0.0);
    if (c.with_state || c.split)
      for (size_t e = 0; e < M.size(); ++e) M[e] = c.with_state ? double(in.state[size_t(h) * dk * dv + e]) : 0.0;
    carried.assign(size_t(dv), 0.0);
    const auto kr = [&](int t) { return &k[(size_t(t) * KH + kh) * dk]; };
    const auto qr = [&](int t) { return &q[(size_t(t) * KH + kh) * dk]; };
    for (const auto& [t0, len] : calls_of(c))
      for (int c0 = t0; c0 < t0 + len; c0 += C) {
        const int n = std::min(C, t0 + len - c0);
        double acc = 0;
        for (int i = 0; i < n; ++i) {
          acc += g[size_t(c0 + i) * VH + h];
          gam[size_t(i)] = acc;
          bet[size_t(i)] = beta[size_t(c0 + i) * VH + h];
        }
        // A, then T = (I + A)⁻¹ exactly (row by row)
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < i; ++j) {
            double dot = 0;
            for (int d = 0; d < dk; ++d) dot += kr(c0 + i)[d] * kr(c0 + j)[d];
            A[size_t(i) * C + j] = bet[size_t(i)] * std::exp(gam[size_t(i)] - gam[size_t(j)]) * dot;
          }
        for (int i = 0; i < n; ++i) {
          for (int j = 0; j < i; ++j) {
            double s = A[size_t(i) * C + j];
            for (int m = j + 1; m < i; ++m) s += A[size_t(i) * C + m] * T[size_t(m) * C + j];
            T[size_t(i) * C + j] = -s;
          }
          T[size_t(i) * C + i] = 1.0;
        }
        X.assign(size_t(n) * dk, 0.0), Vb.assign(size_t(n) * dv, 0.0);
        for (int j = 0; j < n; ++j) {
          const double bw = bet[size_t(j)] * std::exp(gam[size_t(j)]);
          for (int d = 0; d < dk; ++d) X[size_t(j) * dk + d] = bw * kr(c0 + j)[d];
          for (int d = 0; d < dv; ++d) Vb[size_t(j) * dv + d] = bet[size_t(j)] * v[(size_t(c0 + j) * VH + h) * dv + d];
        }
        // W, U and their bounds: |T| E(X) + E(T) |X| + kB|W| = 2 kB |T| |X| + kB |W|
        W.assign(size_t(n) * dk, 0.0), EW.assign(W.size(), 0.0), U.assign(size_t(n) * dv, 0.0), EU.assign(U.size(), 0.0);
        for (int i = 0; i < n; ++i)
          for (int j = 0; j <= i; ++j) {
            const double t = T[size_t(i) * C + j], at = std::fabs(t);
            for (int d = 0; d < dk; ++d) {
              W[size_t(i) * dk + d] += t * X[size_t(j) * dk + d];
              EW[size_t(i) * dk + d] += 2 * kB * at * std::fabs(X[size_t(j) * dk + d]);
            }
            for (int d = 0; d < dv; ++d) {
              U[size_t(i) * dv + d] += t * Vb[size_t(j) * dv + d];
              EU[size_t(i) * dv + d] += 2 * kB * at * std::fabs(Vb[size_t(j) * dv + d]);
            }
          }
        for (size_t e = 0; e < W.size(); ++e) EW[e] += kB * std::fabs(W[e]);
        for (size_t e = 0; e < U.size(); ++e) EU[e] += kB * std::fabs(U[e]);
        // V' = U − W S₀, E(V') = E(U) + (E(W) + kB|W|) |S₀|; e^{γl−γ}V' and its bound
        const double last = gam[size_t(n - 1)];
        Vp.assign(size_t(n) * dv, 0.0), EVp.assign(Vp.size(), 0.0), Vs.assign(Vp.size(), 0.0), EVs.assign(Vp.size(), 0.0);
        for (int i = 0; i < n; ++i) {
          const double f = std::exp(last - gam[size_t(i)]);
          for (int d = 0; d < dv; ++d) {
            double s = 0, es = 0;
            for (int e = 0; e < dk; ++e) {
              const double m = M[size_t(e) * dv + d];
              s += W[size_t(i) * dk + e] * m;
              es += (EW[size_t(i) * dk + e] + kB * std::fabs(W[size_t(i) * dk + e])) * std::fabs(m);
            }
            const size_t id = size_t(i) * dv + d;
            Vp[id] = U[id] - s;
            EVp[id] = EU[id] + es;
            Vs[id] = f * Vp[id];
            EVs[id] = f * EVp[id] + kB * std::fabs(Vs[id]);
          }
        }
        // the outputs: E(O) = e^γ |Q| kB|S₀| + Σ_j (kB|P| |V'| + |P| (E(V') + kB|V'|)) + kB|O|, + ‖q‖ e^γ c_d
        for (int i = 0; i < n; ++i) {
          const double* qi = qr(c0 + i);
          const double ei = std::exp(gam[size_t(i)]);
          double qn = 0;
          for (int e = 0; e < dk; ++e) qn += qi[e] * qi[e];
          qn = std::sqrt(qn);
          std::vector<double> o(size_t(dv), 0.0), eo(size_t(dv), 0.0);
          for (int d = 0; d < dv; ++d) {
            double s = 0, es = 0;
            for (int e = 0; e < dk; ++e) {
              s += qi[e] * M[size_t(e) * dv + d];
              es += std::fabs(qi[e]) * kB * std::fabs(M[size_t(e) * dv + d]);
            }
            o[size_t(d)] = ei * s;
            eo[size_t(d)] = ei * es;
          }
          for (int j = 0; j <= i; ++j) {
            double dot = 0;
            for (int e = 0; e < dk; ++e) dot += qi[e] * kr(c0 + j)[e];
            const double p = std::exp(gam[size_t(i)] - gam[size_t(j)]) * dot, ap = std::fabs(p);
            for (int d = 0; d < dv; ++d) {
              const size_t jd = size_t(j) * dv + d;
              o[size_t(d)] += p * Vp[jd];
              eo[size_t(d)] += 2 * kB * ap * std::fabs(Vp[jd]) + ap * EVp[jd];
            }
          }
          for (int d = 0; d < dv; ++d)
            b.out[(size_t(c0 + i) * VH + h) * dv + d] =
                eo[size_t(d)] + kB * std::fabs(o[size_t(d)]) + qn * ei * carried[size_t(d)];
        }
        // the state: exactly, and the carried bound c_d ← e^{γl} c_d + ‖|K|ᵀ E(e^{γl−γ}V')[:, d]‖₂
        const double el = std::exp(last);
        ES.assign(size_t(dk) * dv, 0.0);
        for (auto& m : M) m *= el;
        for (int j = 0; j < n; ++j) {
          const double* kj = kr(c0 + j);
          for (int e = 0; e < dk; ++e)
            for (int d = 0; d < dv; ++d) {
              M[size_t(e) * dv + d] += kj[e] * Vs[size_t(j) * dv + d];
              ES[size_t(e) * dv + d] += std::fabs(kj[e]) * EVs[size_t(j) * dv + d];
            }
        }
        for (int d = 0; d < dv; ++d) {
          double s = 0;
          for (int e = 0; e < dk; ++e) s += ES[size_t(e) * dv + d] * ES[size_t(e) * dv + d];
          carried[size_t(d)] = el * carried[size_t(d)] + std::sqrt(s);
        }
      }
    for (int e = 0; e < dk; ++e)
      for (int d = 0; d < dv; ++d) b.state[(size_t(h) * dk + e) * dv + d] = carried[size_t(d)];
  }
  return b;
}

// The references' margins for the second-order terms (the header): × 17/16, + 2⁻²⁰ of the largest magnitude.
void widen(std::vector<double>& bound, double scale) {
  for (double& e : bound) e = e * (17.0 / 16.0) + 0x1.0p-20 * scale;
}

// The kernel's scratch read back (one call): γ, W, the per-chunk states.
struct ScratchView {
  std::vector<float> gamma;
  std::vector<double> w, states;
};

// Runs the chunked kernels on c in one or two calls (the state carried on the device); returns out and the final
// state (and, for one direct call, the scratch).
void run_chunked(const Shape& c, const Inputs& in, std::vector<double>& out, std::vector<double>& state,
                 bool through_backend, bool backend_scratch = false, ScratchView* view = nullptr) {
  const size_t vn = size_t(c.S) * c.VH * c.dv;
  DevBuf<dbf16> dq(to_bf16(in.q)), dk(to_bf16(in.k)), dv(to_bf16(in.v)), dout{std::vector<dbf16>(vn)};
  DevBuf<float> dg(in.g), db(in.beta), dst(c.with_state ? in.state : std::vector<float>(in.state.size(), 0.f));
  const size_t scratch_bytes = cuda::gated_delta_rule_chunked_scratch_bytes(c.S, c.VH, c.dk, c.dv);
  DevBuf<unsigned char> scratch{std::vector<unsigned char>(scratch_bytes)};
  float* sp = c.with_state || c.split ? dst.p() : nullptr;
  auto call = [&](int t0, int len) {
    const size_t qo = size_t(t0) * c.KH * c.dk, vo = size_t(t0) * c.VH * c.dv, go = size_t(t0) * c.VH;
    if (through_backend)
      dgpu().b16->gated_delta_rule_forward(dgpu().ex(), storage(dout.p() + vo), storage(dq.p() + qo),
                                           storage(dk.p() + qo), storage(dv.p() + vo), dg.p() + go, db.p() + go, sp,
                                           len, c.KH, c.VH, c.dk, c.dv, backend_scratch ? nullptr : scratch.p());
    else
      cuda::launch_gated_delta_rule_chunked(dgpu().stream(), dout.p() + vo, dq.p() + qo, dk.p() + qo, dv.p() + vo,
                                            dg.p() + go, db.p() + go, sp, len, c.KH, c.VH, c.dk, c.dv, scratch.p());
  };
  for (const auto& [t0, len] : calls_of(c)) call(t0, len);
  out = to_d(dout.get());
  state = to_d(dst.get());
  if (view) {
    const DeltaChunkedScratch lay = delta_rule_chunked_scratch(c.S, c.VH, c.dk, c.dv);
    const std::vector<unsigned char> raw = scratch.get();
    const size_t P = (size_t(c.S) + kDeltaChunk - 1) / kDeltaChunk * kDeltaChunk;
    view->gamma.resize(size_t(c.VH) * P);
    std::memcpy(view->gamma.data(), raw.data() + lay.gamma, view->gamma.size() * sizeof(float));
    auto bf = [&](size_t at, size_t n) {
      std::vector<dbf16> x(n);
      std::memcpy(x.data(), raw.data() + at, n * sizeof(dbf16));
      return to_d(x);
    };
    view->w = bf(lay.w, size_t(c.VH) * P * c.dk);
    view->states = bf(lay.states, size_t(c.VH) * (P / kDeltaChunk) * c.dk * c.dv);
  }
}

// The fp32 per-token CUDA kernel on the same (bf16-valued) inputs, in the same calls.
void run_per_token_f32(const Shape& c, const Inputs& in, std::vector<double>& out, std::vector<double>& state) {
  const size_t vn = size_t(c.S) * c.VH * c.dv;
  DevBuf<float> dq(in.q), dk(in.k), dv(in.v), dout{std::vector<float>(vn)}, dg(in.g), db(in.beta),
      dst(c.with_state ? in.state : std::vector<float>(in.state.size(), 0.f));
  float* sp = c.with_state || c.split ? dst.p() : nullptr;
  for (const auto& [t0, len] : calls_of(c)) {
    const size_t qo = size_t(t0) * c.KH * c.dk, vo = size_t(t0) * c.VH * c.dv, go = size_t(t0) * c.VH;
    cuda::launch_gated_delta_rule_per_token<float>(dgpu().stream(), dout.p() + vo, dq.p() + qo, dk.p() + qo,
                                                   dv.p() + vo, dg.p() + go, db.p() + go, sp, len, c.KH, c.VH, c.dk,
                                                   c.dv);
  }
  out = to_d(dout.get());
  state = to_d(dst.get());
}

const char* kind_name(Kind k) { return k == Kind::hard ? "hard " : k == Kind::slow ? "slow " : ""; }

}  // namespace

TEST_CASE("cuda twin delta_chunked: chunk-parallel delta rule against the recurrence, the fp32 kernel and the twin") {
  const auto t_start = std::chrono::steady_clock::now();
  for (Shape c : {Shape{1, 1, 2, 128, 64, true, 0}, Shape{2, 1, 1, 64, 64, true, 0},
                  Shape{37, 1, 2, 64, 128, false, 0, Kind::random, true},
                  Shape{150, 1, 1, 128, 64, true, 70}, Shape{64, 2, 4, 64, 64, true, 0},
                  Shape{20, 1, 1, 128, 128, true, 0}, Shape{200, 2, 4, 128, 128, true, 130, Kind::random, true},
                  Shape{129, 1, 1, 64, 192, true, 0}, Shape{100, 1, 1, 64, 64, true, 0, Kind::hard},
                  Shape{8192, 1, 1, 128, 64, true, 0, Kind::slow}}) {
    INFO("S " << c.S << " KH " << c.KH << " VH " << c.VH << " dk " << c.dk << " dv " << c.dv << " state "
              << c.with_state << " split " << c.split << " " << kind_name(c.kind));
    // (S = 1 is a decode step, which the dispatch sends per token: here the chunked kernels are called directly)
    REQUIRE(cuda::gated_delta_rule_chunked_supports(c.KH, c.VH, c.dk, c.dv));
    if (c.backend) REQUIRE(delta_rule_chunked_takes(c.S, c.KH, c.VH, c.dk, c.dv));
    const Inputs in(c, uint64_t(1000 + c.S * 7 + c.dk + c.dv));
    const size_t vn = size_t(c.S) * c.VH * c.dv;
    const bool carried = c.with_state || c.split;
    // references in double on the same (bf16-valued) inputs, in the same calls
    std::vector<double> ref(vn), twin(vn), twin_r(vn), st0 = to_d(in.state);
    if (!c.with_state) std::fill(st0.begin(), st0.end(), 0.0);
    std::vector<double> st_ref = st0, st_twin = st0, st_twin_r = st0;
    const auto q = to_d(in.q), k = to_d(in.k), v = to_d(in.v), g = to_d(in.g), beta = to_d(in.beta);
    // (the exact twin at S ≤ 1024 only: equal to the recurrence to 1e-10 there, it costs CI time at 8192)
    const bool exact_twin = c.S <= 1024;
    cpu::ChunkedTrace<double> trace_r, trace_exact;
    for (const auto& [t0, len] : calls_of(c)) {
      const size_t qo = size_t(t0) * c.KH * c.dk, vo = size_t(t0) * c.VH * c.dv, go = size_t(t0) * c.VH;
      cpu::gated_delta_rule_reference<double>(ref.data() + vo, q.data() + qo, k.data() + qo, v.data() + vo,
                                              g.data() + go, beta.data() + go, len, c.KH, c.VH, c.dk, c.dv,
                                              st_ref.data());
      if (exact_twin)
        cpu::gated_delta_rule_chunked_ut<double>(twin.data() + vo, q.data() + qo, k.data() + qo, v.data() + vo,
                                                 g.data() + go, beta.data() + go, len, c.KH, c.VH, c.dk, c.dv, 64,
                                                 st_twin.data(), false, c.split ? nullptr : &trace_exact);
      cpu::gated_delta_rule_chunked_ut<double>(twin_r.data() + vo, q.data() + qo, k.data() + qo, v.data() + vo,
                                               g.data() + go, beta.data() + go, len, c.KH, c.VH, c.dk, c.dv, 64,
                                               st_twin_r.data(), true, c.split ? nullptr : &trace_r);
    }
    const double omax = max_abs(ref), smax = max_abs(st_ref), orms = rms(ref);
    // the twin's formulation is the recurrence, exactly
    if (exact_twin) {
      CHECK(diff(twin, ref).max <= 1e-10 * std::max(1.0, omax));
      CHECK(diff(st_twin, st_ref).max <= 1e-10 * std::max(1.0, smax));
    }

    Bound bound = first_order_bound(c, in);
    widen(bound.out, omax);
    widen(bound.state, smax);

    std::vector<double> out, state;
    ScratchView view;
    run_chunked(c, in, out, state, false, false, c.split ? nullptr : &view);
    const Diff od = diff(out, ref, &bound.out), sd = diff(state, st_ref, &bound.state);
    // line by line over the first kLineTokens positions (below)
    const size_t lead = size_t(std::min(c.S, kLineTokens)) * c.VH * c.dv;
    const std::vector<double> out_lead(out.begin(), out.begin() + lead), twin_lead(twin_r.begin(), twin_r.begin() + lead),
        ref_lead(ref.begin(), ref.begin() + lead);
    const Diff line = diff(out_lead, twin_lead), line_s = diff(state, st_twin_r);
    const double lead_rms = rms(ref_lead);
    // the twin with the kernel's roundings satisfies the same bound (a check of the bound's derivation)
    const Diff twin_rd = diff(twin_r, ref, &bound.out);
    MESSAGE(std::string(kind_name(c.kind))
            << "S=" << c.S << " dk=" << c.dk << " dv=" << c.dv << " VH/KH=" << c.VH << "/" << c.KH
            << ": out max|err| " << od.max / omax << " of max|o|, rms " << od.rms / orms
            << " of rms(o), worst err/bound " << od.worst << " (twin with roundings: " << twin_rd.worst
            << "); line by line vs twin (first " << std::min(c.S, kLineTokens) << " positions): rms "
            << line.rms / lead_rms << " of rms(o), max " << line.max / omax
            << "; state max|err| " << sd.max / std::max(smax, 1e-30) << " of max|S|, worst err/bound " << sd.worst
            << std::string(carried ? "" : " (null state: not compared)"));
    CHECK(od.worst <= 1.0);
    CHECK(twin_rd.worst <= 1.0);
    CHECK(line.rms <= kB / 4 * lead_rms);
    if (carried) {
      CHECK(sd.worst <= 1.0);  // a null state is neither read nor written
      if (c.S <= kLineTokens) CHECK(line_s.rms <= kB / 4 * rms(st_ref));
    }

    // the fp32 per-token kernel: the same bound, plus its own fp32 error (≤ 2⁻¹⁶ of max|o| here)
    {
      std::vector<double> pt, st_pt;
      run_per_token_f32(c, in, pt, st_pt);
      CHECK(diff(pt, ref).max <= 0x1.0p-16 * omax);
      const Diff pd = diff(out, pt);
      CHECK(pd.max <= max_abs(bound.out) + 0x1.0p-16 * omax);
      for (size_t i = 0; i < pt.size(); ++i) REQUIRE(std::fabs(out[i] - pt[i]) <= bound.out[i] + 0x1.0p-16 * omax);
      MESSAGE("  fp32 per-token kernel vs recurrence " << diff(pt, ref).max / omax << " of max|o|; chunked vs it "
                                                       << pd.max / omax);
    }

    // the scratch, line by line: γ bit-exact against the twin's scan in float; W and the chunk states against the
    // twin with roundings (the RMS statistic of the header)
    if (!c.split) {
      const int chunks = (c.S + kDeltaChunk - 1) / kDeltaChunk;
      const size_t P = size_t(chunks) * kDeltaChunk;
      std::vector<float> gam_f(static_cast<size_t>(kDeltaChunk)), gin(static_cast<size_t>(kDeltaChunk));
      bool gamma_exact = true;
      for (int h = 0; h < c.VH; ++h)
        for (int ch = 0; ch < chunks; ++ch) {
          const int c0 = ch * kDeltaChunk, n = std::min(kDeltaChunk, c.S - c0);
          for (int i = 0; i < n; ++i) gin[size_t(i)] = in.g[size_t(c0 + i) * c.VH + h];
          cpu::chunk_decay_scan<float>(gam_f.data(), gin.data(), n, kDeltaChunk);
          for (int i = 0; i < kDeltaChunk; ++i)
            gamma_exact = gamma_exact && view.gamma[size_t(h) * P + size_t(c0 + i)] == gam_f[size_t(i)];
        }
      CHECK(gamma_exact);
      // the chunk states of the first kLineTokens positions (each head's first chunks)
      const size_t per_chunk = size_t(c.dk) * c.dv, lead_chunks = size_t(std::min(chunks, kLineTokens / kDeltaChunk));
      std::vector<double> sc_gpu, sc_twin;
      for (int h = 0; h < c.VH; ++h) {
        const size_t at = size_t(h) * chunks * per_chunk, len = lead_chunks * per_chunk;
        sc_gpu.insert(sc_gpu.end(), view.states.begin() + at, view.states.begin() + at + len);
        sc_twin.insert(sc_twin.end(), trace_r.states.begin() + at, trace_r.states.begin() + at + len);
      }
      const Diff wd = diff(view.w, trace_r.w), sc = diff(sc_gpu, sc_twin);
      const double wrms = rms(trace_r.w), sc_rms = std::max(rms(sc_twin), 1e-30);
      MESSAGE("  scratch vs the twin with roundings: W rms " << wd.rms / wrms << " of rms(W), max "
                                                             << wd.max / max_abs(trace_r.w)
                                                             << " of max|W|; chunk states (first " << lead_chunks
                                                             << " chunks) rms " << sc.rms / sc_rms << " of their rms");
      CHECK(wd.rms <= kB / 4 * wrms);
      CHECK(sc.rms <= kB / 4 * sc_rms);
    }

    // the backend's bf16 entry runs the same kernels: the same bits, with the caller's scratch or its own
    for (const bool own : {false, true}) {
      if (!c.backend) break;
      std::vector<double> out_b, state_b;
      run_chunked(c, in, out_b, state_b, true, own);
      CHECK(out_b == out);
      CHECK(state_b == state);
    }
  }
  MESSAGE("emulated-GPU time of the chunked cases: "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() << " s");
}

TEST_CASE("cuda twin delta_chunked: a decode step (S = 1) runs the per-token kernel through the backend") {
  const Shape c{1, 1, 2, 64, 64, true, 0};
  const Inputs in(c, 5);
  CHECK(!delta_rule_chunked_takes(1, c.KH, c.VH, c.dk, c.dv));
  CHECK(gated_delta_rule_scratch_bytes<kernels::bf16>(1, c.KH, c.VH, c.dk, c.dv) == 0);
  CHECK(gated_delta_rule_scratch_bytes<kernels::bf16>(2, c.KH, c.VH, c.dk, c.dv) ==
        cuda::gated_delta_rule_chunked_scratch_bytes(2, c.VH, c.dk, c.dv));
  CHECK(gated_delta_rule_scratch_bytes<float>(8192, 1, 1, 128, 128) == 0);
  const size_t vn = size_t(c.VH) * c.dv;
  DevBuf<dbf16> dq(to_bf16(in.q)), dk(to_bf16(in.k)), dv(to_bf16(in.v)), o1{std::vector<dbf16>(vn)},
      o2{std::vector<dbf16>(vn)};
  DevBuf<float> dg(in.g), db(in.beta), s1(in.state), s2(in.state);
  dgpu().b16->gated_delta_rule_forward(dgpu().ex(), storage(o1.p()), storage(dq.p()), storage(dk.p()), storage(dv.p()),
                                       dg.p(), db.p(), s1.p(), 1, c.KH, c.VH, c.dk, c.dv, nullptr);
  cuda::launch_gated_delta_rule_per_token<dbf16>(dgpu().stream(), o2.p(), dq.p(), dk.p(), dv.p(), dg.p(), db.p(),
                                                 s2.p(), 1, c.KH, c.VH, c.dk, c.dv);
  CHECK(to_d(o1.get()) == to_d(o2.get()));
  CHECK(s1.get() == s2.get());
}

// The target's bf16 Gated DeltaNet layers at a shape the chunked kernels take (2 key / 4 value heads of dk = dv = 64):
// the scratch is a member of the DeltaNet bind list (lib/model/target_layers.cpp), so the first forward's arena peak is
// exactly the plan, model::target_activation_bytes, with no other allocation; against the CPU fp32 target within
// the bound test_cuda_target_model.cpp derives for its bf16 hybrid (1/8), in one forward and in cached pieces of
// 1 (a decode step: per token), 69 and 30 positions (chunked, continuing the device state).
TEST_CASE("cuda twin delta_chunked: the bf16 hybrid target runs it with the scratch its activation arena plans") {
  model::RandomTargetSpec spec = test::small_random_target(true, 2, 9);
  spec.linear_k_dim = spec.linear_v_dim = 64;
  spec.full_attention_interval = 2;  // layer 0 Gated DeltaNet, layer 1 full attention
  const std::string dir = test::scratch_dir("cuda_delta_chunked_target").string();
  model::write_random_target(dir, spec);
  comm::SelfTransport self_cpu, self_gpu;
  model::TargetModel cpu(dir, self_cpu);
  model::TargetOptions options;
  options.device = kernels::Device::cuda;
  options.precision = kernels::Precision::bf16;
  model::TargetModel gpu(dir, self_gpu, options);
  const model::QwenConfig& c = gpu.config();
  const model::TargetShard& shard = gpu.shard();
  const int S = 100, H = spec.hidden;
  REQUIRE(delta_rule_chunked_takes(S, shard.linear.group_count, shard.linear.member_count, c.linear_k_dim,
                                   c.linear_v_dim));
  std::vector<int32_t> tokens(static_cast<size_t>(S));
  Rng rng(17);
  for (auto& t : tokens) t = int32_t(rng.below(uint64_t(spec.vocab)));
  std::vector<float> fh_c(size_t(S) * H), fh_g(fh_c.size());
  cpu.forward(tokens.data(), S, {}, nullptr, fh_c.data());
  gpu.forward(tokens.data(), S, {}, nullptr, fh_g.data());
  const size_t planned = model::target_activation_bytes(c, shard, S, kernels::Precision::bf16, true);
  CHECK(gpu.stats().activation_bytes == planned);
  CHECK(gpu.stats().activation_peak_bytes == planned);
  // the DeltaNet list, array by array (bf16 activations, fp32 gates), ends with the rule's scratch
  const size_t s = size_t(S), nv = size_t(shard.linear.member_count), qkd = size_t(shard.linear.group_count) * 64,
               vd = nv * 64, C = 2 * qkd + vd;
  size_t listed = 0;
  for (size_t bytes : {2 * s * C, 2 * s * C, 2 * s * qkd, 2 * s * qkd, 2 * s * vd, 2 * s * vd, 2 * s * nv, 2 * s * nv,
                       4 * s * nv, 4 * s * nv, 2 * s * vd})
    listed += Arena::footprint(bytes);
  const size_t rule = gated_delta_rule_scratch_bytes<kernels::bf16>(S, shard.linear.group_count, int(nv), 64, 64);
  CHECK(rule == cuda::gated_delta_rule_chunked_scratch_bytes(S, int(nv), 64, 64));
  CHECK(model::gated_deltanet_scratch_bytes<kernels::bf16>(c, shard, S) == listed + Arena::footprint(rule));
  const double err = test::max_rel_diff(fh_g, fh_c);
  model::TargetCache cache_c, cache_g;
  std::vector<float> pieces_c(fh_c.size()), pieces_g(fh_c.size());
  int b = 0;
  for (int n : {1, 69, 30}) {
    cpu.forward_cached(&tokens[size_t(b)], n, cache_c, &pieces_c[size_t(b) * H]);
    gpu.forward_cached(&tokens[size_t(b)], n, cache_g, &pieces_g[size_t(b) * H]);
    b += n;
  }
  const double err_pieces = test::max_rel_diff(pieces_g, pieces_c);
  MESSAGE("bf16 hybrid target (chunked delta rule) vs CPU fp32: final hidden " << err << ", in cached pieces "
                                                                               << err_pieces << "; arena " << planned
                                                                               << " bytes, the rule's " << rule);
  CHECK(err < 1.0 / 8);
  CHECK(err > 0);  // bf16 really ran
  CHECK(err_pieces < 1.0 / 8);
}

TEST_CASE("cuda twin delta_chunked: q, k, v not 16-byte aligned take the plain loads, with the same bits") {
  const Shape c{70, 1, 2, 64, 64, true, 0};
  const Inputs in(c, 91);
  const size_t vn = size_t(c.S) * c.VH * c.dv;
  auto shifted = [](const std::vector<float>& x) {  // one bf16 in front: the data starts 2 bytes past the allocation
    std::vector<dbf16> y(x.size() + 1);
    for (size_t i = 0; i < x.size(); ++i) y[i + 1] = __float2bfloat16(x[i]);
    return y;
  };
  DevBuf<dbf16> dq(shifted(in.q)), dk(shifted(in.k)), dv(shifted(in.v)), dout{std::vector<dbf16>(vn)};
  DevBuf<float> dg(in.g), db(in.beta), dst(in.state);
  DevBuf<unsigned char> scratch{std::vector<unsigned char>(cuda::gated_delta_rule_chunked_scratch_bytes(c.S, c.VH, c.dk, c.dv))};
  cuda::launch_gated_delta_rule_chunked(dgpu().stream(), dout.p(), dq.p() + 1, dk.p() + 1, dv.p() + 1, dg.p(), db.p(),
                                        dst.p(), c.S, c.KH, c.VH, c.dk, c.dv, scratch.p());
  std::vector<double> aligned, st_aligned;
  run_chunked(c, in, aligned, st_aligned, false);
  CHECK(to_d(dout.get()) == aligned);
  CHECK(to_d(dst.get()) == st_aligned);
}

TEST_CASE("cuda twin delta_chunked: shapes the chunked kernels do not take are refused or go per token") {
  CHECK(!cuda::gated_delta_rule_chunked_supports(1, 1, 96, 64));
  CHECK(!cuda::gated_delta_rule_chunked_supports(1, 1, 256, 64));
  CHECK(!cuda::gated_delta_rule_chunked_supports(1, 1, 64, 80));
  CHECK(!cuda::gated_delta_rule_chunked_supports(2, 3, 64, 64));
  CHECK(cuda::gated_delta_rule_chunked_supports(2, 6, 128, 128));
  // every kernel fits sm_120's 99 KiB of opt-in shared memory (the state pass in 2 stages), and sm_90's 227 KiB
  for (const int dk : {64, 128}) {
    const cuda::ChunkedSmem s = cuda::gated_delta_rule_chunked_smem(dk);
    CHECK(std::max({s.prepare, s.state2, s.output}) <= size_t(99) * 1024);
    CHECK(s.state3 <= size_t(227) * 1024);
  }
  std::vector<dbf16> none(1);
  DevBuf<dbf16> d(none);
  DevBuf<float> f(std::vector<float>(1));
  DevBuf<unsigned char> scratch{std::vector<unsigned char>(1024)};
  CHECK_THROWS_AS(cuda::launch_gated_delta_rule_chunked(dgpu().stream(), d.p(), d.p(), d.p(), d.p(), f.p(), f.p(),
                                                        nullptr, 1, 1, 1, 96, 64, scratch.p()),
                  dflash::Error);
  // no scratch, or a misaligned one: a message naming the bytes, not a fault
  try {
    cuda::launch_gated_delta_rule_chunked(dgpu().stream(), d.p(), d.p(), d.p(), d.p(), f.p(), f.p(), nullptr, 2, 1, 1,
                                          64, 64, nullptr);
    FAIL("no scratch was accepted");
  } catch (const dflash::Error& e) {
    CHECK(std::string(e.what()).find("scratch") != std::string::npos);
  }
  CHECK_THROWS_AS(cuda::launch_gated_delta_rule_chunked(dgpu().stream(), d.p(), d.p(), d.p(), d.p(), f.p(), f.p(),
                                                        nullptr, 2, 1, 1, 64, 64, scratch.p() + 8),
                  dflash::Error);
}

#endif
