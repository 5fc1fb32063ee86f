// The chunked vocab loss (lib/model/vocab_loss) against the plain long-double reference that materialises every
// logit, against finite differences, across modes and chunk sizes, and at the numerical edges.
// dX is compared normwise: max |dX − ref| / max |ref| (elements near 0 would make per-element ratios meaningless).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fd_check.h"
#include "kernels/math/dpace.h"
#include "kernels/math/loss_exp.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/model/vocab_loss.h"

using namespace dflash;
using namespace dflash::test;
using Vec = std::vector<double>;

namespace {

// A micro-batch as the trainer lays it out: n_blocks blocks × (B−1) rows, k = 1..B−1, contiguous.
struct Problem {
  int R = 0, H = 0, V = 0, B = 0;
  Vec X, Y, W, w;  // [R, H], [R, H], [V, H], [R]
  std::vector<int32_t> labels, kpos, bid;
};

Problem make_problem(int n_blocks, int B, int H, int V, uint64_t seed, double logit_std = 3.0) {
  Problem p;
  p.R = n_blocks * (B - 1);
  p.H = H;
  p.V = V;
  p.B = B;
  p.X = random_vector(size_t(p.R) * H, seed + 1);
  p.W = random_vector(size_t(V) * H, seed + 2, logit_std / std::sqrt(double(H)));
  p.Y = p.X;
  Vec noise = random_vector(p.Y.size(), seed + 3, 0.7);
  for (size_t i = 0; i < p.Y.size(); ++i) p.Y[i] += noise[i];
  Rng rng(seed, 11);
  for (int b = 0; b < n_blocks; ++b) {
    for (int k = 1; k < B; ++k) {
      const int r = int(p.labels.size());
      // label = the drafter's argmax most of the time, so accepted lengths and accuracies are not trivial
      int m = 0;
      double best = -1e300;
      for (int v = 0; v < V; ++v) {
        double s = 0;
        for (int h = 0; h < H; ++h) s += p.X[size_t(r) * H + h] * p.W[size_t(v) * H + h];
        if (s > best) best = s, m = v;
      }
      p.labels.push_back(rng.uniform() < 0.75 ? m : int(rng.below(uint64_t(V))));
      p.kpos.push_back(k);
      p.bid.push_back(100 + 3 * b);  // any ids
      const bool masked = (b == 1) || rng.uniform() < 0.1;  // block 1 fully masked, others partly
      p.w.push_back(masked ? 0.0 : std::exp(-(k - 1) / 4.0));
    }
  }
  return p;
}

template <typename T>
struct Cast {
  std::vector<T> X, Y, W, w;
  model::VocabLossBatch<T> batch;
  Cast(const Problem& p, bool with_target) {
    X.assign(p.X.begin(), p.X.end());
    Y.assign(p.Y.begin(), p.Y.end());
    W.assign(p.W.begin(), p.W.end());
    w.assign(p.w.begin(), p.w.end());
    batch.rows = p.R;
    batch.hidden = X.data();
    batch.target_hidden = with_target ? Y.data() : nullptr;
    batch.labels = p.labels.data();
    batch.weights = w.data();
    batch.block_pos = p.kpos.data();
    batch.block_id = p.bid.data();
  }
};

model::VocabLossSettings full_settings(int B, double tau) {
  model::VocabLossSettings s;
  s.ce_weight = 1.0;
  s.kl_weight = 0.7;
  s.kl_temperature = tau;
  s.cap_weight = 0.3;
  s.top_k = 3;
  s.block_size = B;
  return s;
}

template <typename T>
struct Run {
  model::VocabLossResult out;
  std::vector<T> dX;
};

// forward + backward, with dX first filled with NaN to prove that it is written (=), not accumulated.
template <typename T>
Run<T> run_loss(const model::VocabLossSettings& s, const Cast<T>& c, const Problem& p, double grad_scale) {
  model::VocabLoss<T> loss(s, c.W.data(), p.V, p.H);
  model::VocabLossContext ctx;
  Run<T> run;
  run.dX.assign(size_t(p.R) * p.H, std::numeric_limits<T>::quiet_NaN());
  run.out = loss.forward(c.batch, ctx, grad_scale, run.dX.data());
  loss.backward(c.batch, ctx, grad_scale, run.dX.data());
  return run;
}

Run<double> run_reference(const model::VocabLossSettings& s, const Cast<double>& c, const Problem& p, double grad_scale) {
  Run<double> run;
  run.dX.assign(size_t(p.R) * p.H, 0.0);
  run.out = model::vocab_loss_reference(s, c.batch, c.W.data(), p.V, p.H, grad_scale, run.dX.data());
  return run;
}

double rel(double a, double b) { return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-300}); }

