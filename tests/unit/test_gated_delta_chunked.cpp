// gated_delta_chunked: the WY / UT chunked form (kernels/cpu/gated_delta_chunked.h, the CPU twin of the CUDA
// chunked kernel) against the per-token recurrence cpu::gated_delta_rule_reference: in double to 1e-10 (measured
// ~1e-15) at S = 1, S < 64, S = 64, S not a multiple of 64, GQA, a carried initial state and the final state, dk = dv
// = 64 / 128; in float within 1e-5 of the double recurrence (measured 5e-7 .. 1e-6, printed by the test). The
// decays' scan in the kernel's warp order; the twin with the kernel's bf16 roundings (a few kB from the recurrence,
// never exact) and its trace of the kernel's scratch (γ with its padding, W, the chunks' start states).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/cpu/gated_delta_chunked.h"
#include "kernels/cpu/gated_deltanet.h"
#include "lib/core/rng.h"
#include "tests/unit/test_util.h"

using namespace dflash;

namespace {

struct ChunkedCase {
  int S, k_heads, v_heads, dk, dv, chunk;
};

// q, k unit-norm rows (q also scaled by 1/sqrt(dk)), g ∈ [−2, 0) (some near 0: slow decay), β ∈ (0, 1), a state
template <typename T>
struct ChunkedInputs {
  std::vector<T> q, k, v, g, beta, state;
  ChunkedInputs(const ChunkedCase& c, uint64_t seed) {
    Rng rng(seed);
    auto normal = [&](size_t n, double sd) {
      std::vector<T> x(n);
      for (auto& e : x) e = T(sd * rng.normal());
      return x;
    };
    q = normal(size_t(c.S) * c.k_heads * c.dk, 1.0);
    k = normal(q.size(), 1.0);
    v = normal(size_t(c.S) * c.v_heads * c.dv, 1.0);
    cpu::l2norm_forward<T>(q.data(), c.S * c.k_heads, c.dk, T(1e-6), T(1) / std::sqrt(T(c.dk)));
    cpu::l2norm_forward<T>(k.data(), c.S * c.k_heads, c.dk, T(1e-6), T(1));
    g.resize(size_t(c.S) * c.v_heads);
    beta.resize(g.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = T(i % 5 == 0 ? -0.01 * rng.uniform() : -2.0 * rng.uniform());
    for (auto& x : beta) x = T(1.0 / (1.0 + std::exp(-rng.normal())));
    state = normal(size_t(c.v_heads) * c.dk * c.dv, 0.3);
  }
};

}  // namespace

TEST_CASE("gated_delta_chunked: UT form equals the per-token recurrence in double (partial chunks, GQA, state)") {
  for (ChunkedCase c : {ChunkedCase{1, 1, 1, 4, 3, 64}, ChunkedCase{30, 2, 6, 16, 12, 64},
                        ChunkedCase{64, 1, 3, 8, 8, 64}, ChunkedCase{150, 2, 6, 8, 5, 64},
                        ChunkedCase{65, 3, 3, 6, 4, 16}, ChunkedCase{37, 2, 4, 5, 7, 7},
                        ChunkedCase{100, 1, 2, 64, 64, 64}, ChunkedCase{70, 1, 1, 128, 128, 64}}) {
    CAPTURE(c.S);
    CAPTURE(c.dk);
    CAPTURE(c.chunk);
    ChunkedInputs<double> in(c, uint64_t(c.S * 13 + c.dk));
    for (bool with_state : {false, true}) {
      CAPTURE(with_state);
      std::vector<double> out(size_t(c.S) * c.v_heads * c.dv), ref(out.size());
      std::vector<double> st = in.state, st_ref = in.state;
      cpu::gated_delta_rule_chunked_ut<double>(out.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                               in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv, c.chunk,
                                               with_state ? st.data() : nullptr);
      cpu::gated_delta_rule_reference<double>(ref.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                              in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv,
                                              with_state ? st_ref.data() : nullptr);
      const double eo = test::max_rel_diff(out, ref), es = test::max_rel_diff(st, st_ref);
      MESSAGE("double UT vs recurrence S=" << c.S << " dk=" << c.dk << " state=" << with_state << ": out " << eo
                                           << ", state " << es);
      CHECK(eo < 1e-10);
      CHECK(es < 1e-10);
    }
  }
}

TEST_CASE("gated_delta_chunked: the state carried over calls equals one call (double)") {
  const ChunkedCase c{150, 2, 4, 16, 8, 64};
  ChunkedInputs<double> in(c, 21);
  std::vector<double> full(size_t(c.S) * c.v_heads * c.dv), parts(full.size());
  std::vector<double> st_full = in.state, st_parts = in.state;
  cpu::gated_delta_rule_chunked_ut<double>(full.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                           in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv, c.chunk,
                                           st_full.data());
  int t0 = 0;
  for (int len : {1, 70, 0, 64, 15}) {  // 150 positions in calls of 1, 70, 0, 64 and 15
    const size_t qo = size_t(t0) * c.k_heads * c.dk, vo = size_t(t0) * c.v_heads * c.dv,
                 go = size_t(t0) * c.v_heads;
    cpu::gated_delta_rule_chunked_ut<double>(parts.data() + vo, in.q.data() + qo, in.k.data() + qo,
                                             in.v.data() + vo, in.g.data() + go, in.beta.data() + go, len,
                                             c.k_heads, c.v_heads, c.dk, c.dv, c.chunk, st_parts.data());
    t0 += len;
  }
  REQUIRE(t0 == c.S);
  CHECK(test::max_rel_diff(parts, full) < 1e-10);
  CHECK(test::max_rel_diff(st_parts, st_full) < 1e-10);
}

TEST_CASE("gated_delta_chunked: float UT form within 1e-5 of the double recurrence") {
  for (ChunkedCase c : {ChunkedCase{150, 2, 6, 16, 12, 64}, ChunkedCase{130, 1, 2, 64, 64, 64},
                        ChunkedCase{70, 1, 1, 128, 128, 64}}) {
    CAPTURE(c.S);
    CAPTURE(c.dk);
    ChunkedInputs<double> in(c, uint64_t(c.S + 3));
    auto f = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
    std::vector<float> out(size_t(c.S) * c.v_heads * c.dv), st = f(in.state);
    std::vector<double> ref(out.size()), st_ref = in.state;
    cpu::gated_delta_rule_chunked_ut<float>(out.data(), f(in.q).data(), f(in.k).data(), f(in.v).data(),
                                            f(in.g).data(), f(in.beta).data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv,
                                            c.chunk, st.data());
    cpu::gated_delta_rule_reference<double>(ref.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                            in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv, st_ref.data());
    const double eo = test::max_rel_diff(out, ref), es = test::max_rel_diff(st, st_ref);
    MESSAGE("float UT vs double recurrence S=" << c.S << " dk=" << c.dk << ": out " << eo << ", state " << es);
    CHECK(eo < 1e-5);
    CHECK(es < 1e-5);
  }
}

TEST_CASE("gated_delta_chunked: the decays' scan in the kernel's warp order (runs of 32, then the run before)") {
  Rng rng(8);
  for (int n : {1, 31, 32, 33, 64}) {
    CAPTURE(n);
    std::vector<double> g(64), gam(64);
    std::vector<float> gf(64), gamf(64);
    for (int i = 0; i < 64; ++i) gf[size_t(i)] = float(g[size_t(i)] = -2.0 * rng.uniform());
    cpu::chunk_decay_scan<double>(gam.data(), g.data(), n, 64);
    cpu::chunk_decay_scan<float>(gamf.data(), gf.data(), n, 64);
    double acc = 0, sum_abs = 0;
    for (int i = 0; i < 64; ++i) {
      if (i < n) acc += g[size_t(i)], sum_abs += std::fabs(g[size_t(i)]);
      CHECK(gam[size_t(i)] == doctest::Approx(acc).epsilon(1e-14));  // positions past n: γ_{n−1}
      CHECK(std::fabs(double(gamf[size_t(i)]) - acc) <= 7 * 0x1.0p-24 * sum_abs);  // depth 6 + the run before
    }
  }
  // the order itself: with g = 1, 2⁻²⁴, 2⁻²⁴, 2⁻²⁴ in float, in sequence every 1 + 2⁻²⁴ is a tie rounded to 1;
  // the tree forms 2⁻²⁴ + 2⁻²⁴ first (offset 1) and then 1 + 2⁻²³ (offset 2), which is a float
  std::vector<float> g = {1.0f, 0x1.0p-24f, 0x1.0p-24f, 0x1.0p-24f}, gam(4);
  cpu::chunk_decay_scan<float>(gam.data(), g.data(), 4, 4);
  CHECK(gam[1] == 1.0f);
  CHECK(gam[2] == 1.0f + 0x1.0p-23f);
  CHECK(gam[3] == 1.0f + 0x1.0p-23f);
}

TEST_CASE("gated_delta_chunked: with the kernel's bf16 roundings, a few bf16 steps from the recurrence, and the trace") {
  const ChunkedCase c{150, 2, 4, 64, 64, 64};
  ChunkedInputs<double> in(c, 31);
  std::vector<double> exact(size_t(c.S) * c.v_heads * c.dv), rounded(exact.size());
  std::vector<double> st_exact = in.state, st_rounded = in.state;
  cpu::ChunkedTrace<double> trace;
  cpu::gated_delta_rule_chunked_ut<double>(exact.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                           in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv, 64, st_exact.data());
  cpu::gated_delta_rule_chunked_ut<double>(rounded.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                           in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv, 64,
                                           st_rounded.data(), true, &trace);
  const double kB = 0x1.0p-8, eo = test::max_rel_diff(rounded, exact), es = test::max_rel_diff(st_rounded, st_exact);
  MESSAGE("twin with bf16 roundings vs exact: out " << eo / kB << " kB of max|o|, state " << es / kB << " kB");
  CHECK(eo > 0.1 * kB);  // it rounds
  CHECK(eo < 8 * kB);
  CHECK(es < 8 * kB);
  // every output is a bf16 value
  for (double o : rounded) REQUIRE(double(float(kernels::bf16(float(o)))) == o);
  // the trace: 3 chunks × 64 rows a head; γ padded with γ_{n−1} (up to rounding); W's padding zero; chunk 0's state the bf16 of the
  // initial one
  REQUIRE(trace.gamma.size() == size_t(c.v_heads) * 192);
  REQUIRE(trace.w.size() == size_t(c.v_heads) * 192 * c.dk);
  REQUIRE(trace.states.size() == size_t(c.v_heads) * 3 * c.dk * c.dv);
  for (int h = 0; h < c.v_heads; ++h) {
    const double* gh = &trace.gamma[size_t(h) * 192];
    for (int i = 150; i < 192; ++i) CHECK(gh[i] == doctest::Approx(gh[149]).epsilon(1e-13));
    for (size_t e = (size_t(h) * 192 + 150) * c.dk; e < (size_t(h) * 192 + 192) * c.dk; ++e) REQUIRE(trace.w[e] == 0.0);
    for (size_t e = 0; e < size_t(c.dk) * c.dv; ++e) {
      const double s0 = in.state[size_t(h) * c.dk * c.dv + e];
      REQUIRE(trace.states[size_t(h) * 3 * c.dk * c.dv + e] == double(float(kernels::bf16(float(s0)))));
    }
  }
}
