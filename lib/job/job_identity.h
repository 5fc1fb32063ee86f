#pragma once
// Who runs this process: host, pid and the batch job (slurm's SLURM_JOB_ID and SLURM_RESTART_COUNT when set).
// Written into the attempt header of every rank log and into the out_dir lock, so that an operator can tell
// attempts and jobs apart.
#include <string>

namespace dflash::job {

struct JobIdentity {
  std::string host;      // gethostname()
  long pid = 0;          // getpid()
  std::string job;       // SLURM_JOB_ID, or "" outside slurm
  std::string restarts;  // SLURM_RESTART_COUNT (requeues so far), or ""
};

JobIdentity current_job_identity();
// "host node7, pid 4242, slurm job 991 (restart 2)" / "host node7, pid 4242, no batch job"
std::string describe(const JobIdentity& id);

}  // namespace dflash::job
