#include "lib/eval/evals.h"

#include <filesystem>

#include "lib/core/error.h"
#include "lib/eval/heldout_eval.h"
#include "lib/eval/spec_eval.h"

namespace dflash::eval {

TrainingEvals make_training_evals(const TrainConfig& cfg, const train::RunPlan& plan, bool scan_tokens) {
  TrainingEvals evals;
  if (cfg.eval.every > 0) evals.push_back(std::make_unique<HeldoutTrainingEval>(cfg, plan, scan_tokens));
  if (cfg.eval.spec_every > 0) evals.push_back(std::make_unique<SpecTrainingEval>(cfg, plan));
  return evals;
}

train::StreamPlan make_stream_plan(const TrainConfig& cfg, const train::RunPlan& plan, const io::Dataset& data,
                                   const TrainingEvals& evals) {
  train::StreamPlan stream(cfg, plan, data);
  for (const auto& e : evals)
    if (auto packets = e->packets()) stream.add(std::move(packets));
  return stream;
}

std::vector<std::unique_ptr<Evaluator>> make_drafter_evals(const TrainingEvals& evals, const comm::RankLayout& layout) {
  std::vector<std::unique_ptr<Evaluator>> out;
  for (const auto& e : evals)
    if (auto side = e->drafter_side(layout)) out.push_back(std::move(side));
  return out;
}

std::vector<std::unique_ptr<TargetEvaluator>> make_target_evals(const TrainingEvals& evals, const TargetContext& ctx) {
  std::vector<std::unique_ptr<TargetEvaluator>> out;
  for (const auto& e : evals)
    if (auto side = e->target_side(ctx)) out.push_back(std::move(side));
  return out;
}

std::optional<state::TauMetric> best_checkpoint_metric(const TrainingEvals& evals) {
  std::optional<state::TauMetric> best;
  for (const auto& e : evals)
    if (const auto m = e->metric(); m && (!best || *m > *best)) best = m;
  return best;
}

void require_eval_file(const char* key, const std::string& path, const char* switch_key) {
  DFLASH_USER_CHECK(std::filesystem::is_regular_file(path),
                    "{} = {}: no such file; give an HDF5 dataset (data/README.md) or turn the eval off ({}: 0)", key,
                    path, switch_key);
}

}  // namespace dflash::eval
