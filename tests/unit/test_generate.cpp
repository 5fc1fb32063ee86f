// Greedy generation (lib/model/generate.h) and regenerated datasets (apps/dflash_data/regenerate_dataset.h) on tiny random targets, single process (TP 1).
// The reference: for every prefix, the final hidden state of the last position from the forward, logits against
// the full lm_head in double by plain loops, argmax with the lowest id on ties. (TP > 1 is checked by the
// integration test regenerate_cli_mpi: the same output under mpirun -np 5.)
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <algorithm>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "lib/comm/transport.h"
#include "lib/core/error.h"
#include "lib/io/dataset.h"
#include "apps/dflash_data/regenerate_dataset.h"
#include "lib/model/generate.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"

using namespace dflash;
namespace fs = std::filesystem;

namespace {

// A random target in its own temp directory (removed at exit), loaded for TP 1.
struct TinyTarget {
  fs::path dir;
  comm::SelfTransport self;
  model::RandomTargetSpec spec;
  std::unique_ptr<model::TargetModel> target;
  std::unique_ptr<model::GreedyHead> head;
  model::TargetVocab vocab;

  TinyTarget(const std::string& name, bool tie) {
    dir = fs::temp_directory_path() / ("dflash_test_generate_" + name + "_" + std::to_string(::getpid()));
    spec.hidden = 32;
    spec.layers = 2;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.head_dim = 8;
    spec.intermediate = 64;
    spec.vocab = 96;
    spec.seed = 3;
    spec.tie = tie;
    model::write_random_target(dir.string(), spec);
    target = std::make_unique<model::TargetModel>(dir.string(), self);
    head = std::make_unique<model::GreedyHead>(dir.string(), self);
    vocab = model::load_target_vocab(dir.string());
  }
  ~TinyTarget() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }

  // logits[V] in double of the last position of `tokens`, by plain loops
  std::vector<double> logits(const std::vector<int32_t>& tokens) {
    const int S = int(tokens.size()), H = spec.hidden;
    std::vector<float> fh(size_t(S) * H);
    target->forward(tokens.data(), S, {}, nullptr, fh.data());
    std::vector<double> z(size_t(spec.vocab), 0.0);
    for (int v = 0; v < spec.vocab; ++v)
      for (int h = 0; h < H; ++h) z[size_t(v)] += double(vocab.lm_head()[size_t(v) * H + h]) * fh[size_t(S - 1) * H + h];
    return z;
  }

  // greedy continuation by hand; `min_gap` (=) the smallest top-1 − top-2 logit gap seen (a near tie would make
  // the fp32 vs double comparison fragile, so the test also asserts that the gaps are clear)
  std::vector<int32_t> reference(std::vector<int32_t> tokens, int n, int limit, double& min_gap) {
    std::vector<int32_t> out;
    const int V = limit > 0 ? limit : spec.vocab;
    for (int k = 0; k < n; ++k) {
      const std::vector<double> z = logits(tokens);
      int best = 0;
      for (int v = 1; v < V; ++v)
        if (z[size_t(v)] > z[size_t(best)]) best = v;
      double second = -std::numeric_limits<double>::infinity();
      for (int v = 0; v < V; ++v)
        if (v != best) second = std::max(second, z[size_t(v)]);
      min_gap = std::min(min_gap, z[size_t(best)] - second);
      tokens.push_back(best);
      out.push_back(best);
    }
    return out;
  }
};

const std::vector<std::vector<int32_t>> kPrompts = {{5}, {1, 2, 3, 4, 5, 6, 7}, {90, 0, 17, 17, 42}, {64, 3}};

}  // namespace

TEST_CASE("generate: argmax_first keeps the lowest index on ties and skips NaN") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> ties = {1, 3, 3, 2}, lead_nan = {nan, 2, 2}, all_nan = {nan, nan};
  const std::vector<float> neg = {-5, -1, -1, -7};
  CHECK(model::argmax_first(ties.data(), 4) == 1);
  CHECK(model::argmax_first(lead_nan.data(), 3) == 1);
  CHECK(model::argmax_first(neg.data(), 4) == 1);
  CHECK(model::argmax_first(all_nan.data(), 2) == -1);
  CHECK(model::argmax_first(ties.data(), 0) == -1);
}

