#pragma once
// <out_dir>/status.json: how the last attempt of a run ended, for scripts and tests (the slurm scripts' requeue
// decision, mpi_launch/slurm/requeue.sh) instead of phrases in the logs. World rank 0 writes it atomically:
// "running" once it holds the out_dir, then, after every rank is done, one of
//   finished  every step of the run is trained; drafter_final.safetensors is written
//   stopped   a stop signal ended it after a checkpoint; "requeue" true for SIGUSR1 (the time-limit signal of the
//             slurm scripts: requeue and resume with ckpt.resume=auto), false for SIGTERM (scancel, slurm ending
//             the job: the checkpoint stays, nothing asks for a requeue)
//   partial   it stopped where asked (--stop-after-steps, --dump-step), with a checkpoint: done, no requeue
// A job that fails exits non-zero (mpirun's exit code) and leaves "running" behind: the exit code says it failed.
#include <cstdint>
#include <string>

namespace dflash::job {

enum class RunOutcome { running = 0, finished, stopped, partial };

struct RunStatus {
  RunOutcome outcome = RunOutcome::running;
  int64_t step = 0;         // steps completed when the attempt ended (the first step of the run while running)
  int64_t total_steps = 0;  // the run's plan
  int signal = 0;           // stopped: the signal drafter rank 0 caught (0: another drafter rank's)
};

const char* outcome_name(RunOutcome o);
std::string run_status_path(const std::string& out_dir);
// The file's text: a JSON object {"outcome", "step", "total_steps", "requeue", "signal", "pid"}.
std::string run_status_json(const RunStatus& s);
void write_run_status(const std::string& out_dir, const RunStatus& s);

}  // namespace dflash::job
