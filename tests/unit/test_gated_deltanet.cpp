// gated_deltanet: the chunked gated delta rule against the per-token recurrence (double and float), across chunk
// edges and with a carried state; the conv, L2 norm, gated RMSNorm, partial RoPE and decode attention against
// straight formulas.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_causal.h"
#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/gated_deltanet.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/rope_partial.h"
#include "lib/core/rng.h"
#include "tests/unit/test_util.h"

using namespace dflash;

namespace {

template <typename T>
std::vector<T> normal(size_t n, Rng& rng, double scale = 1.0) {
  std::vector<T> x(n);
  for (auto& v : x) v = T(scale * rng.normal());
  return x;
}

struct DeltaCase {
  int S, k_heads, v_heads, dk, dv, chunk;
};

// q, k unit-norm rows (q also scaled), g ∈ [−2, 0), beta ∈ (0, 1): the inputs the layer feeds the rule
template <typename T>
struct DeltaInputs {
  std::vector<T> q, k, v, g, beta;
  DeltaInputs(const DeltaCase& c, uint64_t seed) {
    Rng rng(seed);
    q = normal<T>(size_t(c.S) * c.k_heads * c.dk, rng);
    k = normal<T>(q.size(), rng);
    v = normal<T>(size_t(c.S) * c.v_heads * c.dv, rng);
    cpu::l2norm_forward<T>(q.data(), c.S * c.k_heads, c.dk, T(1e-6), T(1) / std::sqrt(T(c.dk)));
    cpu::l2norm_forward<T>(k.data(), c.S * c.k_heads, c.dk, T(1e-6), T(1));
    g.resize(size_t(c.S) * c.v_heads);
    beta.resize(g.size());
    for (auto& x : g) x = T(-2.0 * rng.uniform());
    for (auto& x : beta) x = T(1.0 / (1.0 + std::exp(-rng.normal())));
  }
};

}  // namespace

TEST_CASE("gated_deltanet: chunked delta rule equals the per-token recurrence (double, several chunk edges)") {
  for (DeltaCase c : {DeltaCase{1, 1, 1, 4, 3, 64}, DeltaCase{30, 2, 6, 16, 12, 64}, DeltaCase{150, 2, 6, 8, 5, 64},
                      DeltaCase{64, 1, 3, 8, 8, 64}, DeltaCase{65, 3, 3, 6, 4, 16}, DeltaCase{37, 2, 4, 5, 7, 7}}) {
    CAPTURE(c.S);
    CAPTURE(c.chunk);
    DeltaInputs<double> in(c, uint64_t(c.S * 7 + c.chunk));
    std::vector<double> out(size_t(c.S) * c.v_heads * c.dv), ref(out.size());
    // a carried non-zero state checks the M₀ terms
    Rng rng(5);
    std::vector<double> state = normal<double>(size_t(c.v_heads) * c.dk * c.dv, rng, 0.3), state_ref = state;
    cpu::gated_delta_rule_forward<double>(out.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                          in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv, c.chunk,
                                          state.data());
    cpu::gated_delta_rule_reference<double>(ref.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                            in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv, state_ref.data());
    CHECK(test::max_rel_diff(out, ref) < 1e-12);
    CHECK(test::max_rel_diff(state, state_ref) < 1e-12);
    // splitting the sequence in two with the state carried gives the same outputs
    const int half = c.S / 2;
    if (half > 0) {
      std::vector<double> s2(state.size(), 0.0), o2(out.size()), o_full(out.size());
      cpu::gated_delta_rule_forward<double>(o_full.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                            in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv, c.chunk);
      cpu::gated_delta_rule_forward<double>(o2.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                            in.beta.data(), half, c.k_heads, c.v_heads, c.dk, c.dv, c.chunk,
                                            s2.data());
      const size_t qo = size_t(half) * c.k_heads * c.dk, vo = size_t(half) * c.v_heads * c.dv,
                   go = size_t(half) * c.v_heads;
      cpu::gated_delta_rule_forward<double>(o2.data() + vo, in.q.data() + qo, in.k.data() + qo, in.v.data() + vo,
                                            in.g.data() + go, in.beta.data() + go, c.S - half, c.k_heads, c.v_heads,
                                            c.dk, c.dv, c.chunk, s2.data());
      CHECK(test::max_rel_diff(o2, o_full) < 1e-12);
    }
  }
}

TEST_CASE("gated_deltanet: float chunked delta rule within 1e-5 of the double recurrence") {
  const DeltaCase c{150, 2, 6, 16, 12, 64};
  DeltaInputs<double> in(c, 3);
  auto f = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  std::vector<float> out(size_t(c.S) * c.v_heads * c.dv);
  std::vector<double> ref(out.size());
  cpu::gated_delta_rule_forward<float>(out.data(), f(in.q).data(), f(in.k).data(), f(in.v).data(), f(in.g).data(),
                                       f(in.beta).data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv, c.chunk);
  cpu::gated_delta_rule_reference<double>(ref.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                          in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv);
  CHECK(test::max_rel_diff(out, ref) < 1e-5);
}

