#include "lib/eval/evals.h"

#include "lib/eval/heldout_eval.h"
#include "lib/eval/spec_eval.h"

namespace dflash::eval {

train::StreamPlan make_stream_plan(const TrainConfig& cfg, const train::RunPlan& plan, const io::Dataset& data,
                                   const EvalInputs& eval) {
  train::StreamPlan stream(cfg, plan, data);
  if (eval.data) stream.add(std::make_unique<HeldoutPackets>(cfg, *eval.data));
  return stream;
}

std::vector<std::unique_ptr<Evaluator>> make_drafter_evals(const TrainConfig& cfg, const train::RunPlan& plan,
                                                           const comm::RankLayout& layout, const EvalInputs& eval) {
  std::vector<std::unique_ptr<Evaluator>> evals;
  if (eval.data)
    evals.push_back(std::make_unique<HeldoutEval>(cfg, *eval.data, plan.drafter.block_size, layout.dp_rank));
  if (cfg.eval.spec_every > 0 && layout.dp_rank == 0)
    evals.push_back(std::make_unique<SpecEval>(cfg, layout.target_world_rank(layout.group, 0)));
  return evals;
}

std::vector<std::unique_ptr<TargetEvaluator>> make_target_evals(const TrainConfig& cfg, const train::RunPlan& plan,
                                                                const comm::RankLayout& layout,
                                                                model::TargetModel& target, comm::Transport& tp,
                                                                comm::Transport& world, const EvalInputs& eval,
                                                                train::Watchdog& watchdog) {
  std::vector<std::unique_ptr<TargetEvaluator>> evals;
  if (eval.prompts && layout.group == 0)
    evals.push_back(std::make_unique<SpecEvalTarget>(cfg, plan, target, tp, world, *eval.prompts,
                                                     layout.drafter_world_rank(0), watchdog));
  return evals;
}

std::string best_checkpoint_metric(const TrainConfig& cfg) {
  if (cfg.eval.spec_every > 0) return "spec_tau";
  return cfg.eval.every > 0 ? "eval_tau" : "";
}

}  // namespace dflash::eval
