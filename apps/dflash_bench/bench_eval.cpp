// dflash_bench eval: speculative decoding on the CPU, one process (TP 1): plain cached greedy decoding, chain
// speculative decoding (lib/eval/spec_decode.h) and tree verification (lib/eval/spec_tree.h) of the same prompts
// in the same run, with tokens/s, target forwards per generated token, τ and τ_tree (docs/eval.md). Every decoding
// is checked to give greedy's tokens. Built-in configs: `tiny` (the tiny recipe's target and drafter shapes) and
// `larger` (H 512, 8 layers), each a random target, a random (untrained) drafter and random prompts, so τ stays near
// 1 and the rows measure the machinery's cost; --target/--drafter/--prompt-file add a row for a real pair (e.g. the
// tiny recipe's trained drafter).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/dflash_bench/bench.h"
#include "lib/comm/transport.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/core/timer.h"
#include "lib/io/dataset.h"
#include "lib/model/drafter_params.h"
#include "lib/model/generate.h"
#include "lib/model/random_target.h"
#include "lib/eval/spec_decode.h"
#include "lib/eval/spec_tree.h"
#include "lib/model/target.h"
#include "lib/state/drafter_source.h"

namespace dflash::bench {

namespace {

struct Pair {
  std::string name;
  model::RandomTargetSpec target;
  model::DrafterConfig drafter;
  std::vector<int> taps;
};

Pair builtin(const std::string& name) {
  Pair p;
  p.name = name;
  model::RandomTargetSpec& t = p.target;
  model::DrafterConfig& d = p.drafter;
  if (name == "tiny") {  // data/make_tiny.sh and mpi_launch/configs/tiny.yaml
    t.hidden = 64, t.layers = 8, t.heads = 16, t.kv_heads = 8, t.head_dim = 16, t.intermediate = 128, t.vocab = 512;
    d.layers = 2, d.heads = 4, d.kv_heads = 2, d.head_dim = 16, d.intermediate = 128;
  } else if (name == "larger") {
    t.hidden = 512, t.layers = 8, t.heads = 16, t.kv_heads = 8, t.head_dim = 32, t.intermediate = 1536;
    t.vocab = 4096;
    d.layers = 2, d.heads = 16, d.kv_heads = 8, d.head_dim = 32, d.intermediate = 1536;
  } else {
    DFLASH_USER_FAIL("--config: unknown config '{}' (tiny, larger)", name);
  }
  t.seed = 1;
  d.hidden = t.hidden, d.vocab = t.vocab, d.mask_token_id = t.vocab - 1, d.block_size = 8;
  p.taps = {1, 2, 3, 4, 5};
  d.n_taps = int(p.taps.size());
  d.window.assign(size_t(d.layers), 0);
  return p;
}

struct Row {
  eval::SpecSummary chain, tree;
  double greedy_seconds = 0;
  int64_t greedy_tokens = 0;
  explicit Row(int B) : chain(B), tree(B) {}
};

Row measure(const std::string& target_dir, const model::DrafterConfig& dc, const model::DrafterParams<float>& params,
            const std::vector<int>& taps, const std::vector<std::vector<int32_t>>& prompts, int max_new,
            const eval::TreeOptions& tree) {
  comm::SelfTransport self;
  model::TargetModel target(target_dir, self);
  model::GreedyHead head(target_dir, self);
  const model::TargetVocab vocab = model::load_target_vocab(target_dir);
  const int vocab_limit = dc.mask_token_id == dc.vocab - 1 ? dc.vocab - 1 : 0;
  eval::DrafterProposer drafter(dc, params, vocab.embedding.data(), vocab.lm_head(), vocab_limit);
  eval::SpecOptions so;
  so.block_size = dc.block_size;
  so.tap_layer_ids = taps;
  so.max_new_tokens = max_new;
  so.vocab_limit = vocab_limit;
  model::GenerateOptions g;
  g.max_new_tokens = max_new;
  g.vocab_limit = vocab_limit;
  Row row(dc.block_size);
  // one untimed prompt first: page in the weights, size the arenas
  eval::speculative_generate_tree(target, head, self, &drafter, prompts[0], so, tree);
  for (size_t i = 0; i < prompts.size(); ++i) {
    Timer t;
    const std::vector<int32_t> greedy = model::greedy_generate(target, head, prompts[i], g);
    row.greedy_seconds += t.seconds();
    row.greedy_tokens += int64_t(greedy.size());
    const eval::SpecResult c = eval::speculative_generate(target, head, self, &drafter, prompts[i], so);
    const eval::SpecResult r = eval::speculative_generate_tree(target, head, self, &drafter, prompts[i], so, tree);
    DFLASH_CHECK(c.tokens == greedy && r.tokens == greedy, "prompt {}: speculative decoding (chain {}, tree {}) "
                 "differs from greedy: a bug", i, c.tokens == greedy ? "same" : "differs",
                 r.tokens == greedy ? "same" : "differs");
    row.chain.add(c);
    row.tree.add(r);
  }
  return row;
}

double per_token(const eval::SpecSummary& s) {
  return s.generated > 0 ? double(s.target_forwards + s.rollback_forwards) / double(s.generated) : 0.0;
}

void print_row(const std::string& name, const model::QwenConfig& c, size_t prompts, int max_new, const Row& r) {
  const double greedy_tps = r.greedy_seconds > 0 ? double(r.greedy_tokens) / r.greedy_seconds : 0.0;
  const double chain_tps = r.chain.seconds > 0 ? double(r.chain.generated) / r.chain.seconds : 0.0;
  const double tree_tps = r.tree.seconds > 0 ? double(r.tree.generated) / r.tree.seconds : 0.0;
  std::printf("| %s | %d × %d, V %d | %zu × %d | %.0f | %.0f | %.3f | %.3f | %.0f | %.3f | %.3f | %.1f |\n",
              name.c_str(), c.hidden, c.layers, c.vocab, prompts, max_new, greedy_tps, chain_tps, per_token(r.chain),
              r.chain.tau(), tree_tps, per_token(r.tree), r.tree.tau(),
              r.tree.verifies > 0 ? double(r.tree.tree_nodes) / double(r.tree.verifies) : 0.0);
  std::fflush(stdout);
}

std::vector<std::string> names(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ','))
    if (!part.empty()) out.push_back(part);
  return out;
}

}  // namespace