template <typename T>
double dx_err(const std::vector<T>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - ref[i]));
    den = std::max(den, std::abs(ref[i]));
  }
  return den > 0 ? num / den : num;
}

void check_sums(const model::VocabLossSums& a, const model::VocabLossSums& ref, double tol) {
  INFO("loss " << a.loss << " vs " << ref.loss << ", ce " << a.ce << " vs " << ref.ce << ", kl " << a.kl << " vs "
               << ref.kl << ", cap " << a.cap << " vs " << ref.cap << ", w " << a.weight << " vs " << ref.weight);
  CHECK(rel(a.loss, ref.loss) <= tol);
  CHECK(rel(a.ce, ref.ce) <= tol);
  CHECK(rel(a.kl, ref.kl) <= tol);
  CHECK(rel(a.cap, ref.cap) <= tol);
  CHECK(rel(a.weight, ref.weight) <= tol);
}

void check_metrics(const model::VocabLossMetrics& a, const model::VocabLossMetrics& ref) {
  CHECK(a.correct == ref.correct);
  CHECK(a.scored == ref.scored);
  CHECK(a.topk_hits == ref.topk_hits);
  CHECK(a.accepted_sum == ref.accepted_sum);
  CHECK(a.blocks == ref.blocks);
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}
bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

}  // namespace

TEST_CASE("vocab_loss: double matches the long-double reference (loss, components, metrics, dX) in every mode and "
          "chunk size") {
  for (double tau : {1.0, 2.0}) {
    const Problem p = make_problem(6, 6, 16, 50, 7 + uint64_t(tau));
    Cast<double> c(p, true);
    const auto s0 = full_settings(p.B, tau);
    const double grad_scale = 1.0 / 3.7;
    const auto ref = run_reference(s0, c, p, grad_scale);
    // the problem is not degenerate: several blocks, some accepted lengths > 1, some CAP rows, masked rows
    CHECK(ref.out.metrics.blocks == 5);
    CHECK(ref.out.metrics.accepted_sum > ref.out.metrics.blocks);
    CHECK(ref.out.sums.cap > 0);
    CHECK(ref.out.sums.kl > 0);
    for (auto mode : {model::VocabLossMode::recompute, model::VocabLossMode::fused}) {
      for (int chunk : {1, 7, p.R, p.R + 5}) {
        auto s = s0;
        s.mode = mode;
        s.chunk_size = chunk;
        CAPTURE(tau);
        CAPTURE(chunk);
        CAPTURE(int(mode));
        const auto got = run_loss(s, c, p, grad_scale);
        check_sums(got.out.sums, ref.out.sums, 1e-9);
        check_metrics(got.out.metrics, ref.out.metrics);
        CHECK(dx_err(got.dX, ref.dX) <= 1e-9);
      }
    }
  }
}

TEST_CASE("vocab_loss: float matches the double reference within 1e-4") {
  const Problem p = make_problem(5, 8, 32, 200, 21);
  Cast<double> cd(p, true);
  Cast<float> cf(p, true);
  const auto s0 = full_settings(p.B, 1.5);
  const auto ref = run_reference(s0, cd, p, 0.01);
  for (auto mode : {model::VocabLossMode::recompute, model::VocabLossMode::fused}) {
    for (int chunk : {1, 7, p.R, p.R + 5}) {
      auto s = s0;
      s.mode = mode;
      s.chunk_size = chunk;
      CAPTURE(chunk);
      CAPTURE(int(mode));
      const auto got = run_loss(s, cf, p, 0.01);
      check_sums(got.out.sums, ref.out.sums, 1e-4);
      check_metrics(got.out.metrics, ref.out.metrics);  // no near-ties in this problem
      CHECK(dx_err(got.dX, ref.dX) <= 1e-4);
    }
  }
}

TEST_CASE("vocab_loss: dX matches central finite differences of the loss (double)") {
  for (double tau : {1.0, 2.5}) {
    Problem p = make_problem(3, 5, 8, 30, 33);
    Cast<double> c(p, true);
    auto s = full_settings(p.B, tau);
    s.chunk_size = 5;
    model::VocabLoss<double> loss(s, c.W.data(), p.V, p.H);
    model::VocabLossContext ctx;
    Vec dX(size_t(p.R) * p.H);
    loss.forward(c.batch, ctx, 1.0, nullptr);
    loss.backward(c.batch, ctx, 1.0, dX.data());
    Vec x = c.X;
    auto f = [&] {
      auto b = c.batch;
      b.hidden = x.data();
      model::VocabLossContext scratch_ctx;
      return loss.forward(b, scratch_ctx, 1.0, nullptr).sums.loss;
    };
    const auto r = fd_check(x, dX, f);
    INFO(describe(r));
    CHECK(r.max_rel_err <= 1e-6);
  }
}

