// spec_decode_check: speculative decoding (lib/eval/spec_decode.h) is lossless and counts acceptance right.
//
//   mpirun -np K spec_decode_check --target DIR --prompts P.h5 [--drafter DIR] [--count 4] [--max-new 40]
//                                  [--block 8] [--taps 1,2,3,4,5] [--vocab-limit 511] [--min-tau X]
//                                  [--tree-budget N --tree-topk K]
//
// For the first `count` prompts, on one TP group of K ranks, with each proposer:
//   random   an untrained drafter (seed 7): output == greedy_generate token for token;
//   drafter  the drafter in --drafter (run / checkpoint / export folder), same check; τ ≥ --min-tau when given;
//   oracle   proposes the target's own greedy continuation: every verify keeps B tokens, except the last, which
//            keeps exactly what is left of max_new_tokens;
//   wrong    proposes (greedy + 1) mod vocab_limit: every verify keeps exactly 1 token;
// and with an eos id taken from the middle of the greedy continuation, oracle and untrained drafter stop exactly where
// greedy_generate stops.
// With --tree-budget (lib/eval/spec_tree.h), for the untrained and the given drafter: tree decoding with budget N and
// top-k K == greedy_generate token for token, and budget B−1 with top-k 1 keeps exactly what the chain keeps, verify
// by verify (the same drafts, the same tokens); τ_tree is printed next to τ. A hybrid target must refuse the tree.
// Exit 0 when all hold; the first failure is an error naming the prompt, proposer and position.
#include "lib/comm/mpi_transport.h"
#include "tests/integration/mpi_test_main.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/io/dataset.h"
#include "lib/model/generate.h"
#include "lib/eval/spec_decode.h"
#include "lib/eval/spec_tree.h"
#include "lib/model/target.h"
#include "lib/state/drafter_source.h"

using namespace dflash;

namespace {

// Proposes the known greedy continuation (offset 0) or a token that differs from it at every position (offset 1).
class ReferenceProposer : public eval::BlockProposer {
 public:
  ReferenceProposer(const std::vector<int32_t>& full, int block, int offset, int vocab_limit)
      : full_(full), block_(block), offset_(offset), vocab_limit_(vocab_limit) {}
  void propose(const std::vector<int32_t>& tokens, const float*, int32_t* draft) override {
    const size_t p = tokens.size() - 1;
    for (int j = 1; j < block_; ++j) {
      const size_t at = p + size_t(j);
      const int32_t ref = at < full_.size() ? full_[at] : 0;
      draft[j - 1] = int32_t((ref + offset_) % vocab_limit_);
    }
  }

 private:
  const std::vector<int32_t>& full_;  // prompt + greedy continuation
  int block_, offset_, vocab_limit_;
};

// Passes through to another proposer and records each block's anchor and drafts.
class RecordingProposer : public eval::BlockProposer {
 public:
  explicit RecordingProposer(eval::BlockProposer* inner) : inner_(inner) {}
  void propose(const std::vector<int32_t>& tokens, const float* taps, int32_t* draft) override {
    inner_->propose(tokens, taps, draft);
    anchors.push_back(tokens.size() - 1);
    drafts.emplace_back(draft, draft + block_minus_1);
  }
  size_t block_minus_1 = 0;
  std::vector<size_t> anchors;
  std::vector<std::vector<int32_t>> drafts;

 private:
  eval::BlockProposer* inner_;
};

std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> ids;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) ids.push_back(std::stoi(part));
  return ids;
}

double tau(const eval::SpecResult& r) {
  return r.accepted.empty() ? 0.0
                            : double(std::accumulate(r.accepted.begin(), r.accepted.end(), 0)) / r.accepted.size();
}

