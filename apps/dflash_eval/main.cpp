// dflash_eval --target DIR --drafter DIR --prompts P.h5 [--max-new-tokens 128] [--limit K] [--eos ID]
//             [--vocab-limit N] [--out eval.json] [--check-greedy] [--teacher-forced] [--tree-budget N [--tree-topk K]]
//             [--device cpu|cuda [--precision bf16|fp32]]
// The real acceptance length: greedy speculative decoding of every prompt with the target and the drafter
// (lib/eval/spec_decode.h, docs/eval.md). Single process = TP 1; `mpirun -np K dflash_eval ...` runs the target
// as one TP group of K ranks with the drafter on rank 0 (the drafter's block costs far less than the target's
// verify forward, and the ranks must wait for the drafts anyway). Rank 0 prints and writes the JSON.
#include "lib/comm/mpi_init.h"
#include "lib/comm/mpi_transport.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/backend.h"
#include "lib/comm/layout.h"
#include "lib/core/cli_app.h"
#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/io/dataset.h"
#include "lib/model/generate.h"
#include "lib/eval/spec_decode.h"
#include "lib/eval/spec_tree.h"
#include "lib/model/target.h"
#include "lib/state/drafter_source.h"
#include "lib/preflight/target_identity.h"

using namespace dflash;