TEST_CASE("vocab_loss: recompute and fused give the same float dX, chunk sizes give the same results") {
  const Problem p = make_problem(7, 9, 24, 120, 45);
  Cast<float> c(p, true);
  auto s = full_settings(p.B, 1.0);
  s.mode = model::VocabLossMode::recompute;
  s.chunk_size = 7;
  const auto base = run_loss(s, c, p, 0.05);
  std::vector<double> base_dx(base.dX.begin(), base.dX.end());
  for (auto mode : {model::VocabLossMode::recompute, model::VocabLossMode::fused}) {
    for (int chunk : {1, 7, p.R, p.R + 5}) {
      s.mode = mode;
      s.chunk_size = chunk;
      CAPTURE(chunk);
      CAPTURE(int(mode));
      const auto got = run_loss(s, c, p, 0.05);
      CHECK(dx_err(got.dX, base_dx) <= 1e-6);
      check_sums(got.out.sums, base.out.sums, 1e-6);
      check_metrics(got.out.metrics, base.out.metrics);
    }
  }
}

TEST_CASE("vocab_loss: runs are bit-identical and grad_scale enters linearly (fused backward rescales)") {
  const Problem p = make_problem(4, 6, 16, 64, 51);
  Cast<float> c(p, true);
  auto s = full_settings(p.B, 1.0);
  s.chunk_size = 6;
  for (auto mode : {model::VocabLossMode::recompute, model::VocabLossMode::fused}) {
    s.mode = mode;
    const auto a = run_loss(s, c, p, 0.25);
    const auto b = run_loss(s, c, p, 0.25);
    CHECK(a.out.sums.loss == b.out.sums.loss);
    CHECK(a.dX == b.dX);
    const auto d = run_loss(s, c, p, 0.5);
    CHECK(dx_err(d.dX, std::vector<double>(a.dX.begin(), a.dX.end())) == doctest::Approx(1.0).epsilon(1e-6));
  }
  // fused: forward with one scale, backward with another rescales dX
  s.mode = model::VocabLossMode::fused;
  model::VocabLoss<float> loss(s, c.W.data(), p.V, p.H);
  model::VocabLossContext ctx;
  std::vector<float> dX(size_t(p.R) * p.H);
  loss.forward(c.batch, ctx, 0.25, dX.data());
  loss.backward(c.batch, ctx, 0.75, dX.data());
  const auto ref = run_loss(s, c, p, 0.75);
  CHECK(dx_err(dX, std::vector<double>(ref.dX.begin(), ref.dX.end())) <= 1e-6);
}

TEST_CASE("vocab_loss: all weights zero gives loss 0, dX 0, no NaN") {
  Problem p = make_problem(3, 6, 16, 40, 61);
  std::fill(p.w.begin(), p.w.end(), 0.0);
  for (auto mode : {model::VocabLossMode::recompute, model::VocabLossMode::fused}) {
    auto s = full_settings(p.B, 2.0);
    s.mode = mode;
    s.chunk_size = 4;
    Cast<float> c(p, true);
    const auto got = run_loss(s, c, p, 0.0);  // Σw = 0: the caller passes grad_scale 0
    CHECK(got.out.sums.loss == 0);
    CHECK(got.out.sums.weight == 0);
    CHECK(got.out.sums.ce == 0);
    CHECK(got.out.metrics.blocks == 0);
    CHECK(got.out.metrics.topk_hits == 0);
    CHECK(std::all_of(got.dX.begin(), got.dX.end(), [](float v) { return v == 0.0f; }));
  }
}

TEST_CASE("vocab_loss: logits at ±1e4 give finite results that match the reference") {
  // logit std ~1e4: softmaxes are one-hot to machine precision, CAP and CE are ~1e4, gradients are 0/±1.
  const Problem p = make_problem(3, 5, 16, 40, 71, 1e4);
  Cast<double> cd(p, true);
  auto s = full_settings(p.B, 1.0);
  s.chunk_size = 5;
  const auto ref = run_reference(s, cd, p, 1.0);
  const auto got = run_loss(s, cd, p, 1.0);
  CHECK(std::isfinite(got.out.sums.loss));
  CHECK(all_finite(got.dX));
  check_sums(got.out.sums, ref.out.sums, 1e-9);
  CHECK(dx_err(got.dX, ref.dX) <= 1e-9);
  for (auto mode : {model::VocabLossMode::recompute, model::VocabLossMode::fused}) {
    s.mode = mode;
    s.kl_temperature = 3.0;
    Cast<float> cf(p, true);
    const auto gf = run_loss(s, cf, p, 1.0);
    const auto rf = run_reference(s, cd, p, 1.0);
    CHECK(std::isfinite(gf.out.sums.loss));
    CHECK(std::isfinite(gf.out.sums.cap));
    CHECK(all_finite(gf.dX));
    check_sums(gf.out.sums, rf.out.sums, 1e-4);
  }
}

