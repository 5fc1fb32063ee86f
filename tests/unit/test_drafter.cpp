// The whole drafter: gradients of every trainable tensor against finite differences (double), the DFlash mask
// seen end to end, and float vs double agreement.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fd_check.h"
#include "test_util.h"
#include "lib/core/error.h"
#include "lib/model/drafter.h"

using namespace dflash;
using namespace dflash::test;

namespace {

constexpr int kSeqLen = 14;
// overlapping anchors (4, 5), one at 0 (sees no context), one near the end (its block runs past S)
const std::vector<int> kAnchors = {0, 4, 5, 12};

template <typename T>
struct World {
  model::DrafterConfig cfg = small_drafter_config();
  model::DrafterParams<T> w{cfg};
  std::vector<T> taps, embed;
  std::vector<int32_t> tokens;

  World() {
    w.init_random(7, 0.3);
    auto noise = random_vector(w.flat.size(), 8, 0.1);
    for (const auto& p : w.layout)  // norm weights away from exactly 1 so their gradients are generic
      if (p.is_norm)
        for (size_t k = 0; k < p.numel; ++k) w.flat[p.offset + k] += T(noise[p.offset + k]);
    auto t = random_vector(size_t(kSeqLen) * cfg.n_taps * cfg.hidden, 9);
    auto e = random_vector(size_t(cfg.vocab) * cfg.hidden, 10);
    taps.assign(t.begin(), t.end());
    embed.assign(e.begin(), e.end());
    Rng rng(11);
    for (int i = 0; i < kSeqLen; ++i) tokens.push_back(int32_t(rng.below(cfg.vocab - 1)));
  }

  model::DrafterInputs<T> inputs(const std::vector<int>& anchors) const {
    model::DrafterInputs<T> in;
    in.taps = taps.data();
    in.tokens = tokens.data();
    in.seq_len = kSeqLen;
    in.anchors = anchors.data();
    in.n_anchors = int(anchors.size());
    in.embed = embed.data();
    return in;
  }

  std::vector<T> forward(const std::vector<int>& anchors = kAnchors) const {
    model::DrafterActivations<T> acts;
    model::drafter_forward(cfg, w, inputs(anchors), acts);
    return std::vector<T>(acts.out, acts.out + size_t(acts.n_blocks) * cfg.block_size * cfg.hidden);
  }
};

}  // namespace

TEST_CASE("drafter: gradient of every trainable tensor matches finite differences (double)") {
  World<double> world;
  const size_t out_size = kAnchors.size() * world.cfg.block_size * world.cfg.hidden;
  auto proj = random_vector(out_size, 12);  // loss = Σ proj ⊙ out: a random projection of the output
  auto loss = [&] {
    auto out = world.forward();
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += proj[i] * out[i];
    return s;
  };
  model::DrafterActivations<double> acts;
  const auto in = world.inputs(kAnchors);
  model::drafter_forward(world.cfg, world.w, in, acts);
  model::DrafterParams<double> grads(world.cfg);
  model::drafter_backward(world.cfg, world.w, in, acts, proj.data(), grads);

  double worst = 0;
  std::string worst_name;
  for (size_t t = 0; t < world.w.layout.size(); ++t) {
    const model::ParamInfo& p = world.w.layout[t];
    // fd_check perturbs a vector it owns: view this tensor's slice through a copy, written back on each eval
    std::vector<double> x(world.w.data(p), world.w.data(p) + p.numel);
    std::vector<double> g(grads.data(p), grads.data(p) + p.numel);
    auto tensor_loss = [&] {
      std::copy(x.begin(), x.end(), world.w.data(p));
      return loss();
    };
    auto res = fd_check(x, g, tensor_loss, sample_indices(p.numel, 50, 100 + t));
    std::copy(x.begin(), x.end(), world.w.data(p));
    INFO(p.name << ": " << describe(res));
    CHECK(res.checked == std::min<size_t>(p.numel, 50));
    CHECK(res.max_rel_err <= 1e-6);
    double norm = 0;
    for (double v : g) norm += v * v;
    CHECK(norm > 0);  // every tensor receives gradient
    if (res.max_rel_err > worst) worst = res.max_rel_err, worst_name = p.name;
  }
  MESSAGE("drafter FD check: worst max rel err " << worst << " (" << worst_name << ") over "
                                                 << world.w.layout.size() << " tensors");
}

