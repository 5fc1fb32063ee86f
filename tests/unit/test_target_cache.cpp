// target cache: TargetModel::forward_cached over a sequence fed in pieces gives the final states forward() gives over
// the whole sequence, for a dense Qwen3 target (KV cache) and a Qwen3.5 hybrid (KV cache + DeltaNet conv tail and
// recurrent state), with pieces shorter than the conv kernel and pieces across the delta rule's chunk of 64.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/comm/transport.h"
#include "lib/core/rng.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"
#include "tests/unit/test_util.h"

using namespace dflash;

TEST_CASE("target cache: forward_cached in pieces equals forward over the whole sequence (dense and hybrid)") {
  for (bool hybrid : {false, true}) {
    CAPTURE(hybrid);
    model::RandomTargetSpec spec = test::small_random_target(hybrid, 4, 4);
    const auto dir = test::scratch_dir(hybrid ? "cache_hybrid" : "cache_dense");
    model::write_random_target(dir.string(), spec);
    comm::SelfTransport self;
    model::TargetModel target(dir.string(), self);
    const int S = 140, H = spec.hidden;
    std::vector<int32_t> tokens(static_cast<size_t>(S));
    Rng rng(12);
    for (auto& t : tokens) t = int32_t(rng.below(uint64_t(spec.vocab)));
    std::vector<float> whole(size_t(S) * H), pieces(size_t(S) * H);
    target.forward(tokens.data(), S, {}, nullptr, whole.data());
    model::TargetCache cache;
    int b = 0;
    for (int n : {1, 2, 70, 1, 66}) {
      target.forward_cached(&tokens[size_t(b)], n, cache, &pieces[size_t(b) * H]);
      b += n;
    }
    REQUIRE(b == S);
    CHECK(cache.length == S);
    double num = 0, den = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      num = std::max(num, double(std::fabs(whole[i] - pieces[i])));
      den = std::max(den, double(std::fabs(whole[i])));
    }
    CHECK(num / den < 1e-5);
    // a cache that claims a length but holds no state is a programming error, not silently a fresh sequence
    model::TargetCache bad;
    bad.length = 3;
    CHECK_THROWS(target.forward_cached(tokens.data(), 1, bad, pieces.data()));
  }
}

// The cache's own operations (what the speculative decoders call) on the CPU backend: the keys/values buffers grow
// geometrically and keep their rows; copy_cache is independent of its source; a rollback (save_recurrent, a verify,
// truncate, restore_recurrent, re-run the kept inputs) leaves the cache a straight run gives — bit for bit on a hybrid
// (the same computation), to rounding on a dense target (its kept rows came from a 4-row GEMM, the straight run's
// from a 2-row one); the recurrent snapshot of a dense target is empty; bad truncations are errors.
TEST_CASE("target cache: growth, copy_cache, truncate and the recurrent rollback equal a straight run") {
  for (bool hybrid : {false, true}) {
    CAPTURE(hybrid);
    model::RandomTargetSpec spec = test::small_random_target(hybrid, 4, 6);
    spec.full_attention_interval = 2;  // layers 1 and 3 attention, 0 and 2 Gated DeltaNet
    const auto dir = test::scratch_dir(hybrid ? "cache_ops_hybrid" : "cache_ops_dense");
    model::write_random_target(dir.string(), spec);
    comm::SelfTransport self;
    model::TargetModel target(dir.string(), self);
    const int H = spec.hidden;
    const std::vector<int32_t> prompt = {3, 9, 17, 22, 5}, block = {8, 1, 30, 12}, next = {40};
    std::vector<float> h(8 * size_t(H));
    using Part = model::TargetCachePart;

    // growth: 5 positions, then 4 more (capacity doubles to 10), then 1 (fits)
    model::TargetCache cache;
    target.forward_cached(prompt.data(), 5, cache, h.data());
    CHECK(cache.capacity == 5);
    const std::vector<float> keys5 = target.read_cache(cache, 1, Part::keys);
    CHECK(keys5.size() == 5 * size_t(spec.kv_heads * spec.head_dim));
    model::TargetCache copy = target.copy_cache(cache);

    // the rollback of a verify that keeps 2 of 4 positions
    model::TargetRecurrentState before;
    target.save_recurrent(cache, before);
    CHECK(before.conv_tail.empty() == !hybrid);
    target.forward_cached(block.data(), 4, cache, h.data());
    CHECK(cache.capacity == 10);
    std::vector<float> keys9 = target.read_cache(cache, 1, Part::keys);
    CHECK(std::equal(keys5.begin(), keys5.end(), keys9.begin()));  // the rows before the growth were kept
    cache.truncate(7);
    if (hybrid) {
      cache.truncate(5);
      target.restore_recurrent(cache, before);
      target.forward_cached(block.data(), 2, cache, h.data());
    }
    CHECK(cache.length == 7);
    CHECK_THROWS(cache.truncate(8));
    CHECK_THROWS(cache.truncate(-1));

    // the copy went on unchanged; the straight run over the kept inputs gives the same cache and next state
    CHECK(copy.length == 5);
    CHECK(target.read_cache(copy, 1, Part::keys) == keys5);
    target.forward_cached(block.data(), 2, copy, h.data());
    for (int l = 0; l < spec.layers; ++l) {
      CAPTURE(l);
      for (Part part : {Part::keys, Part::values, Part::conv_tail, Part::delta_state}) {
        const std::vector<float> a = target.read_cache(cache, l, part), b = target.read_cache(copy, l, part);
        REQUIRE(a.size() == b.size());
        if (hybrid) CHECK(a == b);
        else CHECK(test::max_rel_diff(a, b) < 1e-6);
        // an attention layer has keys/values, a DeltaNet layer conv tail and state
        const bool attention = !hybrid || l % 2 == 1;
        CHECK(a.empty() == (attention != (part == Part::keys || part == Part::values)));
      }
    }
    std::vector<float> h1(static_cast<size_t>(H)), h2(static_cast<size_t>(H));
    target.forward_cached(next.data(), 1, cache, h1.data());
    target.forward_cached(next.data(), 1, copy, h2.data());
    if (hybrid) CHECK(h1 == h2);
    else CHECK(test::max_rel_diff(h1, h2) < 1e-5);
    CHECK(cache.capacity == 10);  // 8 positions fit
  }
}
