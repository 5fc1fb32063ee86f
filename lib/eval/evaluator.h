#pragma once
// The in-training evals as components (torchtitan's `if validator.should_validate(step): validator.validate()`):
// each is built once at start-up (lib/eval/evals.h registers them), decides its own cadence with due() and, when
// due, runs after the step and returns what to report and the τ it measured (for the best checkpoint). An eval
// that streams packets of its own registers an ExtraPackets source with the stream plan (lib/train/stream_plan.h)
// in the same place, so the target and the drafter side iterate the same packets.
#include <cstdint>
#include <functional>
#include <string>

#include "lib/comm/transport.h"
#include "lib/io/dataset.h"
#include "lib/report/log.h"
#include "lib/report/reporter.h"
#include "lib/train/drafter_step.h"
#include "lib/train/packet.h"

namespace dflash::eval {

// The in-training eval's inputs (docs/eval.md "During training"), opened and checked at start-up; null = off.
struct EvalInputs {
  const io::Dataset* data = nullptr;     // eval.data (eval.every > 0)
  const io::Dataset* prompts = nullptr;  // eval.prompts (eval.spec_every > 0)
};

// What a drafter-side eval may use when it runs (after step next_step - 1 trained).
struct EvalContext {
  int64_t next_step = 0;   // steps trained: the weights of ckpt/step_<next_step>
  train::DrafterStep& drafter;
  comm::Transport& dp;     // the drafter DP group (watched)
  comm::Transport& world;  // the world (watched)
  const std::function<const train::FeaturePacket&(double* wait_seconds)>& next_packet;  // this rank's next packet
};

struct EvalOutcome {
  report::ReportRecord report;  // the line and metrics record (logged and written by drafter rank 0)
  std::string metric;   // the τ's name for the best checkpoint ("eval_tau", "spec_tau"); "" = none
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

}  // namespace dflash::eval
