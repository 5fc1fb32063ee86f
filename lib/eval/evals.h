#pragma once
// The one list of the in-training evals (docs/eval.md "During training"). A new eval is one file in lib/eval (an
// Evaluator, and a TargetEvaluator / ExtraPackets when it needs the target's side or packets of its own) and its
// lines here; the worker loops iterate what these return and name no eval.
#include <memory>
#include <string>
#include <vector>

#include "lib/comm/layout.h"
#include "lib/comm/transport.h"
#include "lib/config/config.h"
#include "lib/eval/evaluator.h"
#include "lib/io/dataset.h"
#include "lib/model/target.h"
#include "lib/train/run_plan.h"
#include "lib/train/stream_plan.h"
#include "lib/train/watchdog.h"

namespace dflash::eval {

// The stream both sides iterate: the training packets and every eval's extra packets (the held-out eval's).
train::StreamPlan make_stream_plan(const TrainConfig& cfg, const train::RunPlan& plan, const io::Dataset& data,
                                   const EvalInputs& eval);

// This drafter rank's evals, in the order they run after a step: held-out (every drafter rank), speculative
// (drafter rank 0, the exchange with TP rank 0 of the group that feeds it).
std::vector<std::unique_ptr<Evaluator>> make_drafter_evals(const TrainConfig& cfg, const train::RunPlan& plan,
                                                           const comm::RankLayout& layout, const EvalInputs& eval);

// This target rank's side of the evals: the speculative decode on the group that feeds drafter rank 0.
// Collective over `tp` (what they load).
std::vector<std::unique_ptr<TargetEvaluator>> make_target_evals(const TrainConfig& cfg, const train::RunPlan& plan,
                                                                const comm::RankLayout& layout,
                                                                model::TargetModel& target, comm::Transport& tp,
                                                                comm::Transport& world, const EvalInputs& eval,
                                                                train::Watchdog& watchdog);

// The τ the best checkpoint keeps: the speculative one when it is measured, else the held-out one; "" = none.
std::string best_checkpoint_metric(const TrainConfig& cfg);

}  // namespace dflash::eval
