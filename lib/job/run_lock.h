#pragma once
// An exclusive lock on a run's out_dir for the job's life: two jobs writing one out_dir would interleave their
// logs and metrics and prune each other's checkpoints. <out_dir>/LOCK is held with flock() and records who holds
// it (host, pid, slurm job, start time).
//
// A second job finds the flock taken: refused, naming the holder. A LOCK left by a job that died without
// releasing it (kill -9, node crash) while its flock is free is "stale": taken over with a note when its holder
// ran on this host (flock is authoritative on one host) or was an earlier attempt of the same slurm job (a requeue);
// otherwise refused, naming the holder and how to clear it (flock may not reach across nodes on every shared
// file system, so another host's record is not proof that its job is gone).
#include <string>

#include "lib/job/job_identity.h"

namespace dflash::job {

class RunLock {
 public:
  // Creates out_dir when missing. Throws dflash::Error naming out_dir, the holder and the fix when refused.
  RunLock(const std::string& out_dir, const JobIdentity& me);
  ~RunLock();  // release(): removes LOCK, then unlocks
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  void release();
  const std::string& path() const { return path_; }
  // Not empty when a stale lock was taken over: what it said, for the log.
  const std::string& taken_over() const { return taken_over_; }

 private:
  std::string path_, taken_over_;
  int fd_ = -1;
};

// The holder recorded in a LOCK file's text ("host: ...\npid: ...\njob: ...\nsince: ...\n").
struct LockRecord {
  JobIdentity holder;
  std::string since;  // local time the lock was taken
  bool valid = false; // false: empty or unreadable text
};
LockRecord parse_lock_record(const std::string& text);
std::string format_lock_record(const JobIdentity& id, const std::string& since);

}  // namespace dflash::job
