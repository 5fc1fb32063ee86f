// The out_dir lock: a second job is refused naming the holder; a stale lock is taken over only when its holder
// is provably gone (same host: flock free; or an earlier attempt of the same slurm job), else refused with the fix.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "lib/core/error.h"
#include "lib/job/run_lock.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::job;

namespace {

JobIdentity identity(const std::string& host, long pid, const std::string& job) {
  JobIdentity id;
  id.host = host;
  id.pid = pid;
  id.job = job;
  return id;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The pid of a process that has exited and been reaped: certainly not alive.
long dead_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return long(child);
}

}  // namespace

TEST_CASE("run lock: a second job on the same out_dir is refused, naming the holder, release lets the next in") {
  const std::string dir = (test::scratch_dir("run_lock") / "run").string();
  const JobIdentity me = current_job_identity();
  {
    job::RunLock first(dir, me);
    CHECK(first.taken_over().empty());
    const LockRecord r = parse_lock_record(read_text(dir + "/LOCK"));
    REQUIRE(r.valid);
    CHECK(r.holder.host == me.host);
    CHECK(r.holder.pid == me.pid);
    // another open file description of LOCK is another job as far as flock is concerned
    CHECK_THROWS_WITH_AS(RunLock(dir, identity("other", 1, "77")),
                         doctest::Contains(fmt::format("run.out_dir '{}' is in use by another job (host {}, pid {}",
                                                       dir, me.host, me.pid)
                                               .c_str()),
                         Error);
  }
  CHECK(!std::filesystem::exists(dir + "/LOCK"));  // released on a clean end
  job::RunLock again(dir, me);
  CHECK(again.taken_over().empty());
}

TEST_CASE("run lock: a stale lock is taken over when its holder is provably gone, else refused with how to clear it") {
  const std::string dir = test::scratch_dir("run_lock_stale").string();
  const JobIdentity me = identity("node1", long(getpid()), "991");
  SUBCASE("same host, flock free: its process has ended (flock is authoritative on one host), taken over") {
    write_text(dir + "/LOCK", job::format_lock_record(identity("node1", dead_pid(), ""), "2026-11-29 10:00:00"));
    job::RunLock lock(dir, me);
    CHECK(lock.taken_over().find("took over the stale lock") != std::string::npos);
    CHECK(lock.taken_over().find("that process has ended") != std::string::npos);
    CHECK(job::parse_lock_record(read_text(dir + "/LOCK")).holder.job == "991");
  }
  SUBCASE("an earlier attempt of the same slurm job (a requeue on another node): taken over") {
    write_text(dir + "/LOCK", job::format_lock_record(identity("node9", 4242, "991"), "2026-11-29 10:00:00"));
    job::RunLock lock(dir, me);
    CHECK(lock.taken_over().find("an earlier attempt of this job") != std::string::npos);
  }
  SUBCASE("another host's job: refused, naming it, the file to remove and the alternative") {
    write_text(dir + "/LOCK", job::format_lock_record(identity("node9", 4242, "17"), "2026-11-29 10:00:00"));
    CHECK_THROWS_WITH_AS(job::RunLock(dir, me),
                         doctest::Contains("holds a lock left by host node9, pid 4242, slurm job 17, since "
                                           "2026-11-29 10:00:00"),
                         Error);
    CHECK_THROWS_WITH_AS(job::RunLock(dir, me), doctest::Contains(("remove " + dir + "/LOCK and start again").c_str()),
                         Error);
    CHECK(std::filesystem::exists(dir + "/LOCK"));  // a refusal leaves the other job's lock alone
  }
  SUBCASE("garbage in LOCK: refused as unreadable") {
    write_text(dir + "/LOCK", std::string("\0\0\0", 3));
    CHECK_THROWS_WITH_AS(job::RunLock(dir, me), doctest::Contains("left by an unreadable record"), Error);
  }
}
