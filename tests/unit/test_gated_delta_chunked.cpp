// gated_delta_chunked: the WY / UT chunked form (kernels/cpu/gated_delta_chunked.h, the CPU twin of the CUDA
// chunked kernel) against the per-token recurrence cpu::gated_delta_rule_reference: in double to 1e-10 (measured
// ~1e-15) at S = 1, S < 64, S = 64, S not a multiple of 64, GQA, a carried initial state and the final state, dk = dv
// = 64 / 128; in float within 1e-5 of the double recurrence (measured 5e-7 .. 1e-6, printed by the test).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

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
