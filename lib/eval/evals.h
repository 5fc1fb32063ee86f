#pragma once
// The one list of the in-training evals (docs/eval.md "During training"). A new eval is its file pair in lib/eval
// (a TrainingEval: its config section, its input files, its --check item, its parts; lib/eval/evaluator.h), its
// line in make_training_evals and its keys (lib/config, docs/config.md); the job, --check and the worker loops
// iterate what these return and name no eval.
#include <memory>
#include <optional>
#include <vector>

#include "lib/comm/layout.h"
#include "lib/config/config.h"
#include "lib/eval/evaluator.h"
#include "lib/io/dataset.h"
#include "lib/state/best_checkpoint.h"
#include "lib/train/run_plan.h"
#include "lib/train/stream_plan.h"

namespace dflash::eval {

using TrainingEvals = std::vector<std::unique_ptr<TrainingEval>>;

// Every eval the config turns on, in the order they run after a step; each opens and checks its inputs here (on
// every rank). scan_tokens: check every token id of an input dataset on open (the target ranks, --check).
TrainingEvals make_training_evals(const TrainConfig& cfg, const train::RunPlan& plan, bool scan_tokens);

// The stream both sides iterate: the training packets and every eval's extra packets.
train::StreamPlan make_stream_plan(const TrainConfig& cfg, const train::RunPlan& plan, const io::Dataset& data,
                                   const TrainingEvals& evals);

// This drafter rank's side of the evals, in eval order.
std::vector<std::unique_ptr<Evaluator>> make_drafter_evals(const TrainingEvals& evals, const comm::RankLayout& layout);

// This target rank's side of the evals. Collective over ctx.tp (what they load).
std::vector<std::unique_ptr<TargetEvaluator>> make_target_evals(const TrainingEvals& evals, const TargetContext& ctx);

// The τ the best checkpoint keeps: the most preferred one an eval measures (TauMetric's order: the speculative τ
// over the held-out one); none: no eval measures a τ, no best checkpoint.
std::optional<state::TauMetric> best_checkpoint_metric(const TrainingEvals& evals);

}  // namespace dflash::eval
