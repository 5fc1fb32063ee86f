#include "lib/job/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>

#include "lib/core/error.h"

namespace dflash::job {

namespace fs = std::filesystem;

namespace {

std::string now_text() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string read_all(int fd) {
  std::string text;
  char buf[4096];
  off_t off = 0;
  for (ssize_t n; (n = ::pread(fd, buf, sizeof buf, off)) > 0 && text.size() < 65536; off += n) text.append(buf, size_t(n));
  return text;
}

std::string holder_text(const LockRecord& r) {
  return r.valid ? fmt::format("{}, since {}", describe(r.holder), r.since) : std::string("an unreadable record");
}

}  // namespace

std::string format_lock_record(const JobIdentity& id, const std::string& since) {
  return fmt::format("host: {}\npid: {}\njob: {}\nrestarts: {}\nsince: {}\n", id.host, id.pid, id.job, id.restarts,
                     since);
}

LockRecord parse_lock_record(const std::string& text) {
  LockRecord r;
  std::istringstream in(text);
  bool host = false, pid = false;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(": ");
    const std::string key = line.substr(0, colon), value = colon == std::string::npos ? "" : line.substr(colon + 2);
    if (colon == std::string::npos) continue;
    if (key == "host") r.holder.host = value, host = true;
    if (key == "pid") {
      char* end = nullptr;
      r.holder.pid = std::strtol(value.c_str(), &end, 10);
      pid = end && *end == 0 && r.holder.pid > 0;
    }
    if (key == "job") r.holder.job = value;
    if (key == "restarts") r.holder.restarts = value;
    if (key == "since") r.since = value;
  }
  r.valid = host && pid;
  return r;
}

RunLock::RunLock(const std::string& out_dir, const JobIdentity& me) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  DFLASH_USER_CHECK(!ec, "cannot create run.out_dir '{}': {}; set run.out_dir to a writable folder", out_dir,
                    ec.message());
  path_ = (fs::path(out_dir) / "LOCK").string();
  // LOCK is the one file not replaced through lib/core/atomic_file.h: its inode is what is locked. A torn record
  // only loses the holder's description.
  for (;;) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    DFLASH_USER_CHECK(fd_ >= 0, "cannot open the run lock {}: {}; check run.out_dir", path_, std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const LockRecord r = parse_lock_record(read_all(fd_));
      ::close(fd_);
      fd_ = -1;
      DFLASH_USER_CHECK(err != EWOULDBLOCK,
                        "run.out_dir '{}' is in use by another job ({}): two jobs in one out_dir destroy each "
                        "other's metrics and checkpoints; wait for that job or stop it, or set run.out_dir to "
                        "another folder",
                        out_dir, holder_text(r));
      DFLASH_USER_FAIL("cannot lock {}: {}; the file system of run.out_dir must support flock()", path_,
                       std::strerror(err));
    }
    // the holder may have released (unlinked) the file between our open and our flock: lock the file at the path
    struct stat held {}, at_path {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &at_path) == 0 && held.st_ino == at_path.st_ino &&
        held.st_dev == at_path.st_dev)
      break;
    ::close(fd_);
    fd_ = -1;
  }
  // the flock is ours; a record left in the file is from a job that ended without releasing it
  const std::string left = read_all(fd_);
  if (!left.empty()) {
    const LockRecord r = parse_lock_record(left);
    // on one host flock is authoritative: the holder's lock is free, so its process has ended (its pid may still
    // show as a zombie for a moment, or be reused)
    const bool same_host = r.valid && r.holder.host == me.host;
    const bool same_job = r.valid && !r.holder.job.empty() && r.holder.job == me.job;
    if (!(same_host || same_job)) {
      ::close(fd_);
      fd_ = -1;
      DFLASH_USER_FAIL("run.out_dir '{}' holds a lock left by {} that this host cannot prove gone (the job died "
                       "without releasing it, or runs on another node): if that job is no longer running "
                       "(squeue / ps on its host), remove {} and start again; otherwise set run.out_dir to another "
                       "folder",
                       out_dir, holder_text(r), path_);
    }
    taken_over_ = fmt::format("took over the stale lock {} left by {} ({})", path_, holder_text(r),
                              same_job ? "an earlier attempt of this job" : "that process has ended");
  }
  const std::string record = format_lock_record(me, now_text());
  const bool written = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, record.data(), record.size(), 0) == ssize_t(record.size()) &&
                       ::fsync(fd_) == 0;
  if (!written) {
    const int err = errno;
    release();
    DFLASH_USER_FAIL("writing the run lock {} failed: {}; free space on the file system of run.out_dir", path_,
                     std::strerror(err));
  }
}

RunLock::~RunLock() { release(); }

void RunLock::release() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still locked: no other job can have taken it in between
  ::close(fd_);             // drops the flock
  fd_ = -1;
}

}  // namespace dflash::job
