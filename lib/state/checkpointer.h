#pragma once
// The trainer's checkpoint component (torchtitan's checkpointer.save(step, last_step=...)): built once at start-up,
// it decides when a step is saved, writes step_* (durable, lib/state/checkpoint.h), prunes to ckpt.keep, keeps the
// best checkpoint (lib/state/best_checkpoint.h) and says what it did as one log line for the caller to log (this
// layer does not log). Only drafter rank 0 writes; on the other ranks nothing is due.
#include <cstdint>
#include <optional>
#include <string>

#include "lib/comm/transport.h"
#include "lib/config/config.h"
#include "lib/state/best_checkpoint.h"
#include "lib/state/checkpoint.h"
#include "lib/state/checkpointing.h"
#include "lib/train/drafter_step.h"
#include "lib/train/run_plan.h"

namespace dflash::state {

struct CheckpointerSettings {
  bool writer = false;          // this rank writes (drafter rank 0)
  bool save_on_stop = true;     // a stop (signal, --stop-after-steps) saves; false for --dump-step
  int64_t start_step = 0;       // 0: a fresh run
  std::optional<TauMetric> best_metric;  // the τ the best checkpoint keeps; none: no best checkpoint
  RunIdentity identity;         // recorded in every checkpoint
};

class Checkpointer {
 public:
  Checkpointer(const TrainConfig& cfg, const train::RunPlan& plan, CheckpointerSettings s);

  // ckpt.every = `every` (0 = off): a save after `next_step` steps when it is a multiple of every, or the last
  // step (with every > 0), or on a stop (when save_on_stop).
  static bool due(int every, int64_t next_step, bool last, bool stop, bool save_on_stop);
  // The same with this run's settings; false on a rank that does not write.
  bool due(int64_t next_step, bool last, bool stop) const;
  // Writes ckpt/step_<next_step>, prunes to ckpt.keep; returns the log line
  // ("checkpoint: DIR (S s)[; removed N older]").
  std::string save(int64_t next_step, train::DrafterStep& drafter);

  // The best checkpoint: what it found at start-up ("" when nothing to say or no best is kept).
  std::string best_notice() const;
  // τ measured by `metric` after `next_step` steps: when it is the best's metric and beats it, writes ckpt/best and
  // returns the log line; else "".
  std::string offer_best(int64_t next_step, std::optional<TauMetric> metric, double tau, train::DrafterStep& drafter);

 private:
  const TrainConfig& cfg_;
  const train::RunPlan& plan_;
  CheckpointerSettings s_;
  std::optional<BestCheckpoint> best_;
};

// Drafter rank 0 holds the loaded checkpoint (`ckpt`); the others get weights and optimizer state from it over the
// drafter DP group `dp` (no shared file system needed between drafter ranks). Collective over dp.
// drafter.init: every drafter rank starts from drafter rank 0's `init` weights (a fresh optimizer).
void init_drafter(comm::Transport& dp, train::DrafterStep& drafter, const model::DrafterParams<float>* init);
void restore_drafter(comm::Transport& dp, train::DrafterStep& drafter, const LoadedCheckpoint* ckpt);

// Writes the drafter's fp32 weights (export names) to <out_dir>/drafter_final.safetensors via a temporary file and
// a rename; returns the path.
std::string write_final_weights(const std::string& out_dir, const model::DrafterParams<float>& params);

}  // namespace dflash::state