namespace {

// The command line; an absent optional option has a default that depends on the models (see evaluate).
struct EvalOptions {
  std::string target, drafter, prompts, out, device = "cpu";
  std::optional<std::string> precision;  // default: bf16 on cuda, fp32 on the CPU
  int max_new_tokens = 128;
  int64_t limit = 0;
  int eos = -1;
  std::optional<int> vocab_limit;  // default: the drafter's mask_token_id when it is the target's last id
  std::optional<int> tree_budget;  // given: also tree decoding
  std::optional<int> tree_topk;    // default 4; needs --tree-budget
  bool check_greedy = false, teacher_forced = false;
};

constexpr const char* kDescription =
    "dflash_eval: the real acceptance length of a drafter: greedy speculative decoding of every prompt with the target "
    "and the drafter (docs/eval.md). Single process = TP 1; `mpirun -np K dflash_eval ...` runs the target as one TP "
    "group of K ranks (the drafter on rank 0, which prints and writes the JSON).";

// Fills o from argv; else the exit code (--help, a usage error: lib/core/cli_app.h).
std::optional<int> parse_options(int argc, char** argv, EvalOptions& o) {
  CliApp app(kDescription, "dflash_eval");
  app.add_option("--target", o.target, "the target model (Hugging Face directory)")->required()->type_name("DIR");
  app.add_option("--drafter", o.drafter, "a training run folder (its newest complete checkpoint), a ckpt/step_* "
                 "folder, or an exported drafter folder (config.json + model.safetensors)")->required()->type_name("DIR");
  app.add_option("--prompts", o.prompts, "a dataset; each sequence's prompt is its tokens before the first "
                 "loss_mask = 1 (text prompt sets: dflash_data import-prompts / data/prep/dflash-prep prompts)")
      ->required()->type_name("P.h5");
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens generated per prompt")->check(CLI::Range(1, 1 << 20));
  app.add_option("--limit", o.limit, "only the first K prompts (0 = every prompt)")->check(non_negative_number());
  app.add_option("--eos", o.eos, "stop a prompt after the target generates ID (-1 = never)")->type_name("ID");
  app.add_option("--vocab-limit", o.vocab_limit, "generate only ids < N (default: the drafter's mask_token_id when "
                 "it is the last id)")->check(non_negative_number());
  app.add_option("--out", o.out, "write the results as JSON (atomically)")->type_name("FILE");
  app.add_flag("--check-greedy", o.check_greedy, "also decode each prompt plainly and fail unless the tokens are "
               "identical");
  app.add_flag("--teacher-forced", o.teacher_forced, "also the teacher-forced tau of the drafter on the generated "
               "sequences (every anchor, and only the anchors speculative decoding visited)");
  app.add_option("--tree-budget", o.tree_budget, "also decode with tree verification: up to N candidate nodes from "
                 "the drafter's top-k per block position, verified in one target forward (dense targets); reports "
                 "tau_tree (checked below: >= 1)");
  app.add_option("--tree-topk", o.tree_topk, "candidates per block position for the tree (default 4)")
      ->check(positive_number());
  app.add_option("--device", o.device, "cuda: the target's forward on the GPU (rank r of mpirun: GPU node-local r); "
                 "the drafter and the head stay on the CPU. Chain decoding only (--tree-budget needs the CPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--precision", o.precision, "the GPU target's precision: bf16 (default there: as it is served) or "
                 "fp32; the CPU runs fp32")->check(CLI::IsMember({"bf16", "fp32"}));
  return parse_or_exit_code(app, argc, argv);
}

// The teacher-forced τ of the run's last metrics record, when the drafter came from a training run.
nlohmann::json training_tau(const state::DrafterSource& src) {
  if (src.kind != "checkpoint") return nullptr;
  const std::filesystem::path metrics = std::filesystem::path(src.dir).parent_path().parent_path() / "metrics.jsonl";
  std::ifstream f(metrics);
  std::string line, last;
  while (std::getline(f, line))
    if (line.find("\"tau\"") != std::string::npos) last = line;
  if (last.empty()) return nullptr;
  const nlohmann::json j = nlohmann::json::parse(last, nullptr, false);
  if (j.is_discarded() || !j.contains("tau")) return nullptr;
  return {{"tau", j["tau"]}, {"step", j.value("step", int64_t(-1))}, {"file", metrics.string()}};
}

int evaluate(const EvalOptions& a, comm::Transport& tp) {
  const bool root = tp.rank() == 0;
  const std::string& target_dir = a.target;
  DFLASH_USER_CHECK(std::filesystem::is_directory(target_dir), "--target {}: not a directory (a model directory "
                    "with config.json and *.safetensors)", target_dir);
  const state::DrafterSource src = state::load_drafter_source(a.drafter);
  const model::DrafterConfig& dc = src.drafter.config;
  // the target's forward on the GPU (the drafter and the greedy head stay on the CPU: a block of drafts and one
  // argmax row per verify cost far less than the target's forward)
  const std::string& device = a.device;
  model::TargetOptions target_options;
  target_options.cuda = device == "cuda";
  target_options.precision = a.precision.value_or(target_options.cuda ? "bf16" : "fp32");
  DFLASH_USER_CHECK(target_options.precision == "fp32" || (target_options.cuda && target_options.precision == "bf16"),
                    "--precision {} with --device {}: the CPU runs fp32, CUDA fp32 or bf16", target_options.precision,
                    device);
  DFLASH_USER_CHECK(!(target_options.cuda && a.tree_budget), "--tree-budget needs --device cpu: tree "
                    "verification's attention is a CPU kernel (docs/eval.md)");
  if (target_options.cuda) kernels::bind_cuda_device(tp.size() > 1 ? comm::node_local_rank(MPI_COMM_WORLD) : 0);
  model::TargetModel target(target_dir, tp, target_options);
  model::GreedyHead head(target_dir, tp);
  const model::QwenConfig& c = target.config();
  DFLASH_USER_CHECK(dc.vocab == c.vocab && dc.hidden == c.hidden,
                    "--drafter {}: vocab {} / hidden {} do not match the target {} (vocab {}, hidden {})", src.dir,
                    dc.vocab, dc.hidden, target_dir, c.vocab, c.hidden);
  // a checkpoint trained against another target of the same shape: allowed (measuring a drafter on a sibling
  // target is a real question), but said, since τ then measures the transfer, not the training
  if (root && !src.target_identity.empty()) {
    const std::string here = preflight::target_identity(target_dir);
    if (here != src.target_identity)
      std::fprintf(stderr, "dflash_eval: warning: --drafter %s was trained against a target with identity '%s'; "
                   "--target %s has '%s' (another fine-tune or revision): tau measures the drafter on a different "
                   "target\n", src.dir.c_str(), src.target_identity.c_str(), target_dir.c_str(), here.c_str());
  }
  for (int id : src.drafter.info.target_layer_ids)
    DFLASH_USER_CHECK(id < c.layers, "--drafter {}: target_layer_ids has {}, the target has {} layers", src.dir, id,
                      c.layers);
  eval::SpecOptions so;
  so.block_size = dc.block_size;
  so.tap_layer_ids = src.drafter.info.target_layer_ids;
  so.eos_id = a.eos;
  so.vocab_limit = a.vocab_limit.value_or(dc.mask_token_id == c.vocab - 1 ? c.vocab - 1 : 0);
  const int64_t limit = a.limit;
  so.max_new_tokens = a.max_new_tokens;
  DFLASH_USER_CHECK(so.eos_id < c.vocab, "--eos {}: not a token id of the target (vocab {})", so.eos_id, c.vocab);
  DFLASH_USER_CHECK(so.vocab_limit >= 0 && so.vocab_limit <= c.vocab, "--vocab-limit {}: must be in [1, vocab {}]",
                    so.vocab_limit, c.vocab);
  eval::TreeOptions tree;
  tree.budget = a.tree_budget.value_or(0);
  tree.topk = a.tree_topk.value_or(4);
  const bool with_tree = a.tree_budget.has_value();
  if (with_tree) {
    DFLASH_USER_CHECK(tree.budget >= 1, "--tree-budget {}: must be >= 1 (nodes besides the root; {} = the chain's "
                      "length)", tree.budget, dc.block_size - 1);
    DFLASH_USER_CHECK(tree.topk >= 1 && tree.topk <= (so.vocab_limit > 0 ? so.vocab_limit : c.vocab),
                      "--tree-topk {}: must be in [1, the vocabulary]", tree.topk);
    DFLASH_USER_CHECK(!c.hybrid, "--tree-budget: the target {} has Gated DeltaNet layers, whose recurrent state "
                      "cannot branch within one forward; tree verification needs a dense target (drop --tree-budget "
                      "for chain decoding)", target_dir);
  } else {
    DFLASH_USER_CHECK(!a.tree_topk, "--tree-topk needs --tree-budget N");
  }
  io::Dataset prompts(a.prompts, c.vocab);
  const int64_t n = model::check_prompts(prompts, limit);
  DFLASH_USER_CHECK(n > 0, "{}: no prompts", prompts.path());
  model::check_generation_fits(c, target_dir, prompts, n, so.max_new_tokens, dc.block_size, "--max-new-tokens");

  model::TargetVocab vocab;
  std::unique_ptr<eval::DrafterProposer> drafter;
  if (root) {
    vocab = model::load_target_vocab(target_dir);
    drafter = std::make_unique<eval::DrafterProposer>(dc, src.drafter.params, vocab.embedding.data(), vocab.lm_head(),
                                                      so.vocab_limit);
    std::printf("eval: drafter %s (%s%s, block %d, taps %s) on target %s (TP %d), %lld prompts, up to %d new "
                "tokens each\n", src.dir.c_str(), src.kind.c_str(),
                src.step >= 0 ? fmt::format(" step {}", src.step).c_str() : "", dc.block_size,
                fmt::format("{}", fmt::join(so.tap_layer_ids, ",")).c_str(), target_dir.c_str(), tp.size(),
                (long long)n, so.max_new_tokens);
    std::fflush(stdout);
  }
  model::GenerateOptions g;
  g.max_new_tokens = so.max_new_tokens;
  g.eos_id = so.eos_id;
  g.vocab_limit = so.vocab_limit;
  eval::SpecSummary sum(dc.block_size), sum_tree(dc.block_size);
  double greedy_seconds = 0;  // plain greedy decoding of the same prompts (--check-greedy)
  struct Mean {
    double sum = 0;
    int64_t n = 0;
    void add(int v) { sum += v, ++n; }
    double value() const { return n > 0 ? sum / double(n) : 0.0; }
  } forced_all, forced_visited;  // --teacher-forced: over every anchor, over the anchors speculative decoding used
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int32_t> prompt = model::prompt_of(prompts.read(i), prompts.path());
    const eval::SpecResult r = eval::speculative_generate(target, head, tp, drafter.get(), prompt, so);
    if (a.check_greedy) {
      Timer greedy_timer;
      const std::vector<int32_t> greedy = model::greedy_generate(target, head, prompt, g);
      greedy_seconds += greedy_timer.seconds();
      DFLASH_CHECK(greedy == r.tokens, "{}: prompt {}: speculative output differs from plain greedy decoding "
                   "(a bug: please report it with this prompt)", prompts.path(), i);
    }
    sum.add(r);
    if (with_tree) {
      const eval::SpecResult t = eval::speculative_generate_tree(target, head, tp, drafter.get(), prompt, so, tree);
      DFLASH_CHECK(t.tokens == r.tokens, "{}: prompt {}: tree decoding differs from chain decoding (a bug: please "
                   "report it with this prompt)", prompts.path(), i);
      sum_tree.add(t);
    }
    if (a.teacher_forced) {
      std::vector<int32_t> sequence = prompt;
      sequence.insert(sequence.end(), r.tokens.begin(), r.tokens.end());
      std::vector<int> forced;
      eval::teacher_forced_acceptance(target, tp, drafter.get(), sequence, int(prompt.size()), so.tap_layer_ids,
                                      dc.block_size, forced);
      for (int m : forced) forced_all.add(m);
      size_t at = 0;  // the anchors speculative decoding visited: prompt end, then after each verify's kept tokens
      for (int m : r.accepted) {
        if (at < forced.size()) forced_visited.add(forced[at]);
        at += size_t(m);
      }
    }
  }
  if (root) {
    nlohmann::ordered_json j;
    j["drafter"] = src.dir;
    j["drafter_kind"] = src.kind;
    if (src.step >= 0) j["step"] = src.step;
    j["target"] = target_dir;
    j["target_tp"] = tp.size();
    j["prompts_file"] = prompts.path();
    j["max_new_tokens"] = so.max_new_tokens;
    j["lossless_checked"] = a.check_greedy;
    const nlohmann::ordered_json totals = sum.to_json();
    for (auto& [k, v] : totals.items()) j[k] = v;
    if (with_tree) {
      const nlohmann::ordered_json t = sum_tree.to_json();
      j["tree_budget"] = tree.budget;
      j["tree_topk"] = tree.topk;
      for (const char* k : {"tau", "kept_histogram", "acceptance_by_position", "verify_forwards", "target_forwards",
                            "target_forwards_per_token", "tokens_per_second", "seconds"})
        j[std::string(k) + "_tree"] = t[k];
      j["tree_nodes_per_verify"] = t["tree_nodes_per_verify"];
    }
    j["drafter_seconds"] = drafter->seconds();
    if (a.check_greedy) {
      j["greedy_seconds"] = greedy_seconds;
      j["speedup_vs_greedy"] = sum.seconds > 0 ? greedy_seconds / sum.seconds : 0.0;
    }
    if (a.teacher_forced) {
      // means over no anchor are undefined: null, not 0
      j["teacher_forced_tau"] = forced_all.n > 0 ? nlohmann::json(forced_all.value()) : nlohmann::json(nullptr);
      j["teacher_forced_anchors"] = forced_all.n;
      j["teacher_forced_tau_visited"] =
          forced_visited.n > 0 ? nlohmann::json(forced_visited.value()) : nlohmann::json(nullptr);
    }
    const nlohmann::json tt = training_tau(src);
    j["training_tau"] = tt.is_null() ? nlohmann::json(nullptr) : tt["tau"];
    if (!a.out.empty()) write_file_atomic(a.out, j.dump(2) + "\n");
    std::printf("eval: tau %s (speculative, %lld verify forwards) | training tau %s | %.3f target forwards per "
                "token | %.1f tokens/s%s | acceptance by position %s%s\n",
                sum.verifies > 0 ? fmt::format("{:.3f}", sum.tau()).c_str()
                                 : "undefined (no verify ran: every prompt ended before a draft was verified)",
                (long long)sum.verifies,
                tt.is_null() ? "n/a" : fmt::format("{:.3f} (step {})", tt["tau"].get<double>(),
                                                   tt["step"].get<int64_t>()).c_str(),
                j["target_forwards_per_token"].get<double>(), j["tokens_per_second"].get<double>(),
                a.check_greedy ? fmt::format(" ({:.2f}x plain greedy)", j["speedup_vs_greedy"].get<double>()).c_str()
                                      : "",
                fmt::format("[{:.2f}]", fmt::join(sum.acceptance_by_position(), ", ")).c_str(),
                a.check_greedy ? " | lossless: identical to greedy" : "");
    if (with_tree)
      std::printf("eval: tau_tree %.3f (trees of up to %d nodes + the root from the top %d per position, %.1f nodes per verify, "
                  "%lld verify forwards) vs tau %.3f | %.3f target forwards per token | %.1f tokens/s | kept %s\n",
                  sum_tree.tau(), tree.budget, tree.topk, j["tree_nodes_per_verify"].get<double>(),
                  (long long)sum_tree.verifies, sum.tau(), j["target_forwards_per_token_tree"].get<double>(),
                  j["tokens_per_second_tree"].get<double>(),
                  fmt::format("[{}]", fmt::join(sum_tree.kept_histogram, ", ")).c_str());
    if (a.teacher_forced)
      std::printf("eval: teacher-forced tau on the generated sequences %.3f over all %lld anchors, %.3f over the %lld "
                  "anchors speculative decoding visited (docs/eval.md: why these differ)\n", forced_all.value(),
                  (long long)forced_all.n, forced_visited.value(), (long long)forced_visited.n);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  EvalOptions options;
  if (const std::optional<int> rc = parse_options(argc, argv, options)) return *rc;
  return comm::run_mpi_program({"dflash_eval", /*only_when_launched=*/true}, argc, argv, [&](bool with_mpi) {
    if (!with_mpi) {
      comm::SelfTransport self;
      return evaluate(options, self);
    }
    comm::MpiTransport world(MPI_COMM_WORLD);
    return evaluate(options, world);
  });
}
