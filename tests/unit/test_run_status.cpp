// status.json's "requeue": what the slurm scripts act on (mpi_launch/slurm/requeue.sh). A stop by SIGUSR1 (their
// time-limit signal) asks for a requeue; a stop by SIGTERM (scancel, slurm ending the job) does not.
#include <csignal>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "lib/job/run_status.h"

using dflash::job::RunOutcome;
using dflash::job::RunStatus;

namespace {
nlohmann::json status_of(RunOutcome outcome, int signal) {
  RunStatus s;
  s.outcome = outcome;
  s.step = 7;
  s.total_steps = 20;
  s.signal = signal;
  return nlohmann::json::parse(dflash::job::run_status_json(s));
}
}  // namespace

TEST_CASE("run_status: requeue only for a stop by SIGUSR1 (or by another drafter rank's signal)") {
  auto j = status_of(RunOutcome::stopped, SIGUSR1);
  CHECK(j["outcome"] == "stopped");
  CHECK(j["requeue"] == true);
  CHECK(j["signal"] == "SIGUSR1");
  CHECK(j["step"] == 7);
  j = status_of(RunOutcome::stopped, SIGTERM);
  CHECK(j["outcome"] == "stopped");
  CHECK(j["requeue"] == false);
  CHECK(j["signal"] == "SIGTERM");
  j = status_of(RunOutcome::stopped, 0);
  CHECK(j["requeue"] == true);
  CHECK(j["signal"] == "another drafter rank's signal");
  for (RunOutcome o : {RunOutcome::running, RunOutcome::finished, RunOutcome::partial}) {
    j = status_of(o, 0);
    CHECK(j["requeue"] == false);
    CHECK_FALSE(j.contains("signal"));
  }
}
