// Anchor sampling, scored rows and their weights, AdamW, clipping and the LR schedule, against hand computations.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <vector>

#include "lib/model/adamw.h"
#include "lib/train/anchors.h"
#include "lib/train/run_plan.h"
#include "lib/report/progress.h"

using namespace dflash;

TEST_CASE("anchors: sorted, distinct, inside the loss mask, deterministic in (seed, step, slot)") {
  const int S = 40;
  std::vector<uint8_t> mask(S, 1);
  for (int i = 0; i < 10; ++i) mask[i] = 0;  // a prompt: not trained
  mask[25] = 0;
  const train::AnchorKey key{5, 3, 1};
  auto a = train::sample_anchors(mask.data(), S, 12, key);
  REQUIRE(a.size() == 12);
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(mask[a[i]] == 1);
    CHECK(mask[a[i] + 1] == 1);
    if (i) CHECK(a[i - 1] < a[i]);
  }
  CHECK(train::sample_anchors(mask.data(), S, 12, key) == a);
  CHECK(train::sample_anchors(mask.data(), S, 12, train::AnchorKey{5, 4, 1}) != a);
  CHECK(train::sample_anchors(mask.data(), S, 12, train::AnchorKey{5, 3, 2}) != a);
  CHECK(train::sample_anchors(mask.data(), S, 12, train::AnchorKey{6, 3, 1}) != a);
  // candidates: i in [10, 38] with mask[i] and mask[i+1], minus 24 and 25 → 27 of them; asking for more gives all
  auto all = train::sample_anchors(mask.data(), S, 100, key);
  CHECK(all.size() == 27);
  CHECK(std::set<int>(all.begin(), all.end()).count(24) == 0);
  std::vector<uint8_t> none(S, 0);
  CHECK(train::sample_anchors(none.data(), S, 8, key).empty());
}

TEST_CASE("scored rows: labels, target positions and decayed weights") {
  const int S = 10, B = 4;
  std::vector<int32_t> tokens = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  std::vector<uint8_t> mask = {0, 1, 1, 1, 0, 1, 1, 1, 1, 1};
  const double gamma = 2.0;
  auto r = train::scored_rows(tokens.data(), mask.data(), S, {2, 8}, B, gamma);
  REQUIRE(r.size() == 2 * (B - 1));
  // block 0, anchor 2: k = 1, 2, 3 → positions 3, 4, 5; mask[4] = 0
  CHECK(r.label[0] == 13);
  CHECK(r.target_pos[0] == 2);
  CHECK(r.out_row[0] == 1);
  CHECK(r.weight[0] == doctest::Approx(1.0));
  CHECK(r.weight[1] == 0.0f);
  CHECK(r.weight[2] == doctest::Approx(std::exp(-2.0 / gamma)));
  // block 1, anchor 8: positions 9, 10, 11; 10 and 11 are past the end
  CHECK(r.label[3] == 19);
  CHECK(r.out_row[3] == B + 1);
  CHECK(r.block_id[3] == 1);
  CHECK(r.block_pos[3] == 1);
  CHECK(r.weight[4] == 0.0f);
  CHECK(r.weight[5] == 0.0f);
  CHECK(r.target_pos[5] == S - 1);
  CHECK(r.weight_sum() == doctest::Approx(1.0 + std::exp(-1.0) + 1.0));
  CHECK(train::default_decay_gamma(16) == 7.0);
  CHECK(train::default_decay_gamma(8) == 4.0);
}

TEST_CASE("run plan: D-PACE replaces the decay (rows keep loss_mask weights) and reaches the loss settings") {
  model::QwenConfig t;
  t.hidden = 64, t.layers = 8, t.heads = 16, t.kv_heads = 8, t.head_dim = 16, t.intermediate = 128, t.vocab = 512;
  t.layer_types.assign(8, model::LayerType::full_attention);
  const std::string yaml = "target:\n  path: /t\ndrafter:\n  mask_token_id: 511\n  block_size: 8\ndata:\n  path: d.h5\n";
  const train::RunPlan decay = train::make_run_plan(load_config_text(yaml), t, 100);
  CHECK(decay.decay_gamma == 4.0);
  const train::RunPlan pace = train::make_run_plan(
      load_config_text(yaml, {"loss.position_weight=dpace", "loss.dpace_alpha=0.3", "loss.lk_weight=0.2"}), t, 100);
  CHECK(std::isinf(pace.decay_gamma));
  CHECK(pace.loss.position_weight == model::PositionWeight::dpace);
  CHECK(pace.loss.dpace_alpha == 0.3);
  CHECK(pace.loss.uses_target());  // LK reads the target's logits: the trainer loads its final hidden
  // tokens 0..11, mask on from 2; anchors 2 and 6, B = 8: weights are the mask (and in-sequence) alone
  std::vector<int32_t> tokens(12);
  std::vector<uint8_t> mask(12, 1);
  mask[0] = mask[1] = mask[5] = 0;
  const train::ScoredRows r = train::scored_rows(tokens.data(), mask.data(), 12, {2, 6}, 8, pace.decay_gamma);
  for (int i = 0; i < r.size(); ++i) {
    const int pos = (i < 7 ? 2 : 6) + r.block_pos[size_t(i)];
    CHECK(r.weight[size_t(i)] == (pos < 12 && mask[size_t(pos)] ? 1.0f : 0.0f));
  }
}