int run(int argc, char** argv) {
  CliApp app("Speculative decoding is lossless against greedy decoding; oracle acceptance counts.",
             "spec_decode_check");
  std::string target_dir, prompts_path, drafter_dir, taps_text = "1,2,3,4,5";
  int count = 4, max_new = 40, block = 8;
  std::optional<int> vocab_limit_given;
  std::optional<double> min_tau;
  eval::TreeOptions tree;
  tree.budget = 0;
  tree.topk = 4;
  app.add_option("--target", target_dir, "the target")->required()->type_name("DIR");
  app.add_option("--prompts", prompts_path, "the prompts")->required()->type_name("P.h5");
  app.add_option("--drafter", drafter_dir, "also a trained drafter")->type_name("DIR");
  app.add_option("--count", count, "prompts")->check(positive_number());
  app.add_option("--max-new", max_new, "new tokens per prompt")->check(positive_number());
  app.add_option("--block", block, "the untrained drafter's block size")->check(positive_number());
  app.add_option("--taps", taps_text, "the untrained drafter's tapped layers")->type_name("LIST");
  app.add_option("--vocab-limit", vocab_limit_given, "generate only ids < N (default vocab - 1)");
  app.add_option("--min-tau", min_tau, "with --drafter: fail below this tau");
  app.add_option("--tree-budget", tree.budget, "also tree decoding with this budget (0 = none)")
      ->check(non_negative_number());
  app.add_option("--tree-topk", tree.topk, "the tree's top-k")->check(positive_number());
  if (!parse_command_line(app, argc, argv)) return 0;
  comm::MpiTransport tp(MPI_COMM_WORLD);
  const bool root = tp.rank() == 0;
  model::TargetModel target(target_dir, tp);
  model::GreedyHead head(target_dir, tp);
  const model::QwenConfig& c = target.config();
  io::Dataset prompts(prompts_path, c.vocab);

  // the drafters: untrained, and the given one (both need the target's embedding and lm_head on rank 0)
  std::unique_ptr<state::DrafterSource> trained;
  if (!drafter_dir.empty()) trained = std::make_unique<state::DrafterSource>(state::load_drafter_source(drafter_dir));
  model::DrafterConfig dc;
  std::vector<int> taps = parse_ids(taps_text);
  if (trained) {
    dc = trained->drafter.config;
    taps = trained->drafter.info.target_layer_ids;
  } else {
    dc.hidden = c.hidden, dc.layers = 2, dc.heads = 4, dc.kv_heads = 2, dc.head_dim = 16, dc.intermediate = 128;
    dc.block_size = block, dc.n_taps = int(taps.size()), dc.vocab = c.vocab;
    dc.mask_token_id = c.vocab - 1;
    dc.window = {0, 0};
  }
  dc.validate();
  const int B = dc.block_size, vocab_limit = vocab_limit_given.value_or(c.vocab - 1);
  model::DrafterParams<float> random_params(dc);
  random_params.init_random(7, 0.02);
  model::TargetVocab vocab;
  if (root) vocab = model::load_target_vocab(target_dir);
  std::unique_ptr<eval::DrafterProposer> random_drafter, trained_drafter;
  if (root) {
    random_drafter = std::make_unique<eval::DrafterProposer>(dc, random_params, vocab.embedding.data(), vocab.lm_head(),
                                                             vocab_limit);
    if (trained)
      trained_drafter = std::make_unique<eval::DrafterProposer>(dc, trained->drafter.params, vocab.embedding.data(),
                                                                vocab.lm_head(), vocab_limit);
  }

  model::GenerateOptions g;
  g.max_new_tokens = max_new;
  g.vocab_limit = vocab_limit;
  eval::SpecOptions so;
  so.block_size = B;
  so.tap_layer_ids = taps;
  so.max_new_tokens = max_new;
  so.vocab_limit = vocab_limit;
  std::vector<int> trained_accepted, random_accepted, forced_accepted, visited_forced;
  eval::TreeOptions chain_tree;  // budget B − 1, top-k 1: the chain as a tree
  chain_tree.budget = B - 1;
  chain_tree.topk = 1;
  std::vector<int> tree_accepted[2];  // [untrained, given drafter]
  for (int i = 0; i < count && i < prompts.size(); ++i) {
    const std::vector<int32_t> prompt = model::prompt_of(prompts.read(i), prompts.path());
    const std::vector<int32_t> greedy = model::greedy_generate(target, head, prompt, g);
    std::vector<int32_t> full = prompt;
    full.insert(full.end(), greedy.begin(), greedy.end());
    ReferenceProposer oracle(full, B, 0, vocab_limit), wrong(full, B, 1, vocab_limit);
    struct Case {
      const char* name;
      eval::BlockProposer* proposer;
    };
    std::vector<Case> cases = {{"random", random_drafter.get()}, {"oracle", &oracle}, {"wrong", &wrong}};
    RecordingProposer recorder(trained_drafter.get());
    recorder.block_minus_1 = size_t(B - 1);
    if (trained) cases.push_back({"drafter", &recorder});
    for (const Case& k : cases) {
      const eval::SpecResult r = eval::speculative_generate(target, head, tp, root ? k.proposer : nullptr, prompt, so);
      DFLASH_CHECK(r.tokens.size() == greedy.size(), "prompt {} proposer {}: {} tokens, greedy gave {}", i, k.name,
                   r.tokens.size(), greedy.size());
      for (size_t t = 0; t < greedy.size(); ++t)
        DFLASH_CHECK(r.tokens[t] == greedy[t], "prompt {} proposer {}: token {} is {}, greedy gives {}", i, k.name, t,
                     r.tokens[t], greedy[t]);
      const int kept = std::accumulate(r.accepted.begin(), r.accepted.end(), 0);
      DFLASH_CHECK(kept + 1 == int(greedy.size()) && r.target_forwards == int(r.accepted.size()) + 1,
                   "prompt {} proposer {}: {} tokens kept over {} verifies + the prefill token, {} generated", i,
                   k.name, kept, r.accepted.size(), greedy.size());
      // hybrid targets restore the DeltaNet state and re-run the kept inputs after every partial acceptance
      // (not after the last verify: the finished sequence's cache is dropped)
      const int partial = r.accepted.empty() ? 0 : int(std::count_if(r.accepted.begin(), r.accepted.end() - 1,
                                                                      [&](int m) { return m < B; }));
      DFLASH_CHECK(r.rollback_forwards == (c.hybrid ? partial : 0), "prompt {} proposer {}: {} rollback re-runs, "
                   "expected {} ({} target)", i, k.name, r.rollback_forwards, c.hybrid ? partial : 0,
                   c.hybrid ? "hybrid" : "dense");
      const std::string name = k.name;
      for (size_t v = 0; v < r.accepted.size(); ++v) {
        const bool last = v + 1 == r.accepted.size();
        if (name == "oracle")
          DFLASH_CHECK(last ? r.accepted[v] == max_new - 1 - int(v) * B : r.accepted[v] == B,
                       "prompt {} oracle: verify {} kept {} tokens, expected {}", i, v, r.accepted[v],
                       last ? max_new - 1 - int(v) * B : B);
        if (name == "wrong")
          DFLASH_CHECK(r.accepted[v] == 1, "prompt {} wrong drafts: verify {} kept {} tokens, expected 1", i, v,
                       r.accepted[v]);
      }
      if (name == "drafter") {
        trained_accepted.insert(trained_accepted.end(), r.accepted.begin(), r.accepted.end());
        // teacher-forced τ of the same drafter on the same sequence (every anchor in the continuation, full-forward
        // taps): what training measures; printed next to the speculative τ
        std::vector<int> forced;
        std::vector<std::vector<int32_t>> forced_drafts;
        eval::teacher_forced_acceptance(target, tp, root ? trained_drafter.get() : nullptr, full, int(prompt.size()),
                                        taps, B, forced, &forced_drafts);
        forced_accepted.insert(forced_accepted.end(), forced.begin(), forced.end());
        // where speculative decoding anchored a block, its drafts are the teacher-forced ones: the same context
        // (cached taps == full-forward taps), positions and mask as in training
        for (size_t v = 0; root && v < recorder.anchors.size(); ++v) {
          const size_t at = recorder.anchors[v] - prompt.size();
          DFLASH_CHECK(at < forced.size() && recorder.drafts[v] == forced_drafts[at], "prompt {}: the speculative "
                       "drafts at anchor {} differ from the teacher-forced drafts there", i, recorder.anchors[v]);
          visited_forced.push_back(forced[at]);
          DFLASH_CHECK(forced[at] == r.accepted[v], "prompt {}: at anchor {} speculative decoding kept {} tokens, "
                       "teacher forcing {}", i, recorder.anchors[v], r.accepted[v], forced[at]);
        }
      }
      if (name == "random") random_accepted.insert(random_accepted.end(), r.accepted.begin(), r.accepted.end());
      if (tree.budget > 0 && (name == "random" || name == "drafter") && !c.hybrid) {
        eval::TopkProposer* topk = name == "random" ? static_cast<eval::TopkProposer*>(random_drafter.get())
                                                    : static_cast<eval::TopkProposer*>(trained_drafter.get());
        const eval::SpecResult t =
            eval::speculative_generate_tree(target, head, tp, root ? topk : nullptr, prompt, so, tree);
        DFLASH_CHECK(t.tokens == greedy, "prompt {} proposer {}: tree decoding (budget {}, top-k {}) differs from "
                     "greedy ({} tokens vs {})", i, k.name, tree.budget, tree.topk, t.tokens.size(), greedy.size());
        DFLASH_CHECK(t.target_forwards == int(t.accepted.size()) + 1 &&
                         std::accumulate(t.accepted.begin(), t.accepted.end(), 0) + 1 == int(greedy.size()),
                     "prompt {} proposer {}: tree counts do not add up", i, k.name);
        tree_accepted[name == "random" ? 0 : 1].insert(tree_accepted[name == "random" ? 0 : 1].end(),
                                                       t.accepted.begin(), t.accepted.end());
        const eval::SpecResult ct =
            eval::speculative_generate_tree(target, head, tp, root ? topk : nullptr, prompt, so, chain_tree);
        DFLASH_CHECK(ct.tokens == r.tokens && ct.accepted == r.accepted, "prompt {} proposer {}: the tree of budget "
                     "B-1 = {} with top-k 1 does not keep what the chain keeps", i, k.name, B - 1);
        if (root)
          std::printf("prompt %d %-8s tree (budget %d, top-k %d): %zu tokens == greedy, tau_tree %.3f (chain %.3f, "
                      "%.1f nodes per verify); budget %d top-k 1 == chain\n", i, k.name, tree.budget, tree.topk,
                      t.tokens.size(), tau(t), tau(r), double(t.tree_nodes) / double(t.accepted.size()), B - 1);
      }
      if (root)
        std::printf("prompt %d (%zu tokens) %-8s: %zu tokens == greedy, %d target forwards + %d rollback re-runs, "
                    "tau %.3f\n", i, prompt.size(), k.name, r.tokens.size(), r.target_forwards, r.rollback_forwards,
                    tau(r));
    }
    if (tree.budget > 0 && c.hybrid) {
      bool refused = false;
      try {
        eval::speculative_generate_tree(target, head, tp, root ? random_drafter.get() : nullptr, prompt, so, tree);
      } catch (const Error& e) {
        refused = std::string(e.what()).find("needs a dense target") != std::string::npos;
      }
      DFLASH_CHECK(refused, "prompt {}: tree verification on a hybrid target was not refused", i);
      if (root) std::printf("prompt %d: tree verification refused on the hybrid target\n", i);
    }
    // an eos the greedy continuation produces halfway (its first occurrence): both stop right after it
    model::GenerateOptions ge = g;
    ge.eos_id = greedy[greedy.size() / 2];
    eval::SpecOptions se = so;
    se.eos_id = ge.eos_id;
    const std::vector<int32_t> greedy_eos = model::greedy_generate(target, head, prompt, ge);
    DFLASH_CHECK(greedy_eos.back() == ge.eos_id && greedy_eos.size() <= greedy.size() / 2 + 1,
                 "prompt {}: greedy_generate did not stop at eos {}", i, ge.eos_id);
    for (eval::BlockProposer* proposer :
         {static_cast<eval::BlockProposer*>(&oracle), static_cast<eval::BlockProposer*>(random_drafter.get())}) {
      const eval::SpecResult r = eval::speculative_generate(target, head, tp, root ? proposer : nullptr, prompt, se);
      DFLASH_CHECK(r.tokens == greedy_eos, "prompt {}: with eos {} speculative decoding gave {} tokens, greedy {}", i,
                   ge.eos_id, r.tokens.size(), greedy_eos.size());
    }
    if (root) std::printf("prompt %d: eos %d stops both after %zu tokens\n", i, ge.eos_id, greedy_eos.size());
  }
  auto mean = [](const std::vector<int>& v) {
    return v.empty() ? 0.0 : double(std::accumulate(v.begin(), v.end(), 0)) / double(v.size());
  };
  if (root) {
    std::printf("TP %d (%s target): lossless for every proposer; untrained drafter tau %.3f", tp.size(),
                c.hybrid ? "hybrid" : "dense", mean(random_accepted));
    if (trained)
      std::printf(", drafter %s tau %.3f; teacher-forced on the same sequences: %.3f over all %zu anchors, %.3f over "
                  "the %zu anchors speculative decoding visited",
                  trained->dir.c_str(), mean(trained_accepted), mean(forced_accepted), forced_accepted.size(),
                  mean(visited_forced), visited_forced.size());
    if (tree.budget > 0 && !c.hybrid) {
      std::printf("; tree (budget %d, top-k %d) lossless: untrained tau_tree %.3f", tree.budget, tree.topk,
                  mean(tree_accepted[0]));
      if (trained) std::printf(", drafter tau_tree %.3f (chain %.3f)", mean(tree_accepted[1]), mean(trained_accepted));
    }
    std::printf("\n");
  }
  if (trained && min_tau) {
    DFLASH_CHECK(mean(trained_accepted) >= *min_tau, "drafter tau {:.3f} is below --min-tau {}",
                 mean(trained_accepted), *min_tau);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return test::mpi_test_main("spec_decode_check", argc, argv, run); }