TEST_CASE("drafter: a block never sees context rows >= its anchor or other blocks' tokens") {
  World<double> world;
  const int B = world.cfg.block_size, H = world.cfg.hidden, row = world.cfg.n_taps * H;
  const auto base = world.forward();
  auto block_out = [&](const std::vector<double>& out, int b) {
    return std::vector<double>(out.begin() + size_t(b) * B * H, out.begin() + size_t(b + 1) * B * H);
  };
  for (int b = 0; b < int(kAnchors.size()); ++b) {
    const int a = kAnchors[b];
    CAPTURE(b);
    // 1) change every context row >= anchor_b: block b's output is bit-identical
    World<double> w1;
    for (size_t i = size_t(a) * row; i < w1.taps.size(); ++i) w1.taps[i] += 1.0 + 0.5 * std::sin(double(i));
    CHECK(block_out(w1.forward(), b) == block_out(base, b));
    // 2) change the anchor token of every other block (at positions no other anchor shares)
    World<double> w2;
    for (int o = 0; o < int(kAnchors.size()); ++o)
      if (kAnchors[o] != a) w2.tokens[kAnchors[o]] = (w2.tokens[kAnchors[o]] + 1) % (w2.cfg.vocab - 1);
    CHECK(block_out(w2.forward(), b) == block_out(base, b));
    // 3) change context row anchor_b - 1: block b's output changes
    if (a > 0) {
      World<double> w3;
      for (int i = 0; i < row; ++i) w3.taps[size_t(a - 1) * row + i] += 0.5;
      const auto changed = block_out(w3.forward(), b);
      double diff = 0;
      for (size_t i = 0; i < changed.size(); ++i) diff = std::max(diff, std::abs(changed[i] - block_out(base, b)[i]));
      CHECK(diff > 1e-6);
    }
  }
}

TEST_CASE("drafter: float and double forwards agree within 1e-4 relative") {
  World<double> wd;
  World<float> wf;  // same seeds: identical inputs and weights up to float rounding
  for (size_t i = 0; i < wd.w.flat.size(); ++i) wf.w.flat[i] = float(wd.w.flat[i]);
  const auto od = wd.forward();
  const auto of = wf.forward();
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < od.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(double(of[i]) - od[i]));
    max_ref = std::max(max_ref, std::abs(od[i]));
  }
  INFO("max |float - double| / max |double| = " << max_diff / max_ref);
  CHECK(max_ref > 0.1);
  CHECK(max_diff / max_ref <= 1e-4);
}

TEST_CASE("drafter: bad anchors and configs are clear errors") {
  World<double> world;
  model::DrafterActivations<double> acts;
  std::vector<int> bad = {3, kSeqLen};
  CHECK_THROWS_WITH_AS(model::drafter_forward(world.cfg, world.w, world.inputs(bad), acts),
                       doctest::Contains("anchor 1 = 14 is outside [0, 14)"), dflash::Error);
  // the embedding kernel never checks: the drafter validates the block tokens first (row 4 = block 1's anchor)
  World<double> beyond;
  beyond.tokens[5] = beyond.cfg.vocab;
  CHECK_THROWS_WITH_AS(model::drafter_forward(beyond.cfg, beyond.w, beyond.inputs({3, 5}), acts),
                       doctest::Contains(("token id " + std::to_string(beyond.cfg.vocab) + " at row 4").c_str()), dflash::Error);
  model::DrafterConfig c = small_drafter_config();
  c.kv_heads = 3;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("heads (4) must be a multiple of kv_heads (3)"),
                       dflash::Error);
  c = small_drafter_config();
  c.window = {0};
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("1 sliding-window entries for 2 layers"), dflash::Error);
}

TEST_CASE("drafter: the activation arena's size formula is its exact peak, and a reserved arena is reused") {
  World<float> world;
  const model::DrafterConfig& c = world.cfg;
  model::DrafterActivations<float> acts;
  const size_t need = model::drafter_arena_bytes(c, kSeqLen, int(kAnchors.size()), sizeof(float), sizeof(float));
  model::drafter_forward(c, world.w, world.inputs(kAnchors), acts);
  CHECK(acts.arena.capacity() == need);
  std::vector<float> d_out(kAnchors.size() * c.block_size * c.hidden, 0.5f);
  model::DrafterParams<float> grads(c);
  model::drafter_backward(c, world.w, world.inputs(kAnchors), acts, d_out.data(), grads);
  // drafter_arena_bytes meters the same bind_* lists forward and backward take their pointers from: an array
  // allocated outside them (a stray arena.alloc in forward) makes this fail, or forward throw "exhausted"
  CHECK(acts.arena.peak() == need);  // forward + backward use every byte of the formula, and not one more
  CHECK(acts.arena.used() < need);   // backward's scratch is released; the activations stay

  // the trainer reserves for its largest sequence once: shorter sequences run in the same arena
  model::DrafterActivations<float> reserved;
  reserved.reserve(MemoryKind::host, c, 40, 6);
  const size_t cap = reserved.arena.capacity();
  CHECK(cap == model::drafter_arena_bytes(c, 40, 6, sizeof(float), sizeof(float)));
  model::drafter_forward(c, world.w, world.inputs(kAnchors), reserved);
  CHECK(reserved.arena.capacity() == cap);
}