int run_eval(int argc, char** argv) {
  CliApp app("One process (TP 1): greedy, chain speculative and tree speculative decoding of the same prompts: "
             "tokens/s, target forwards per token, tau and tau_tree.", "dflash_bench eval");
  std::string configs = "tiny,larger", target_dir, drafter_dir, prompt_file;
  int n_prompts = 8, prompt_len = 32, max_new = 64;
  eval::TreeOptions tree;
  tree.budget = 16;
  tree.topk = 4;
  app.add_option("--config", configs, "built-in random target + untrained drafter pairs: tiny, larger (empty: none)")
      ->type_name("LIST");
  app.add_option("--prompts", n_prompts, "prompts per row (random ids for the built-in configs; the first N of "
                 "--prompt-file)")->check(positive_number());
  app.add_option("--prompt-len", prompt_len, "the built-in prompts' length")->check(positive_number());
  app.add_option("--max-new", max_new, "new tokens per prompt")->check(positive_number());
  app.add_option("--tree-budget", tree.budget, "tree nodes per verify")->check(positive_number());
  app.add_option("--tree-topk", tree.topk, "candidates per block position")->check(positive_number());
  // one more row for a real pair (docs/eval.md): the three go together
  CLI::Option* target = app.add_option("--target", target_dir, "a real target (with --drafter, --prompt-file)")
      ->type_name("DIR");
  CLI::Option* drafter = app.add_option("--drafter", drafter_dir, "its drafter")->type_name("DIR");
  CLI::Option* file = app.add_option("--prompt-file", prompt_file, "its prompts")->type_name("P.h5");
  target->needs(drafter, file);
  drafter->needs(target, file);
  file->needs(target, drafter);
  if (!parse_command_line(app, argc, argv)) return 0;
  const bool pair = !target_dir.empty();

  std::printf("eval bench: 1 process (TP 1, OMP threads as set), %d prompts × up to %d new tokens, tree budget %d "
              "top-k %d; built-in rows: random target, untrained drafter (τ ≈ 1: the cost of the machinery)\n\n",
              n_prompts, max_new, tree.budget, tree.topk);
  std::printf("| config | target H × layers, vocab | prompts × new | greedy tokens/s | chain tokens/s | chain target "
              "forwards / token | τ | tree tokens/s | tree target forwards / token | τ_tree | tree nodes / verify |\n"
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);
  for (const std::string& name : names(configs)) {
    const Pair p = builtin(name);
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("dflash_bench_eval_" + name + "_" + std::to_string(::getpid()))).string();
    model::write_random_target(dir, p.target);
    model::DrafterParams<float> params(p.drafter);
    params.init_random(7, 0.02);
    Rng rng(11);
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n_prompts));
    for (auto& pr : prompts) {
      pr.resize(size_t(prompt_len));
      for (auto& t : pr) t = int32_t(rng.below(uint64_t(p.target.vocab - 1)));  // never the mask token
    }
    try {
      const Row r = measure(dir, p.drafter, params, p.taps, prompts, max_new, tree);
      print_row(name, p.target.config(), prompts.size(), max_new, r);
    } catch (...) {
      std::filesystem::remove_all(dir);
      throw;
    }
    std::filesystem::remove_all(dir);
  }
  if (pair) {
    const state::DrafterSource src = state::load_drafter_source(drafter_dir);
    const model::QwenConfig c = model::load_qwen_config(target_dir);
    DFLASH_USER_CHECK(src.drafter.config.vocab == c.vocab && src.drafter.config.hidden == c.hidden,
                      "--drafter {} does not fit the target {} (vocab / hidden)", src.dir, target_dir);
    io::Dataset prompt_set(prompt_file, c.vocab);
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t i = 0; i < prompt_set.size() && int(prompts.size()) < n_prompts; ++i)
      prompts.push_back(model::prompt_of(prompt_set.read(i), prompt_set.path()));
    DFLASH_USER_CHECK(!prompts.empty(), "{}: no prompts", prompt_set.path());
    const Row r = measure(target_dir, src.drafter.config, src.drafter.params, src.drafter.info.target_layer_ids,
                          prompts, max_new, tree);
    print_row("given: " + std::filesystem::path(src.dir).filename().string(), c, prompts.size(), max_new, r);
  }
  return 0;
}

}  // namespace dflash::bench
