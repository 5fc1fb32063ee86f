#pragma once
// The two roles of a dflash_mpi job (docs/architecture.md "One training step, in code"). Every blocking wait of
// either goes through a WatchedTransport on `watchdog` (run.watchdog_seconds).
//   target worker: reads its drafters' sequences, runs the TP target forward, streams feature packets;
//   drafter worker: receives packets, trains the drafter (DrafterStep), logs progress and metrics.
#include <cstdint>

#include "lib/comm/layout.h"
#include "lib/config/config.h"
#include "lib/eval/evaluator.h"
#include "lib/io/dataset.h"
#include "lib/job/run_status.h"
#include "lib/model/drafter_params.h"
#include "lib/report/log.h"
#include "lib/state/checkpoint.h"
#include "lib/state/checkpointing.h"
#include "lib/train/run_plan.h"
#include "lib/train/watchdog.h"

namespace dflash::job {

// Steps [start_step, plan.total_steps) of this rank's target group, or until its drafters ask it to stop: the
// packets of the stream plan (lib/train/stream_plan.h: each step's training packets, then the evals' extra ones),
// then after each step the target side of every eval that is due (lib/eval/evals.h).
void run_target_worker(const TrainConfig& cfg, const train::RunPlan& plan, const comm::RankLayout& layout,
                       const comm::RoleComms& comms, const io::Dataset& data, int64_t start_step, report::Logger& log,
                       train::Watchdog& watchdog, const eval::EvalInputs& eval = {});

struct DrafterRunOptions {
  int64_t start_step = 0;                     // first step to run (> 0 when resuming)
  const state::LoadedCheckpoint* resume = nullptr;    // on drafter rank 0 when resuming: weights + optimizer state
  const model::DrafterParams<float>* init = nullptr;  // on drafter rank 0 with drafter.init (a fresh start)
  int64_t stop_after = 0;                     // > 0: stop (with a checkpoint) after this many steps of this run
  std::string dump_dir;                       // non-empty: run one step, write its dump there, stop
  state::RunIdentity identity;                // on drafter rank 0: the data's and the target's, recorded in checkpoints
  eval::EvalInputs eval;                      // the in-training eval (data only: prompts live on the targets)
};

// Steps [start_step, plan.total_steps) on this drafter rank, or fewer on a stop: after each step the reporter
// (lib/report/reporter.h), the evals that are due (lib/eval/evals.h) and the checkpointer (lib/state/checkpointer.h).
// The first drafter rank prints progress, writes <out_dir>/metrics.jsonl, the checkpoints and, at the end,
// drafter_final.safetensors. Returns how the run ended here (lib/job/run_status.h; the same on every drafter rank).
RunStatus run_drafter_worker(const TrainConfig& cfg, const train::RunPlan& plan, const comm::RankLayout& layout,
                             const comm::RoleComms& comms, const io::Dataset& data, const DrafterRunOptions& options,
                             report::Logger& log, train::Watchdog& watchdog);

}  // namespace dflash::job
