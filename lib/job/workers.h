#pragma once
// The two roles of a dflash_mpi job (docs/architecture.md "One training step, in code"), each handed the job
// resolved at start-up (lib/job/job.h). Every blocking wait of either goes through a WatchedTransport on the job's
// watchdog (run.watchdog_seconds).
//   target worker: reads its drafters' sequences, runs the TP target forward, streams feature packets;
//   drafter worker: receives packets, trains the drafter (DrafterStep), logs progress and metrics.
#include "lib/job/job.h"
#include "lib/job/run_status.h"

namespace dflash::job {

// Steps [resume.start_step, plan.total_steps) of this rank's target group, or until its drafters ask it to stop:
// the packets of the stream plan (lib/train/stream_plan.h: each step's training packets, then the evals' extra
// ones), then after each step the target side of every eval that is due (lib/eval/evals.h). A target rank does not
// know how the run ended: it returns RunOutcome::running.
RunStatus run_target_worker(Job& job);

// Steps [resume.start_step, plan.total_steps) on this drafter rank, or fewer on a stop (a signal,
// --stop-after-steps, --dump-step): after each step the reporter (lib/report/reporter.h), the evals that are due
// (lib/eval/evals.h) and the checkpointer (lib/state/checkpointer.h). The first drafter rank prints progress,
// writes <out_dir>/metrics.jsonl, the checkpoints and, at the end, drafter_final.safetensors. Returns how the run
// ended here (lib/job/run_status.h; the same on every drafter rank).
RunStatus run_drafter_worker(Job& job);

}  // namespace dflash::job