TEST_CASE("generate: greedy continuation equals the argmax of hand-computed logits for every prefix") {
  for (bool tie : {false, true}) {
    CAPTURE(tie);
    TinyTarget t(tie ? "tied" : "untied", tie);
    const int n = 8;
    double min_gap = std::numeric_limits<double>::infinity();
    std::set<int32_t> seen;  // the continuations must not all be one token (that would hide an indexing error)
    for (const auto& prompt : kPrompts) {
      CAPTURE(prompt.size());
      model::GenerateOptions opt;
      opt.max_new_tokens = n;
      const std::vector<int32_t> got = model::greedy_generate(*t.target, *t.head, prompt, opt);
      const std::vector<int32_t> want = t.reference(prompt, n, 0, min_gap);
      REQUIRE(got.size() == size_t(n));
      CHECK(got == want);
      seen.insert(got.begin(), got.end());
    }
    MESSAGE("smallest top-1 vs top-2 logit gap: " << min_gap);
    CHECK(min_gap > 1e-4);  // fp32 vs double error of one logit here is ~1e-6
    MESSAGE("distinct generated ids: " << seen.size());
    CHECK(seen.size() > 3);
  }
}

TEST_CASE("generate: eos stops generation and is kept as the last token") {
  TinyTarget t("eos", false);
  model::GenerateOptions opt;
  opt.max_new_tokens = 8;
  const std::vector<int32_t> prompt = kPrompts[1];
  const std::vector<int32_t> full = model::greedy_generate(*t.target, *t.head, prompt, opt);
  // the first step k >= 1 whose token did not appear before: with it as eos, generation must stop right there
  size_t k = 1;
  while (k < full.size() && std::find(full.begin(), full.begin() + int64_t(k), full[k]) != full.begin() + int64_t(k))
    ++k;
  REQUIRE(k < full.size());
  opt.eos_id = full[k];
  const std::vector<int32_t> stopped = model::greedy_generate(*t.target, *t.head, prompt, opt);
  CHECK(stopped == std::vector<int32_t>(full.begin(), full.begin() + int64_t(k) + 1));
  opt.eos_id = full[0];
  CHECK(model::greedy_generate(*t.target, *t.head, prompt, opt) == std::vector<int32_t>{full[0]});
  opt.eos_id = t.spec.vocab;  // not a token id
  CHECK_THROWS_WITH_AS(model::greedy_generate(*t.target, *t.head, prompt, opt), doctest::Contains("eos id 96"),
                       Error);
  opt.eos_id = -1;
  CHECK_THROWS_WITH_AS(model::greedy_generate(*t.target, *t.head, {}, opt), doctest::Contains("prompt is empty"),
                       Error);
}

TEST_CASE("generate: vocab_limit keeps ids at or above the limit out") {
  TinyTarget t("limit", false);
  model::GenerateOptions opt;
  opt.max_new_tokens = 6;
  int exercised = 0;
  for (const auto& prompt : kPrompts) {
    CAPTURE(prompt.size());
    const int32_t first = model::greedy_generate(*t.target, *t.head, prompt, {1, -1, 0})[0];
    if (first == 0) continue;  // a limit of `first` must exclude it: needs first > 0
    opt.vocab_limit = first;
    const std::vector<int32_t> got = model::greedy_generate(*t.target, *t.head, prompt, opt);
    double gap = std::numeric_limits<double>::infinity();
    CHECK(got == t.reference(prompt, opt.max_new_tokens, first, gap));
    for (int32_t id : got) CHECK(id < first);
    ++exercised;
  }
  CHECK(exercised >= 2);
  CHECK_THROWS_AS(t.head->next_token(std::vector<float>(32, 1.f).data(), 97), Error);
}

