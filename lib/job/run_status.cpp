#include "lib/job/run_status.h"

#include <unistd.h>

#include <csignal>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "lib/core/atomic_file.h"
#include "lib/job/signals.h"

namespace dflash::job {

const char* outcome_name(RunOutcome o) {
  switch (o) {
    case RunOutcome::running: return "running";
    case RunOutcome::finished: return "finished";
    case RunOutcome::stopped: return "stopped";
    case RunOutcome::partial: return "partial";
  }
  return "running";
}

std::string run_status_path(const std::string& out_dir) { return (std::filesystem::path(out_dir) / "status.json").string(); }

std::string run_status_json(const RunStatus& s) {
  nlohmann::ordered_json j;
  j["outcome"] = outcome_name(s.outcome);
  j["step"] = s.step;
  j["total_steps"] = s.total_steps;
  // what the slurm scripts act on: SIGUSR1 is the time-limit signal they ask for (--signal), a checkpoint to resume;
  // SIGTERM comes from slurm ending the job (scancel, a time limit reached, a shutdown): nothing to requeue
  j["requeue"] = s.outcome == RunOutcome::stopped && s.signal != SIGTERM;
  if (s.outcome == RunOutcome::stopped)
    j["signal"] = s.signal ? signal_name(s.signal) : "another drafter rank's signal";
  j["pid"] = int64_t(getpid());  // world rank 0's: names the attempt
  return j.dump(2) + "\n";
}

void write_run_status(const std::string& out_dir, const RunStatus& s) {
  write_file_atomic(run_status_path(out_dir), run_status_json(s));
}

}  // namespace dflash::job