TEST_CASE("adamw: two steps against the textbook formula, decoupled decay only where masked") {
  std::vector<float> p = {1.0f, -2.0f}, g1 = {0.5f, -1.0f}, g2 = {-0.25f, 2.0f};
  model::AdamWSettings s;
  s.beta1 = 0.9;
  s.beta2 = 0.99;
  s.eps = 1e-8;
  s.weight_decay = 0.1;
  model::AdamWState st;
  const double lr = 0.01;
  std::vector<uint8_t> decay = {1, 0};
  model::adamw_step(p.data(), g1.data(), 2, st, s, lr, decay);
  model::adamw_step(p.data(), g2.data(), 2, st, s, lr, decay);
  // reference in double
  double ref[2] = {1.0, -2.0};
  for (int i = 0; i < 2; ++i) {
    double m = 0, v = 0;
    const double gs[2] = {i ? -1.0 : 0.5, i ? 2.0 : -0.25};
    for (int t = 1; t <= 2; ++t) {
      m = 0.9 * m + 0.1 * gs[t - 1];
      v = 0.99 * v + 0.01 * gs[t - 1] * gs[t - 1];
      if (decay[i]) ref[i] -= lr * 0.1 * ref[i];
      ref[i] -= lr * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.99, t))) + 1e-8);
    }
  }
  CHECK(st.step == 2);
  CHECK(p[0] == doctest::Approx(ref[0]).epsilon(1e-6));
  CHECK(p[1] == doctest::Approx(ref[1]).epsilon(1e-6));
}

TEST_CASE("clip_global_norm scales to the limit and leaves small gradients alone") {
  std::vector<float> g = {3.0f, 4.0f};
  CHECK(model::clip_global_norm(g.data(), 2, 1.0) == doctest::Approx(5.0));
  CHECK(model::global_norm(g.data(), 2) == doctest::Approx(1.0).epsilon(1e-5));
  std::vector<float> small = {0.3f, 0.4f};
  CHECK(model::clip_global_norm(small.data(), 2, 1.0) == doctest::Approx(0.5));
  CHECK(small[0] == 0.3f);
}

TEST_CASE("lr schedule: linear warmup, cosine to min_lr_ratio at the last step") {
  const int64_t total = 100;
  // warmup_ratio 0.04 → 4 warmup steps: lr/4, lr/2, 3lr/4, lr
  CHECK(model::lr_at(0, total, 1.0, 0.04, 0.1) == doctest::Approx(0.25));
  CHECK(model::lr_at(3, total, 1.0, 0.04, 0.1) == doctest::Approx(1.0));
  CHECK(model::lr_at(4, total, 1.0, 0.04, 0.1) == doctest::Approx(1.0));
  CHECK(model::lr_at(99, total, 1.0, 0.04, 0.1) == doctest::Approx(0.1));
  // 47 of the 95 decay steps done: min + (1 - min) · (1 + cos(π · 47/95)) / 2
  CHECK(model::lr_at(4 + 47, total, 1.0, 0.04, 0.1) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 47 / 95.0))));
  CHECK(model::lr_at(0, total, 1.0, 0.0, 0.0) == doctest::Approx(1.0));
}

TEST_CASE("progress interval: Σw-weighted loss parts, accuracy per position, tau and rates over the steps") {
  report::ProgressInterval p(/*block_size=*/4);
  train::StepResult a, b;
  a.sums = {6.0, 4.0, 1.0, 0.5, 2.0};  // unnormalised: loss, ce, kl, cap, Σw
  b.sums = {3.0, 2.0, 0.5, 0.5, 1.0};
  a.metrics.correct = {0, 2, 1, 0};
  a.metrics.scored = {0, 4, 4, 2};
  b.metrics.correct = {0, 1, 0, 0};
  b.metrics.scored = {0, 2, 2, 2};
  a.metrics.topk_hits = 6;
  a.metrics.accepted_sum = 7;
  a.metrics.blocks = 4;
  b.metrics.accepted_sum = 2;
  b.metrics.blocks = 2;
  a.tokens = 300;
  b.tokens = 100;
  a.wait_seconds = 0.5;
  b.wait_seconds = 0.25;
  b.lr = 1e-3;
  b.grad_norm = 0.5;
  p.add(a);
  p.add(b);
  const auto j = p.record(20, /*seconds=*/2.0, /*elapsed=*/9.0);
  CHECK(j["steps_averaged"] == 2);
  CHECK(j["loss"].get<double>() == doctest::Approx(9.0 / 3.0));
  CHECK(j["ce"].get<double>() == doctest::Approx(6.0 / 3.0));
  CHECK(j["kl"].get<double>() == doctest::Approx(1.5 / 3.0));
  CHECK(j["acc"].get<double>() == doctest::Approx(4.0 / 16.0));
  CHECK(j["acc_by_pos"][0].get<double>() == doctest::Approx(3.0 / 6.0));
  CHECK(j["acc_by_pos"][2].get<double>() == 0.0);
  CHECK(j["topk_acc"].get<double>() == doctest::Approx(6.0 / 16.0));
  CHECK(j["tau"].get<double>() == doctest::Approx(9.0 / 6.0));
  CHECK(j["tokens_per_s"].get<double>() == doctest::Approx(200.0));
  CHECK(j["wait_share"].get<double>() == doctest::Approx(0.375));
  CHECK(j["lr"].get<double>() == 1e-3);
  const std::string line = p.line(20, 100, 4, 2.0, 125.0);
  CHECK(line.find("step 20/100 | loss 3.0000") == 0);
  CHECK(line.find("tau 1.50") != std::string::npos);
  CHECK(line.find("200 tok/s | wait 38% | eta 2m05s") != std::string::npos);
  p.reset();
  CHECK(p.steps() == 0);
}
