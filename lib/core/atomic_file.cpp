#include "lib/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lib/core/error.h"

namespace dflash {

namespace fs = std::filesystem;

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  DFLASH_USER_CHECK(fd >= 0, "cannot open {} to fsync: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  DFLASH_USER_CHECK(rc == 0, "fsync of {} failed: {} (is the disk full?)", path, std::strerror(err));
}

namespace {

std::string parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void rename_durably(const std::string& from, const std::string& to) {
  fsync_path(from, false);
  DFLASH_USER_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename {} to {}: {}", from, to,
                    std::strerror(errno));
  fsync_path(parent_dir(to), true);
}

}  // namespace

void write_file_durable(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  DFLASH_USER_CHECK(fd >= 0, "cannot create {}: {}", path, std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      DFLASH_USER_FAIL("write to {} failed: {} (is the disk full?)", path, std::strerror(err));
    }
    done += size_t(n);
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  DFLASH_USER_CHECK(rc == 0, "fsync of {} failed: {} (is the disk full?)", path, std::strerror(err));
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicOutput out(path);
  write_file_durable(out.partial(), bytes);
  out.commit();
}

AtomicOutput::AtomicOutput(std::string path) : path_(std::move(path)), partial_(path_ + ".partial") {}

AtomicOutput::~AtomicOutput() {
  if (!committed_) {
    std::error_code ec;
    fs::remove(partial_, ec);  // best effort: we are already unwinding from the real error
  }
}

void AtomicOutput::commit() {
  rename_durably(partial_, path_);
  committed_ = true;
}

}  // namespace dflash