// z = a·e_j exactly (X = e_0, W[j, 0] = a, everything else 0), so the loss has a closed form.
struct OneHot {
  Problem p;
  OneHot(int V, int hot, int label, double a) {
    p.R = 1, p.H = 2, p.V = V, p.B = 2;
    p.X = {1.0, 0.0};
    p.Y = p.X;
    p.W.assign(size_t(V) * 2, 0.0);
    p.W[size_t(hot) * 2] = a;
    p.w = {1.0};
    p.labels = {label};
    p.kpos = {1};
    p.bid = {0};
  }
};

TEST_CASE("vocab_loss: p_y → 1 keeps relative accuracy of CE and of p_y − 1") {
  const int V = 50;
  const double a = 30;  // 1 − p_y = 49 e^-30 ≈ 4.6e-12
  OneHot o(V, 7, 7, a);
  const double t = (V - 1) * std::exp(-a);
  const double ce = std::log1p(t);      // −log p_y
  const double dz_y = -t / (1 + t);     // p_y − 1
  model::VocabLossSettings s;
  s.block_size = 2;
  s.chunk_size = 1;
  {
    Cast<double> c(o.p, false);
    const auto got = run_loss(s, c, o.p, 1.0);
    const auto ref = run_reference(s, c, o.p, 1.0);
    CHECK(rel(got.out.sums.ce, ce) <= 1e-12);
    CHECK(rel(ref.out.sums.ce, ce) <= 1e-12);
    // dX_0 = Σ_v dz_v W[v,0] = a (p_y − 1)
    CHECK(rel(got.dX[0], a * dz_y) <= 1e-12);
    CHECK(rel(ref.dX[0], a * dz_y) <= 1e-12);
  }
  {
    Cast<float> c(o.p, false);
    const auto got = run_loss(s, c, o.p, 1.0);
    CHECK(rel(got.out.sums.ce, ce) <= 1e-5);
    CHECK(rel(double(got.dX[0]), a * dz_y) <= 1e-5);
  }
}

TEST_CASE("vocab_loss: p_m → 1 on a wrong argmax keeps CAP finite and accurate (lse − lse_excl)") {
  const int V = 50;
  for (double a : {40.0, 200.0}) {  // 1 − p_m = 49 / (e^a + 49): underflows in float at a = 200
    OneHot o(V, 3, 9, a);
    const double cap = a - std::log(double(V - 1));  // lse − lse_{v≠m}: lse_{v≠m} = log 49, lse ≈ a (+ 49 e^-a)
    const double cap_exact = cap + std::log1p((V - 1) * std::exp(-a));
    model::VocabLossSettings s;
    s.block_size = 2;
    s.ce_weight = 0;
    s.cap_weight = 1;
    const double p_m = 1 / (1 + (V - 1) * std::exp(-a));
    // dz_m = p_m, dz_v = −p_m / 49 elsewhere; dX_0 = a · dz_m
    for (auto mode : {model::VocabLossMode::recompute, model::VocabLossMode::fused}) {
      s.mode = mode;
      CAPTURE(a);
      Cast<double> cd(o.p, false);
      const auto got = run_loss(s, cd, o.p, 1.0);
      CHECK(rel(got.out.sums.cap, cap_exact) <= 1e-12);
      CHECK(rel(got.dX[0], a * p_m) <= 1e-12);
      Cast<float> cf(o.p, false);
      const auto gf = run_loss(s, cf, o.p, 1.0);
      CHECK(rel(gf.out.sums.cap, cap_exact) <= 1e-6);
      CHECK(rel(double(gf.dX[0]), a * p_m) <= 1e-6);
      CHECK(all_finite(gf.dX));
    }
  }
}

