#pragma once
// The in-training evals as components (torchtitan's `if validator.should_validate(step): validator.validate()`).
// Each eval is one TrainingEval, registered in lib/eval/evals.cpp and made once at start-up on every rank: it owns
// its config section (read there), opens and checks its input files, says what `--check` prints of it, and hands the
// job its parts: the drafter side (an Evaluator: due(), then run() after a step, returning its report record and
// the τ it measured for the best checkpoint), the target side (a TargetEvaluator) and packets of its own (an
// ExtraPackets source in the stream plan, lib/train/stream_plan.h, which both sides iterate). The worker loops,
// the job and --check iterate these and name no eval.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "lib/comm/layout.h"
#include "lib/comm/transport.h"
#include "lib/io/dataset.h"
#include "lib/model/target.h"
#include "lib/report/check_item.h"
#include "lib/report/log.h"
#include "lib/report/reporter.h"
#include "lib/state/best_checkpoint.h"
#include "lib/train/drafter_step.h"
#include "lib/train/packet.h"
#include "lib/train/stream_plan.h"
#include "lib/train/watchdog.h"

namespace dflash::eval {

// What a drafter-side eval may use when it runs (after step next_step - 1 trained).
struct EvalContext {
  int64_t next_step = 0;   // steps trained: the weights of ckpt/step_<next_step>
  train::DrafterStep& drafter;
  comm::Transport& dp;     // the drafter DP group (watched)
  comm::Transport& world;  // the world (watched)
  const std::function<const train::FeaturePacket&(double* wait_seconds)>& next_packet;  // this rank's next packet
};

struct EvalOutcome {
  report::ReportRecord report;            // the line and metrics record (logged and written by drafter rank 0)
  std::optional<state::TauMetric> metric;  // the τ's name for the best checkpoint; none: no τ
  double tau = 0;
};

// Drafter side: runs on the drafter ranks after a step.
class Evaluator {
 public:
  virtual ~Evaluator() = default;
  virtual std::string name() const = 0;  // for the end-of-run summary: "held-out eval"
  // Whether it runs after `next_step` steps; stop: the run stops after this step.
  virtual bool due(int64_t next_step, bool stop) const = 0;
  virtual EvalOutcome run(EvalContext& ctx) = 0;
  double seconds() const { return seconds_; }  // this rank's time in it so far

 protected:
  double seconds_ = 0;
};

// Target side: runs on the target ranks after the packets of a step.
class TargetEvaluator {
 public:
  virtual ~TargetEvaluator() = default;
  virtual bool due(int64_t next_step) const = 0;
  virtual void run(int64_t next_step, report::Logger& log) = 0;  // collective over the target's TP group
};

// What a target side is built from, on a target rank (collective over tp).
struct TargetContext {
  const comm::RankLayout& layout;
  model::TargetModel& target;
  comm::Transport& tp;     // this rank's target TP group (watched)
  comm::Transport& world;  // the world (watched)
  train::Watchdog& watchdog;
};

// One in-training eval as the job and --check see it. Its constructor opens and checks its input files (on every
// rank: an error is every rank's, world rank 0 prints it); a part it does not have is null (or none) here.
// Evals keep no state across a resume: what one measures depends on the weights and its files only, and the value
// the best checkpoint keeps is the checkpointer's, by metric() (lib/state/checkpointer.h).
class TrainingEval {
 public:
  virtual ~TrainingEval() = default;
  virtual std::string name() const = 0;
  // What the first drafter rank checks before the first step, with the training data's facts (and --check too):
  // an input that would measure nothing is refused.
  virtual void check_on_start() const {}
  // Its item of the --check report (lib/preflight/run_check.h), after check_on_start().
  virtual report::CheckItem check_item() const = 0;
  // Packets it streams after the training packets of a step (the stream plan registers them, in eval order).
  virtual std::unique_ptr<train::ExtraPackets> packets() const { return nullptr; }
  // Its drafter side on this drafter rank.
  virtual std::unique_ptr<Evaluator> drafter_side(const comm::RankLayout& layout) const { return nullptr; }
  // Its target side on this target rank (collective over ctx.tp: what it loads).
  virtual std::unique_ptr<TargetEvaluator> target_side(const TargetContext& ctx) const { return nullptr; }
  // The τ it measures, which the best checkpoint may keep.
  virtual std::optional<state::TauMetric> metric() const { return std::nullopt; }
};

// An eval's input file named by the config must exist before the job spends time loading the target: a user error
// naming `key` and the switch that turns the eval off.
void require_eval_file(const char* key, const std::string& path, const char* switch_key);

}  // namespace dflash::eval
