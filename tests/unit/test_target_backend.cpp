// TargetModel on a backend it is given (TargetOptions::backend): an explicit CPU backend, shared by two models, gives
// the same bits as the default one; the activation arena grows for a longer forward and a shorter forward after it
// gives the same bits as on a fresh model. (The CUDA backend's run of the same model: tests/cuda, family
// target_model, skipped without a GPU.)
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "kernels/backend.h"
#include "lib/comm/transport.h"
#include "lib/core/rng.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"
#include "tests/unit/test_util.h"

using namespace dflash;

namespace {

struct Outputs {
  std::vector<float> taps, final_hidden;
  bool operator==(const Outputs& o) const {
    return taps.size() == o.taps.size() && final_hidden.size() == o.final_hidden.size() &&
           std::memcmp(taps.data(), o.taps.data(), taps.size() * sizeof(float)) == 0 &&
           std::memcmp(final_hidden.data(), o.final_hidden.data(), final_hidden.size() * sizeof(float)) == 0;
  }
};

Outputs run(model::TargetModel& t, const std::vector<int32_t>& tokens, int S) {
  const int H = t.config().hidden;
  const std::vector<int> tap_ids = {0, 2};
  Outputs o{std::vector<float>(size_t(S) * 2 * H), std::vector<float>(size_t(S) * H)};
  t.forward(tokens.data(), S, tap_ids, o.taps.data(), o.final_hidden.data());
  return o;
}

}  // namespace

TEST_CASE("target backend: an explicit CPU backend equals the default; the arena grows and shrinking reuses it") {
  for (bool hybrid : {false, true}) {
    CAPTURE(hybrid);
    model::RandomTargetSpec spec = test::small_random_target(hybrid, 3, 9);
    spec.full_attention_interval = 2;
    const auto dir = test::scratch_dir(hybrid ? "backend_hybrid" : "backend_dense");
    model::write_random_target(dir.string(), spec);
    std::vector<int32_t> tokens(100);
    Rng rng(3);
    for (auto& t : tokens) t = int32_t(rng.below(uint64_t(spec.vocab)));

    comm::SelfTransport s1, s2, s3;
    model::TargetModel fresh(dir.string(), s1);
    CHECK(std::string(fresh.backend().name()) == "cpu");
    model::TargetOptions options;
    options.backend = kernels::make_cpu_backend<float>({options.attention_block});
    model::TargetModel a(dir.string(), s2, options), b(dir.string(), s3, options);
    CHECK(&a.backend() == options.backend.get());
    CHECK(&b.backend() == &a.backend());
    CHECK(a.weight_bytes() == fresh.weight_bytes());

    const Outputs short_fresh = run(fresh, tokens, 7);
    const Outputs long_fresh = run(fresh, tokens, 100);  // grows fresh's arena
    CHECK(run(a, tokens, 100) == long_fresh);
    CHECK(run(b, tokens, 7) == short_fresh);
    CHECK(run(fresh, tokens, 7) == short_fresh);  // a shorter forward in the grown arena: the same bits
    // the outputs are real numbers, not zeros left in a reused arena
    double sum = 0;
    for (float v : short_fresh.final_hidden) sum += double(v) * v;
    CHECK(sum > 1.0);
  }
}