TEST_CASE("vocab_loss: accepted length follows blocks across chunk boundaries") {
  // Hand-made: 3 blocks of B−1 = 4 rows; correctness pattern per block: [1,1,0,1] → 3, [0,1,1,1] → 1,
  // [1,1,1,1] but k=3 masked → 3. Labels are set from the argmax (correct) or the argmax + 1 (wrong).
  Problem p = make_problem(3, 5, 8, 20, 81);
  const int pattern[12] = {1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1};
  for (int r = 0; r < p.R; ++r) {
    int m = 0;
    double best = -1e300;
    for (int v = 0; v < p.V; ++v) {
      double s = 0;
      for (int h = 0; h < p.H; ++h) s += p.X[size_t(r) * p.H + h] * p.W[size_t(v) * p.H + h];
      if (s > best) best = s, m = v;
    }
    p.labels[size_t(r)] = pattern[r] ? m : (m + 1) % p.V;
    p.w[size_t(r)] = 1.0;
  }
  p.w[10] = 0.0;  // block 2, k = 3
  Cast<double> c(p, false);
  model::VocabLossSettings s;
  s.block_size = p.B;
  for (int chunk : {1, 3, 5, 7, 12}) {
    s.chunk_size = chunk;
    CAPTURE(chunk);
    const auto got = run_loss(s, c, p, 1.0);
    CHECK(got.out.metrics.blocks == 3);
    CHECK(got.out.metrics.accepted_sum == 3 + 1 + 3);
    CHECK(got.out.metrics.correct == std::vector<int64_t>{0, 2, 3, 1, 3});
    CHECK(got.out.metrics.scored == std::vector<int64_t>{0, 3, 3, 2, 3});
  }
}

