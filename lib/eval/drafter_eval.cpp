#include "lib/eval/drafter_eval.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/backend.h"
#include "lib/comm/layout.h"
#include "lib/core/error.h"
#include "lib/core/named_enum.h"
#include "lib/core/timer.h"
#include "lib/model/target_identity.h"

namespace dflash::eval {

namespace {

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

// A mean of accepted lengths; over no anchor it is undefined (null in the JSON, not 0).
struct Mean {
  double sum = 0;
  int64_t n = 0;
  void add(int v) { sum += v, ++n; }
  double value() const { return n > 0 ? sum / double(n) : 0.0; }
  nlohmann::json json() const { return n > 0 ? nlohmann::json(value()) : nlohmann::json(nullptr); }
};

model::TargetOptions target_options(const DrafterEvalOptions& a) {
  model::TargetOptions o;
  o.device = a.device;
  o.precision = a.precision.value_or(kernels::default_precision(a.device));
  // which device computes in which precision is the backend factory's answer (kernels/device.h)
  const std::string refusal = kernels::backend_refusal(a.device, o.precision);
  DFLASH_USER_CHECK(refusal.empty(), "--precision {} with --device {}: {}", name_of(o.precision), name_of(a.device),
                    refusal);
  return o;
}

}  // namespace

struct DrafterEval::Impl {
  const DrafterEvalOptions a;
  comm::Transport& tp;
  const bool root;
  state::DrafterSource src;
  model::TargetModel target;
  model::GreedyHead head;
  SpecOptions so;
  TreeOptions tree;
  std::optional<io::Dataset> prompts;
  int64_t n = 0;  // prompts decoded
  model::TargetVocab vocab;                  // rank 0: the drafter's embedding and lm_head
  std::unique_ptr<DrafterProposer> drafter;  // rank 0
  std::vector<std::string> warnings;

  Impl(const DrafterEvalOptions& options, comm::Transport& t)
      : a(options),
        tp(t),
        root(t.rank() == 0),
        src(load_source(options)),
        target(bind_device(options, t), t, target_options(options)),
        head(options.target, t) {
    const model::DrafterConfig& dc = src.drafter.config;
    const model::QwenConfig& c = target.config();
    DFLASH_USER_CHECK(dc.vocab == c.vocab && dc.hidden == c.hidden,
                      "--drafter {}: vocab {} / hidden {} do not match the target {} (vocab {}, hidden {})", src.dir,
                      dc.vocab, dc.hidden, a.target, c.vocab, c.hidden);
    // a checkpoint trained against another target of the same shape: allowed (measuring a drafter on a sibling
    // target is a real question), but said, since τ then measures the transfer, not the training
    if (root && !src.target_identity.empty()) {
      const std::string here = model::target_identity(a.target);
      if (here != src.target_identity)
        warnings.push_back(fmt::format("--drafter {} was trained against a target with identity '{}'; --target {} has "
                                       "'{}' (another fine-tune or revision): tau measures the drafter on a different "
                                       "target", src.dir, src.target_identity, a.target, here));
    }
    for (int id : src.drafter.info.target_layer_ids)
      DFLASH_USER_CHECK(id < c.layers, "--drafter {}: target_layer_ids has {}, the target has {} layers", src.dir, id,
                        c.layers);
    so.block_size = dc.block_size;
    so.tap_layer_ids = src.drafter.info.target_layer_ids;
    so.eos_id = a.eos;
    so.vocab_limit = a.vocab_limit.value_or(dc.mask_token_id == c.vocab - 1 ? c.vocab - 1 : 0);
    so.max_new_tokens = a.max_new_tokens;
    DFLASH_USER_CHECK(so.eos_id < c.vocab, "--eos {}: not a token id of the target (vocab {})", so.eos_id, c.vocab);
    DFLASH_USER_CHECK(so.vocab_limit >= 0 && so.vocab_limit <= c.vocab, "--vocab-limit {}: must be in [1, vocab {}]",
                      so.vocab_limit, c.vocab);
    tree.budget = a.tree_budget.value_or(0);
    tree.topk = a.tree_topk.value_or(4);
    if (a.tree_budget) {
      DFLASH_USER_CHECK(tree.budget >= 1, "--tree-budget {}: must be >= 1 (nodes besides the root; {} = the chain's "
                        "length)", tree.budget, dc.block_size - 1);
      DFLASH_USER_CHECK(tree.topk >= 1 && tree.topk <= (so.vocab_limit > 0 ? so.vocab_limit : c.vocab),
                        "--tree-topk {}: must be in [1, the vocabulary]", tree.topk);
      DFLASH_USER_CHECK(!c.hybrid, "--tree-budget: the target {} has Gated DeltaNet layers, whose recurrent state "
                        "cannot branch within one forward; tree verification needs a dense target (drop "
                        "--tree-budget for chain decoding)", a.target);
    } else {
      DFLASH_USER_CHECK(!a.tree_topk, "--tree-topk needs --tree-budget N");
    }
    prompts.emplace(a.prompts, c.vocab);
    n = model::check_prompts(*prompts, a.limit);
    DFLASH_USER_CHECK(n > 0, "{}: no prompts", prompts->path());
    model::check_generation_fits(c, a.target, *prompts, n, so.max_new_tokens, dc.block_size, "--max-new-tokens");
    if (root) {
      vocab = model::load_target_vocab(a.target);
      drafter = std::make_unique<DrafterProposer>(dc, src.drafter.params, vocab.embedding.data(), vocab.lm_head(),
                                                  so.vocab_limit);
    }
  }

