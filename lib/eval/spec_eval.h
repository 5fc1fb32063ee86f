#pragma once
// The real speculative τ while training (docs/eval.md "During training"). After every eval.spec_every steps the
// first drafter rank sends its fp32 weights to TP rank 0 of the target group that feeds it; that group decodes
// the first eval.spec_prompts prompts of eval.prompts exactly as dflash_eval does (lib/eval/spec_decode.h: the
// drafter on TP rank 0, drafts broadcast, eval.max_new_tokens tokens per prompt, no eos, the mask token kept out
// as dflash_eval's default --vocab-limit), and TP rank 0 sends the totals back. The first drafter rank writes one
// {"kind": "spec_eval"} metrics record and a progress line. Same weights, prompts and limits: the same τ as
// `dflash_eval --drafter <out_dir>/ckpt/step_N` (tests/integration/train_eval.sh).
//
// Never a hang on a stop: the first drafter rank does the exchange after every step it trains whose count is a
// multiple of eval.spec_every, before anything else it sends (also when it stops after that step), and waits for
// the answer. The target side, after the packets of such a step, waits for the weights or for that drafter's
// stop message (kTagStop): a stop that arrives first means the drafter never trained the step, so no weights are
// coming; the stop message is left for PacketSender::finish.
//
// Memory on that TP rank 0: a copy of the drafter's weights (4 bytes per parameter), the target's embedding and
// lm_head ([V, H] fp32 each, one when tied), the drafter's activations for one block over the context, and on
// every TP rank of the group the greedy head's lm_head shard ([V/tp, H]) and the decode's KV cache.
#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "lib/comm/transport.h"
#include "lib/config/config.h"
#include "lib/eval/evaluator.h"
#include "lib/io/dataset.h"
#include "lib/model/target.h"
#include "lib/report/log.h"
#include "lib/train/run_plan.h"
#include "lib/train/watchdog.h"

namespace dflash::eval {

// True when the speculative eval runs after `next_step` steps (a count, 1-based).
bool spec_eval_due(const TrainConfig& cfg, int64_t next_step);
// Prompts decoded: the first eval.spec_prompts of `prompts` (each checked to have a prompt).
int64_t spec_eval_prompt_count(const TrainConfig& cfg, const io::Dataset& prompts);

// Target side, on every TP rank of the group that feeds drafter rank 0.
class SpecEvalTarget : public TargetEvaluator {
 public:
  // Collective over `tp` (loads the greedy head's lm_head shard; TP rank 0 also the embedding and lm_head).
  SpecEvalTarget(const TrainConfig& cfg, const train::RunPlan& plan, model::TargetModel& target, comm::Transport& tp,
                 comm::Transport& world, const io::Dataset& prompts, int drafter0_world_rank,
                 train::Watchdog& watchdog);
  ~SpecEvalTarget();
  // After the packets of the step that ends at `next_step` steps (spec_eval_due): the exchange described above.
  // Collective over `tp`. Returns false when drafter rank 0 stopped before that step (nothing decoded).
  bool decode(int64_t next_step, report::Logger& log);
  bool due(int64_t next_step) const override { return spec_eval_due(cfg_, next_step); }
  void run(int64_t next_step, report::Logger& log) override { decode(next_step, log); }

 private:
  struct Impl;
  const TrainConfig& cfg_;
  std::unique_ptr<Impl> impl_;
};

// Drafter side, on drafter rank 0: sends `weights` ([P] fp32) to the target's TP rank 0 and returns its totals
// (SpecSummary::to_json). Blocks until the group has decoded every prompt.
nlohmann::ordered_json spec_eval_exchange(comm::Transport& world, const std::vector<float>& weights,
                                          int target_rank0);

// The drafter side as a component, on drafter rank 0 only: due after every eval.spec_every steps, also when the
// run stops after this step (its target group waits for the weights). Its τ is spec_tau.
class SpecEval : public Evaluator {
 public:
  SpecEval(const TrainConfig& cfg, int target_rank0) : cfg_(cfg), target_rank0_(target_rank0) {}
  std::string name() const override { return "speculative eval"; }
  bool due(int64_t next_step, bool) const override { return spec_eval_due(cfg_, next_step); }
  EvalOutcome run(EvalContext& ctx) override;

 private:
  const TrainConfig& cfg_;
  int target_rank0_;
};

// The speculative eval as the job builds it (lib/eval/evals.cpp, when eval.spec_every > 0): eval.prompts opened on
// every rank, each prompt used checked to have a prompt and to fit the target's positions with its new tokens; its
// drafter side on drafter rank 0, its target side on the target group that feeds it (group 0).
class SpecTrainingEval : public TrainingEval {
 public:
  SpecTrainingEval(const TrainConfig& cfg, const train::RunPlan& plan);
  std::string name() const override { return "speculative eval"; }
  report::CheckItem check_item() const override;  // "eval prompts   PATH: N prompts x M new tokens every K steps"
  std::unique_ptr<Evaluator> drafter_side(const comm::RankLayout& layout) const override;
  std::unique_ptr<TargetEvaluator> target_side(const TargetContext& ctx) const override;
  std::optional<state::TauMetric> metric() const override { return state::TauMetric::spec_tau; }

 private:
  const TrainConfig& cfg_;
  const train::RunPlan& plan_;
  io::Dataset prompts_;
  int64_t count_;  // prompts decoded per eval
};

// {"step": N, "kind": "spec_eval", "spec_tau": ..., ...}: the totals with keys prefixed "spec_".
nlohmann::ordered_json spec_eval_record(int64_t step, const nlohmann::ordered_json& totals);
// "spec eval step N | tau ... (speculative, K prompts x M tokens) | kept histogram [...] | S s"
std::string spec_eval_line(int64_t step, const nlohmann::ordered_json& totals);

}  // namespace dflash::eval