TEST_CASE("vocab_loss: bad labels, block positions and block layouts are errors naming the row") {
  Problem p = make_problem(2, 4, 8, 20, 91);
  model::VocabLossSettings s;
  s.block_size = p.B;
  auto expect_error = [&](const Problem& q, const std::string& needle) {
    Cast<float> c(q, false);
    model::VocabLoss<float> loss(s, c.W.data(), q.V, q.H);
    model::VocabLossContext ctx;
    std::string msg;
    try {
      loss.forward(c.batch, ctx, 1.0, nullptr);
    } catch (const Error& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK(msg.find(needle) != std::string::npos);
  };
  Problem q = p;
  q.labels[4] = 20;
  expect_error(q, "row 4 has label 20");
  q = p;
  q.labels[2] = -1;
  expect_error(q, "row 2 has label -1");
  q = p;
  q.kpos[1] = 4;
  expect_error(q, "row 1 has block position k=4");
  q = p;
  std::swap(q.kpos[0], q.kpos[1]);
  expect_error(q, "row 1 has block position k=1 after k=2");
  q = p;
  q.bid[5] = q.bid[0];  // block of row 0 reappears after another block
  expect_error(q, "row 5 belongs to block");
}

TEST_CASE("vocab_loss: the vectorisable float exp is within 2 ulp of exp, 0 below -87.3, NaN stays NaN") {
  double worst = 0;
  float worst_x = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.3f + float(i) * (88.3f + 87.3f) / 2000000.0f;
    const double ref = std::exp(double(x));
    const double e = std::abs(double(kernels::math::loss_exp(x)) - ref) / ref;
    if (e > worst) worst = e, worst_x = x;
  }
  INFO("max rel err " << worst << " at x = " << worst_x);
  CHECK(worst <= 2 * 1.1920929e-7);
  CHECK(kernels::math::loss_exp(0.0f) == 1.0f);
  CHECK(kernels::math::loss_exp(-100.0f) == 0.0f);
  CHECK(kernels::math::loss_exp(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isnan(kernels::math::loss_exp(std::numeric_limits<float>::quiet_NaN())));
}

// ============================== acceptance-aware objectives ==============================

namespace {

// A named objective: the settings changes on top of the problem's defaults.
struct Objective {
  const char* name;
  double ce = 1, kl = 0, tau = 1, cap = 0, tv = 0, lk = 0, nla = 0, eta = 3, alpha = 0.5;
  model::PositionWeight position_weight = model::PositionWeight::decay;
  model::VocabLossSettings settings(int B) const {
    model::VocabLossSettings s;
    s.ce_weight = ce, s.kl_weight = kl, s.kl_temperature = tau, s.cap_weight = cap;
    s.tv_weight = tv, s.lk_weight = lk, s.nla_weight = nla, s.lk_eta = eta;
    s.position_weight = position_weight, s.dpace_alpha = alpha;
    s.top_k = 3;
    s.block_size = B;
    return s;
  }
};

// Every new term alone and in combination; the three D-PACE factors; α ≠ the default, η ≠ the default somewhere.
const std::vector<Objective>& objectives() {
  using PW = model::PositionWeight;
  static const std::vector<Objective> all = {
      {"dpace CE", 1, 0, 1, 0, 0, 0, 0, 3, 0.5, PW::dpace},
      {"dpace_cumulative_confidence CE+KL(tau 2)+CAP", 1, 0.7, 2, 0.3, 0, 0, 0, 3, 0.3,
       PW::dpace_cumulative_confidence},
      {"dpace_continuation_value CE+CAP", 1, 0, 1, 0.3, 0, 0, 0, 3, 0.7, PW::dpace_continuation_value},
      {"TV", 0, 0, 1, 0, 1},
      {"LK-hybrid", 0, 0, 1, 0, 0, 1, 0, 2},
      {"NLA", 0, 0, 1, 0, 0, 0, 1},
      {"CE+TV", 0.1, 0, 1, 0, 0.9},
      {"dpace CE+KL+CAP+TV+LK+NLA", 1, 0.5, 1, 0.2, 0.4, 0.6, 0.3, 4, 0.4, PW::dpace},
  };
  return all;
}

// The same objective written once more per row from the definitions, in double, on a problem's logits, with the
// stop-gradients held: each row's D-PACE factor d and LK's λ come from the point x0 the gradient is taken at.
// Its central differences are the gradient the sources define (their weights and λ are detached).
struct FrozenObjective {
  const Problem& p;
  model::VocabLossSettings s;
  std::vector<double> wd, lambda;  // [R] w · d and λ at x0
  struct Terms {
    double ce = 0, kl = 0, cap = 0, tv = 0, nla = 0, kl1 = 0, alpha = 0;
  };
  Terms row(const Vec& X, int r) const {
    const int V = p.V, H = p.H;
    Vec z(size_t(V), 0.0), u(size_t(V), 0.0);
    for (int v = 0; v < V; ++v)
      for (int h = 0; h < H; ++h) {
        z[size_t(v)] += X[size_t(r) * H + h] * p.W[size_t(v) * H + h];
        u[size_t(v)] += p.Y[size_t(r) * H + h] * p.W[size_t(v) * H + h];
      }
    auto lse = [&](const Vec& x, double scale, int skip) {
      double mx = -INFINITY, sum = 0;
      for (int v = 0; v < V; ++v)
        if (v != skip) mx = std::max(mx, x[size_t(v)] * scale);
      for (int v = 0; v < V; ++v)
        if (v != skip) sum += std::exp(x[size_t(v)] * scale - mx);
      return mx + std::log(sum);
    };
    const int y = p.labels[size_t(r)];
    const int m = int(std::max_element(z.begin(), z.end()) - z.begin());
    const double tau = s.kl_temperature, L = lse(z, 1, -1), Lt = lse(z, 1 / tau, -1), Lu = lse(u, 1 / tau, -1);
    const double L1u = lse(u, 1, -1);
    Terms t;
    t.ce = L - z[size_t(y)];
    t.cap = m != y ? L - lse(z, 1, m) : 0;
    for (int v = 0; v < V; ++v) {
      const double qt = std::exp(u[size_t(v)] / tau - Lu), q1 = std::exp(u[size_t(v)] - L1u);
      const double p1 = std::exp(z[size_t(v)] - L);
      t.kl += qt * ((u[size_t(v)] / tau - Lu) - (z[size_t(v)] / tau - Lt));
      t.kl1 += q1 * ((u[size_t(v)] - L1u) - (z[size_t(v)] - L));
      t.alpha += std::min(p1, q1);
    }
    t.kl *= tau * tau;
    t.tv = 1 - t.alpha;
    t.nla = -std::log(std::max(t.alpha, kernels::kNlaFloor));
    return t;
  }
  // wd: the loss's own w · d at x0 (its context); λ from x0's α here
  FrozenObjective(const Problem& p_, const model::VocabLossSettings& s_, const std::vector<double>& row_weight)
      : p(p_), s(s_) {
    wd = row_weight.empty() ? Vec(p.w) : row_weight;
    for (int r = 0; r < p.R; ++r) lambda.push_back(std::exp(-s.lk_eta * row(p.X, r).alpha));
  }
  double operator()(const Vec& X) const {
    double loss = 0;
    for (int r = 0; r < p.R; ++r) {
      if (!(p.w[size_t(r)] > 0)) continue;
      const Terms t = row(X, r);
      const double lk = lambda[size_t(r)] * t.kl1 + (1 - lambda[size_t(r)]) * t.tv;
      loss += wd[size_t(r)] * (s.ce_weight * t.ce + s.kl_weight * t.kl + s.cap_weight * t.cap + s.tv_weight * t.tv +
                               s.lk_weight * lk + s.nla_weight * t.nla);
    }
    return loss;
  }
};

void check_new_sums(const model::VocabLossSums& a, const model::VocabLossSums& ref, double tol) {
  INFO("tv " << a.tv << " vs " << ref.tv << ", lk " << a.lk << " vs " << ref.lk << ", nla " << a.nla << " vs "
             << ref.nla << ", dpace " << a.dpace << " vs " << ref.dpace);
  CHECK(rel(a.tv, ref.tv) <= tol);
  CHECK(rel(a.lk, ref.lk) <= tol);
  CHECK(rel(a.nla, ref.nla) <= tol);
  CHECK(rel(a.dpace, ref.dpace) <= tol);
}

}  // namespace

TEST_CASE("vocab_loss: D-PACE factors of a hand-made block (a masked row is a no-op in the products)") {
  // q = p_y of 4 rows, row 2 masked; α = 0.5: q̃ = 0.9, 0.75, (1), 0.95; C = 0.9, 0.675, 0.675, 0.64125
  const double q[4] = {0.8, 0.5, 0.123, 0.9};
  const uint8_t valid[4] = {1, 1, 0, 1};
  double f[4];
  namespace km = kernels::math;
  km::dpace_block_factors(q, valid, 4, 0.5, km::DpaceFactor::dpace, f);
  CHECK(f[0] == doctest::Approx(0.9 + 0.675 + 0.64125).epsilon(1e-15));
  CHECK(f[1] == doctest::Approx(0.675 + 0.64125).epsilon(1e-15));
  CHECK(f[2] == 0.0);
  CHECK(f[3] == doctest::Approx(0.64125).epsilon(1e-15));
  km::dpace_block_factors(q, valid, 4, 0.5, km::DpaceFactor::cumulative_confidence, f);
  CHECK(f[0] == doctest::Approx(0.9).epsilon(1e-15));
  CHECK(f[1] == doctest::Approx(0.675).epsilon(1e-15));
  CHECK(f[2] == 0.0);
  CHECK(f[3] == doctest::Approx(0.64125).epsilon(1e-15));
  km::dpace_block_factors(q, valid, 4, 0.5, km::DpaceFactor::continuation_value, f);
  CHECK(f[0] == doctest::Approx((0.9 + 0.675 + 0.64125) / 0.9).epsilon(1e-15));
  CHECK(f[1] == doctest::Approx((0.675 + 0.64125) / 0.675).epsilon(1e-15));
  CHECK(f[3] == doctest::Approx(1.0).epsilon(1e-15));
  // α = 1: every q̃ = 1, so dpace counts the scored rows from k on, and continuation value likewise
  km::dpace_block_factors(q, valid, 4, 1.0, km::DpaceFactor::dpace, f);
  CHECK(f[0] == 3.0);
  CHECK(f[1] == 2.0);
  CHECK(f[3] == 1.0);
}

TEST_CASE("vocab_loss: the acceptance-aware objectives match the long-double reference in every mode and chunk size "
          "(double, chunks of 1, 3 and 7 cut blocks of 5 rows)") {
  const Problem p = make_problem(6, 6, 16, 50, 101);
  Cast<double> c(p, true);
  const double grad_scale = 1.0 / 2.9;
  for (const Objective& o : objectives()) {
    CAPTURE(o.name);
    const auto s0 = o.settings(p.B);
    const auto ref = run_reference(s0, c, p, grad_scale);
    if (s0.uses_overlap()) CHECK(ref.out.sums.tv > 0);
    if (s0.position_weight != model::PositionWeight::decay)
      CHECK(ref.out.sums.dpace != doctest::Approx(ref.out.sums.weight));
    for (auto mode : {model::VocabLossMode::recompute, model::VocabLossMode::fused}) {
      for (int chunk : {1, 3, 7, p.R, p.R + 5}) {
        auto s = s0;
        s.mode = mode;
        s.chunk_size = chunk;
        CAPTURE(chunk);
        CAPTURE(int(mode));
        const auto got = run_loss(s, c, p, grad_scale);
        check_sums(got.out.sums, ref.out.sums, 1e-9);
        check_new_sums(got.out.sums, ref.out.sums, 1e-9);
        check_metrics(got.out.metrics, ref.out.metrics);
        CHECK(dx_err(got.dX, ref.dX) <= 1e-9);
      }
    }
  }
}

TEST_CASE("vocab_loss: the acceptance-aware objectives in float match the double reference within 1e-4") {
  const Problem p = make_problem(4, 8, 24, 120, 103);
  Cast<double> cd(p, true);
  Cast<float> cf(p, true);
  for (const Objective& o : objectives()) {
    CAPTURE(o.name);
    const auto s0 = o.settings(p.B);
    const auto ref = run_reference(s0, cd, p, 0.01);
    for (auto [mode, chunk] : {std::pair{model::VocabLossMode::recompute, 3}, std::pair{model::VocabLossMode::fused, 10}}) {
      {
        auto s = s0;
        s.mode = mode;
        s.chunk_size = chunk;
        CAPTURE(chunk);
        CAPTURE(int(mode));
        const auto got = run_loss(s, cf, p, 0.01);
        check_sums(got.out.sums, ref.out.sums, 1e-4);
        check_new_sums(got.out.sums, ref.out.sums, 1e-4);
        CHECK(dx_err(got.dX, ref.dX) <= 1e-4);
      }
    }
  }
}

TEST_CASE("vocab_loss: dX of every acceptance-aware term and combination matches central finite differences of the "
          "loss with its stop-gradients held (double)") {
  const Problem p = make_problem(3, 5, 8, 30, 105);
  Cast<double> c(p, true);
  for (const Objective& o : objectives()) {
    CAPTURE(o.name);
    for (auto mode : {model::VocabLossMode::recompute, model::VocabLossMode::fused}) {
      auto s = o.settings(p.B);
      s.mode = mode;
      s.chunk_size = 3;  // cuts every block of 4 rows
      CAPTURE(int(mode));
      model::VocabLoss<double> loss(s, c.W.data(), p.V, p.H);
      model::VocabLossContext ctx;
      Vec dX(size_t(p.R) * p.H);
      const auto out = loss.forward(c.batch, ctx, 1.0, dX.data());
      loss.backward(c.batch, ctx, 1.0, dX.data());
      const FrozenObjective f(p, s, ctx.row_weight);
      CHECK(rel(out.sums.loss, f(p.X)) <= 1e-12);  // the same objective at x0
      Vec x = p.X;
      const auto r = fd_check(x, dX, [&] { return f(x); });
      INFO(describe(r));
      CHECK(r.max_rel_err <= 1e-6);
    }
  }
}

TEST_CASE("vocab_loss: D-PACE chunks hold whole blocks, the scratch stays max(chunk, B − 1) rows whatever T") {
  for (int blocks : {2, 16}) {
    const Problem p = make_problem(blocks, 6, 8, 30, 107);
    Cast<float> c(p, true);
    auto s = objectives()[0].settings(p.B);
    s.chunk_size = 2;  // below a block's 5 rows: a chunk is then one block
    model::VocabLoss<float> loss(s, c.W.data(), p.V, p.H);
    model::VocabLossContext ctx;
    std::vector<float> dX(size_t(p.R) * p.H);
    loss.forward(c.batch, ctx, 1.0, dX.data());
    loss.backward(c.batch, ctx, 1.0, dX.data());
    CHECK(loss.scratch_bytes() < size_t(5 * p.V) * sizeof(float) + 4096);  // z only: no u without a target term
    CHECK(ctx.row_weight.size() == size_t(p.R));
  }
}

TEST_CASE("vocab_loss: acceptance-aware settings out of range are errors naming the setting") {
  const Problem p = make_problem(2, 4, 8, 20, 109);
  Cast<float> c(p, false);
  auto error_of = [&](model::VocabLossSettings s, bool forward = false) {
    std::string msg;
    try {
      model::VocabLoss<float> loss(s, c.W.data(), p.V, p.H);
      if (forward) {
        model::VocabLossContext ctx;
        loss.forward(c.batch, ctx, 1.0, nullptr);
      }
    } catch (const Error& e) {
      msg = e.what();
    }
    return msg;
  };
  model::VocabLossSettings s;
  s.block_size = p.B;
  auto t = s;  // (position_weight is a PositionWeight: an unknown name is the config's error, test_config.cpp)
  t.dpace_alpha = 0;
  CHECK(error_of(t).find("dpace_alpha must be in (0, 1] (got 0)") != std::string::npos);
  t = s;
  t.tv_weight = 1;
  t.kl_temperature = 2;
  CHECK(error_of(t).find("kl_temperature is 2; set kl_temperature to 1") != std::string::npos);
  t = s;
  t.lk_eta = -1;
  CHECK(error_of(t).find("lk_eta must be ≥ 0 (got -1)") != std::string::npos);
  t = s;
  t.nla_weight = 1;
  CHECK(error_of(t, true).find("nla_weight = 1: these need the target final hidden") != std::string::npos);
}
