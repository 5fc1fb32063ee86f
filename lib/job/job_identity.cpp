#include "lib/job/job_identity.h"

#include <unistd.h>

#include <cstdlib>

#include <fmt/format.h>

namespace dflash::job {

namespace {
std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}
}  // namespace

JobIdentity current_job_identity() {
  JobIdentity id;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) id.host = host;
  id.pid = long(getpid());
  id.job = env_or_empty("SLURM_JOB_ID");
  id.restarts = env_or_empty("SLURM_RESTART_COUNT");
  return id;
}

std::string describe(const JobIdentity& id) {
  std::string job = id.job.empty() ? "no batch job" : fmt::format("slurm job {}", id.job);
  if (!id.restarts.empty()) job += fmt::format(" (restart {})", id.restarts);
  return fmt::format("host {}, pid {}, {}", id.host.empty() ? "?" : id.host, id.pid, job);
}

}  // namespace dflash::job
