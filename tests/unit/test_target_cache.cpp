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
    model::RandomTargetSpec spec;
    spec.hidden = 32;
    spec.layers = 4;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.head_dim = 8;
    spec.intermediate = 48;
    spec.vocab = 64;
    spec.seed = 4;
    spec.hybrid = hybrid;
    spec.linear_k_heads = 2;
    spec.linear_v_heads = 4;
    spec.linear_k_dim = 8;
    spec.linear_v_dim = 6;
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