TEST_CASE("gated_deltanet: value heads read their own key head (v_heads / k_heads consecutive heads each)") {
  // key head 1 zero → value heads 2, 3 (of 4, 2 key heads) output zero; heads 0, 1 do not
  const DeltaCase c{5, 2, 4, 3, 2, 64};
  DeltaInputs<double> in(c, 9);
  for (int t = 0; t < c.S; ++t)
    for (int d = 0; d < c.dk; ++d) in.k[(size_t(t) * 2 + 1) * c.dk + d] = 0;
  std::vector<double> out(size_t(c.S) * c.v_heads * c.dv);
  cpu::gated_delta_rule_forward<double>(out.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                        in.beta.data(), c.S, c.k_heads, c.v_heads, c.dk, c.dv, c.chunk);
  double lo = 0, hi = 0;
  for (int t = 0; t < c.S; ++t)
    for (int h = 0; h < 4; ++h)
      for (int d = 0; d < c.dv; ++d) (h < 2 ? lo : hi) += std::fabs(out[(size_t(t) * 4 + h) * c.dv + d]);
  CHECK(lo > 0.1);
  CHECK(hi == 0.0);
}

TEST_CASE("gated_deltanet: causal conv1d + SiLU, L2 norm, gated RMSNorm against their formulas") {
  Rng rng(2);
  const int S = 7, C = 5, K = 4;
  auto x = normal<double>(size_t(S) * C, rng), w = normal<double>(size_t(C) * K, rng);
  std::vector<double> y(x.size());
  cpu::causal_conv1d_silu_forward<double>(y.data(), x.data(), w.data(), S, C, K);
  auto silu = [](double a) { return a / (1 + std::exp(-a)); };
  // position 0 sees only its own input through the last tap; position 5 sees positions 2..5
  CHECK(y[0 * C + 3] == doctest::Approx(silu(w[3 * K + 3] * x[0 * C + 3])).epsilon(1e-14));
  double acc = 0;
  for (int j = 0; j < K; ++j) acc += w[2 * K + j] * x[size_t(5 - 3 + j) * C + 2];
  CHECK(y[5 * C + 2] == doctest::Approx(silu(acc)).epsilon(1e-14));

  std::vector<double> v = {3, 4};
  cpu::l2norm_forward<double>(v.data(), 1, 2, 0.0, 2.0);
  CHECK(v[0] == doctest::Approx(1.2));
  CHECK(v[1] == doctest::Approx(1.6));

  std::vector<double> a = {1, -2, 2}, z = {0.5, -1, 3}, wn = {1.5, 0.5, -1}, out(3);
  cpu::gated_rmsnorm_forward<double>(out.data(), a.data(), z.data(), wn.data(), 1, 3, 0.0);
  const double rstd = 1 / std::sqrt(3.0);  // mean(x²) = 3
  for (int i = 0; i < 3; ++i) CHECK(out[size_t(i)] == doctest::Approx(wn[size_t(i)] * a[size_t(i)] * rstd * silu(z[size_t(i)])));
}

TEST_CASE("rope_partial: full rotary equals rope_forward, partial rotates only the first dims") {
  Rng rng(4);
  const int rows = 9, heads = 3, hd = 16;
  std::vector<int> pos(rows);
  for (int r = 0; r < rows; ++r) pos[size_t(r)] = 3 * r + 1;
  auto x = normal<double>(size_t(rows) * heads * hd, rng);
  std::vector<double> full(x.size()), part = x;
  cpu::rope_forward<double>(full.data(), x.data(), pos.data(), rows, heads, hd, 1e4);
  cpu::rope_partial_forward<double>(part.data(), pos.data(), rows, heads, hd, hd, 1e4);
  CHECK(test::max_rel_diff(part, full) < 1e-14);
  // rot_dim 4: dims 4.. unchanged; dims 0..3 equal plain RoPE over a head_dim of 4
  part = x;
  cpu::rope_partial_forward<double>(part.data(), pos.data(), rows, heads, hd, 4, 1e4);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h) {
      const size_t b = (size_t(r) * heads + h) * hd;
      for (int d = 4; d < hd; ++d) CHECK(part[b + size_t(d)] == x[b + size_t(d)]);
      std::vector<double> small(x.begin() + long(b), x.begin() + long(b) + 4), rot(4);
      cpu::rope_forward<double>(rot.data(), small.data(), &pos[size_t(r)], 1, 1, 4, 1e4);
      for (int d = 0; d < 4; ++d) CHECK(part[b + size_t(d)] == doctest::Approx(rot[size_t(d)]).epsilon(1e-14));
    }
}

TEST_CASE("attention_decode: rows continuing a sequence equal those rows of full causal attention") {
  Rng rng(8);
  const int S = 23, qh = 6, kvh = 2, hd = 8;
  auto q = normal<double>(size_t(S) * qh * hd, rng), k = normal<double>(size_t(S) * kvh * hd, rng),
       v = normal<double>(k.size(), rng);
  std::vector<double> full(q.size());
  cpu::attention_causal_reference<double>(full.data(), q.data(), k.data(), v.data(), S, qh, kvh, hd);
  for (int past : {0, 1, 15, 20}) {
    const int n = S - past;
    std::vector<double> out(size_t(n) * qh * hd);
    cpu::attention_decode_forward<double>(out.data(), q.data() + size_t(past) * qh * hd, k.data(), v.data(), n, past,
                                          qh, kvh, hd);
    std::vector<double> want(full.begin() + long(size_t(past) * qh * hd), full.end());
    CHECK(test::max_rel_diff(out, want) < 1e-13);
  }
}