  static state::DrafterSource load_source(const DrafterEvalOptions& a) {
    DFLASH_USER_CHECK(std::filesystem::is_directory(a.target), "--target {}: not a directory (a model directory "
                      "with config.json and *.safetensors)", a.target);
    return state::load_drafter_source(a.drafter);
  }

  // --device cuda: the target's forward on the GPU (the drafter and the greedy head stay on the CPU: a block of
  // drafts and one argmax row per verify cost far less than the target's forward); rank r binds node-local GPU r.
  static const std::string& bind_device(const DrafterEvalOptions& a, comm::Transport& t) {
    const bool cuda = a.device == kernels::Device::cuda;
    target_options(a);  // a refused --precision before a GPU is bound
    DFLASH_USER_CHECK(!(cuda && a.tree_budget), "--tree-budget needs --device cpu: tree verification's attention is "
                      "a CPU kernel (docs/eval.md)");
    if (cuda) kernels::bind_cuda_device(t.size() > 1 ? comm::node_local_rank(MPI_COMM_WORLD) : 0);
    return a.target;
  }
};

DrafterEval::DrafterEval(const DrafterEvalOptions& options, comm::Transport& tp)
    : impl_(std::make_unique<Impl>(options, tp)) {}
DrafterEval::~DrafterEval() = default;

std::vector<std::string> DrafterEval::warnings() const { return impl_->warnings; }

std::string DrafterEval::describe() const {
  const Impl& m = *impl_;
  return fmt::format("eval: drafter {} ({}{}, block {}, taps {}) on target {} (TP {}), {} prompts, up to {} new "
                     "tokens each", m.src.dir, m.src.kind, m.src.step >= 0 ? fmt::format(" step {}", m.src.step) : "",
                     m.so.block_size, fmt::join(m.so.tap_layer_ids, ","), m.a.target, m.tp.size(), m.n,
                     m.so.max_new_tokens);
}

// What the decoding of every prompt added up to.
struct DrafterEval::Totals {
  SpecSummary sum, sum_tree;        // chain decoding; tree decoding (--tree-budget)
  double greedy_seconds = 0;        // plain greedy decoding of the same prompts (--check-greedy)
  Mean forced_all, forced_visited;  // --teacher-forced: over every anchor, over the anchors speculative decoding used
  explicit Totals(int block_size) : sum(block_size), sum_tree(block_size) {}
};

DrafterEvalResult DrafterEval::run() {
  Impl& m = *impl_;
  const DrafterEvalOptions& a = m.a;
  const bool with_tree = a.tree_budget.has_value();
  model::GenerateOptions g;
  g.max_new_tokens = m.so.max_new_tokens;
  g.eos_id = m.so.eos_id;
  g.vocab_limit = m.so.vocab_limit;
  Totals t(m.so.block_size);
  SpecSummary &sum = t.sum, &sum_tree = t.sum_tree;
  Mean &forced_all = t.forced_all, &forced_visited = t.forced_visited;
  for (int64_t i = 0; i < m.n; ++i) {
    const std::vector<int32_t> prompt = model::prompt_of(m.prompts->read(i), m.prompts->path());
    const SpecResult r = speculative_generate(m.target, m.head, m.tp, m.drafter.get(), prompt, m.so);
    if (a.check_greedy) {
      Timer greedy_timer;
      const std::vector<int32_t> greedy = model::greedy_generate(m.target, m.head, prompt, g);
      t.greedy_seconds += greedy_timer.seconds();
      DFLASH_CHECK(greedy == r.tokens, "{}: prompt {}: speculative output differs from plain greedy decoding "
                   "(a bug: please report it with this prompt)", m.prompts->path(), i);
    }
    sum.add(r);
    if (with_tree) {
      const SpecResult tr = speculative_generate_tree(m.target, m.head, m.tp, m.drafter.get(), prompt, m.so, m.tree);
      DFLASH_CHECK(tr.tokens == r.tokens, "{}: prompt {}: tree decoding differs from chain decoding (a bug: please "
                   "report it with this prompt)", m.prompts->path(), i);
      sum_tree.add(tr);
    }
    if (a.teacher_forced) {
      std::vector<int32_t> sequence = prompt;
      sequence.insert(sequence.end(), r.tokens.begin(), r.tokens.end());
      std::vector<int> forced;
      teacher_forced_acceptance(m.target, m.tp, m.drafter.get(), sequence, int(prompt.size()), m.so.tap_layer_ids,
                                m.so.block_size, forced);
      for (int k : forced) forced_all.add(k);
      size_t at = 0;  // the anchors speculative decoding visited: prompt end, then after each verify's kept tokens
      for (int k : r.accepted) {
        if (at < forced.size()) forced_visited.add(forced[at]);
        at += size_t(k);
      }
    }
  }
  return m.root ? summarize(t) : DrafterEvalResult{};
}

DrafterEvalResult DrafterEval::summarize(const Totals& t) const {
  const Impl& m = *impl_;
  const DrafterEvalOptions& a = m.a;
  const bool with_tree = a.tree_budget.has_value();
  const SpecSummary &sum = t.sum, &sum_tree = t.sum_tree;
  const double greedy_seconds = t.greedy_seconds;
  DrafterEvalResult out;
  nlohmann::ordered_json& j = out.json;
  j["drafter"] = m.src.dir;
  j["drafter_kind"] = m.src.kind;
  if (m.src.step >= 0) j["step"] = m.src.step;
  j["target"] = a.target;
  j["target_tp"] = m.tp.size();
  j["prompts_file"] = m.prompts->path();
  j["max_new_tokens"] = m.so.max_new_tokens;
  j["lossless_checked"] = a.check_greedy;
  const nlohmann::ordered_json totals = sum.to_json();
  for (auto& [k, v] : totals.items()) j[k] = v;
  if (with_tree) {
    const nlohmann::ordered_json tree = sum_tree.to_json();
    j["tree_budget"] = m.tree.budget;
    j["tree_topk"] = m.tree.topk;
    for (const char* k : {"tau", "kept_histogram", "acceptance_by_position", "verify_forwards", "target_forwards",
                          "target_forwards_per_token", "tokens_per_second", "seconds"})
      j[std::string(k) + "_tree"] = tree[k];
    j["tree_nodes_per_verify"] = tree["tree_nodes_per_verify"];
  }
  j["drafter_seconds"] = m.drafter->seconds();
  if (a.check_greedy) {
    j["greedy_seconds"] = greedy_seconds;
    j["speedup_vs_greedy"] = sum.seconds > 0 ? greedy_seconds / sum.seconds : 0.0;
  }
  if (a.teacher_forced) {
    j["teacher_forced_tau"] = t.forced_all.json();
    j["teacher_forced_anchors"] = t.forced_all.n;
    j["teacher_forced_tau_visited"] = t.forced_visited.json();
  }
  const nlohmann::json tt = training_tau(m.src);
  j["training_tau"] = tt.is_null() ? nlohmann::json(nullptr) : tt["tau"];
  out.lines.push_back(fmt::format(
      "eval: tau {} (speculative, {} verify forwards) | training tau {} | {:.3f} target forwards per token | {:.1f} "
      "tokens/s{} | acceptance by position {}{}",
      sum.verifies > 0 ? fmt::format("{:.3f}", sum.tau())
                       : "undefined (no verify ran: every prompt ended before a draft was verified)",
      sum.verifies,
      tt.is_null() ? "n/a" : fmt::format("{:.3f} (step {})", tt["tau"].get<double>(), tt["step"].get<int64_t>()),
      j["target_forwards_per_token"].get<double>(), j["tokens_per_second"].get<double>(),
      a.check_greedy ? fmt::format(" ({:.2f}x plain greedy)", j["speedup_vs_greedy"].get<double>()) : "",
      fmt::format("[{:.2f}]", fmt::join(sum.acceptance_by_position(), ", ")),
      a.check_greedy ? " | lossless: identical to greedy" : ""));
  if (with_tree)
    out.lines.push_back(fmt::format(
        "eval: tau_tree {:.3f} (trees of up to {} nodes + the root from the top {} per position, {:.1f} nodes per "
        "verify, {} verify forwards) vs tau {:.3f} | {:.3f} target forwards per token | {:.1f} tokens/s | kept {}",
        sum_tree.tau(), m.tree.budget, m.tree.topk, j["tree_nodes_per_verify"].get<double>(), sum_tree.verifies,
        sum.tau(), j["target_forwards_per_token_tree"].get<double>(), j["tokens_per_second_tree"].get<double>(),
        fmt::format("[{}]", fmt::join(sum_tree.kept_histogram, ", "))));
  if (a.teacher_forced)
    out.lines.push_back(fmt::format(
        "eval: teacher-forced tau on the generated sequences {:.3f} over all {} anchors, {:.3f} over the {} anchors "
        "speculative decoding visited (docs/eval.md: why these differ)", t.forced_all.value(), t.forced_all.n,
        t.forced_visited.value(), t.forced_visited.n));
  return out;
}

}  // namespace dflash::eval