TEST_CASE("generate: regenerate_dataset writes prompt + continuation with the right offsets, masks and stats") {
  TinyTarget t("regen", false);
  const fs::path in = t.dir / "prompts.h5", out = t.dir / "regen.h5";
  // seq 0: a whole prompt; seq 1: prompt [7, 8] + an old response that is dropped; seq 2: a one-token prompt
  io::write_dataset(in.string(), {3, 4, 5, 7, 8, 9, 10, 11, 1}, {0, 3, 8, 9}, {0, 0, 0, 0, 0, 1, 1, 1, 0});
  io::Dataset prompts(in.string(), t.spec.vocab);
  model::GenerateOptions opt;
  opt.max_new_tokens = 5;
  std::vector<int64_t> progress;
  {
    io::DatasetWriter w(out.string());
    const data::RegenerateStats st = data::regenerate_dataset(
        *t.target, *t.head, prompts, &w, opt, 0, [&](const data::RegenerateStats& s) { progress.push_back(s.sequences); });
    w.close();
    CHECK(st.sequences == 3);
    CHECK(st.prompt_tokens == 6);
    CHECK(st.new_tokens == 15);
    CHECK(st.eos_stops == 0);
  }
  CHECK(progress == std::vector<int64_t>{1, 2, 3});
  io::Dataset d(out.string(), t.spec.vocab);
  REQUIRE(d.size() == 3);
  CHECK(d.offsets() == std::vector<int64_t>{0, 8, 15, 21});
  const std::vector<std::vector<int32_t>> prompt = {{3, 4, 5}, {7, 8}, {1}};
  for (int64_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const io::Sequence s = d.read(i);
    const size_t p = prompt[size_t(i)].size();
    CHECK(std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + int64_t(p)) == prompt[size_t(i)]);
    CHECK(std::vector<int32_t>(s.tokens.begin() + int64_t(p), s.tokens.end()) ==
          model::greedy_generate(*t.target, *t.head, prompt[size_t(i)], opt));
    std::vector<uint8_t> mask(p, 0);
    mask.resize(p + 5, 1);
    CHECK(s.loss_mask == mask);
  }

  // --limit 2 and an eos that ends sequence 0 early
  const std::vector<int32_t> cont0 = model::greedy_generate(*t.target, *t.head, prompt[0], opt);
  opt.eos_id = cont0[0];
  const fs::path out2 = t.dir / "regen2.h5";
  {
    io::DatasetWriter w(out2.string());
    const data::RegenerateStats st = data::regenerate_dataset(*t.target, *t.head, prompts, &w, opt, 2);
    w.close();
    CHECK(st.sequences == 2);
    CHECK(st.eos_stops >= 1);
  }
  io::Dataset d2(out2.string(), t.spec.vocab);
  REQUIRE(d2.size() == 2);
  CHECK(d2.length(0) == 4);  // 3 prompt tokens + the eos
  CHECK(d2.read(0).loss_mask == std::vector<uint8_t>{0, 0, 0, 1});

  // a sequence without a prompt (sequence 1 of `bad`) fails before anything is generated or added
  const fs::path bad = t.dir / "bad.h5";
  io::write_dataset(bad.string(), {3, 4, 5, 6}, {0, 2, 4}, {0, 0, 1, 1});
  io::Dataset bad_prompts(bad.string(), t.spec.vocab);
  io::DatasetWriter w((t.dir / "regen3.h5").string());
  int calls = 0;
  CHECK_THROWS_WITH_AS(data::regenerate_dataset(*t.target, *t.head, bad_prompts, &w, opt, 0,
                                                 [&](const data::RegenerateStats&) { ++calls; }),
                       doctest::Contains("bad.h5: sequence 1 has loss_mask = 1"), Error);
  CHECK(calls == 0);
  CHECK(w.sequences() == 0);
}

TEST_CASE("generate: a sequence without a prompt is an error naming the file and the sequence") {
  io::Sequence s;
  s.index = 4;
  s.tokens = {1, 2, 3};
  s.loss_mask = {1, 1, 0};
  CHECK_THROWS_WITH_AS(model::prompt_of(s, "data.h5"), doctest::Contains("data.h5: sequence 4 has loss_mask = 1 on its first token"),
                       Error);
  s.loss_mask = {0, 1, 0};
  CHECK(model::prompt_of(s, "data.h5") == std::vector<int32_t>{1});
  s.loss_mask = {0, 0, 0};
  CHECK(model::prompt_of(s, "data.h5") == std::vector<int32_t>{1, 2, 3});
}
