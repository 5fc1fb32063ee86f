#include "lib/report/log.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <filesystem>

#include "lib/core/error.h"

namespace dflash::report {

namespace {

// Local wall-clock time with milliseconds, to line up the logs of different ranks.
std::string timestamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return fmt::format("{}.{:03d}", buf, ms);
}

}  // namespace

LogLevel parse_log_level(const std::string& name, const std::string& what) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  throw Error(fmt::format("{} is '{}'; allowed: debug, info, warn, error", what, name));
}

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "?";
}

LogLevel resolve_log_level(const std::string& config_level) {
  if (const char* env = std::getenv("DFLASH_LOG_LEVEL"); env && *env)
    return parse_log_level(env, "environment variable DFLASH_LOG_LEVEL");
  return parse_log_level(config_level, "config key 'log.level'");
}

Logger::Logger(const std::string& out_dir, const LogIdentity& who, LogLevel level, bool console,
               const std::string& attempt)
    : prefix_(who.group >= 0 ? fmt::format("[rank {} | {} | group {} tp {}]", who.rank, who.role, who.group, who.index)
                              : fmt::format("[rank {} | {} | {}]", who.rank, who.role, who.index)), level_(level), console_(console) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(out_dir) / "logs";
  std::error_code ec;
  fs::create_directories(dir, ec);
  DFLASH_USER_CHECK(!ec, "cannot create the log folder '{}': {}; set run.out_dir to a writable folder", dir.string(),
               ec.message());
  path_ = (dir / fmt::format("rank_{:02d}.log", who.rank)).string();
  file_ = std::fopen(path_.c_str(), "a");
  DFLASH_USER_CHECK(file_, "cannot open the log file '{}' for appending: {}; check run.out_dir", path_,
                    std::strerror(errno));
  if (!attempt.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    write_line(format_line(LogLevel::kInfo, attempt));
  }
}

Logger::~Logger() {
  if (file_) std::fclose(file_);
}

std::string Logger::format_line(LogLevel level, std::string_view message) const {
  return fmt::format("{} {} {:<5} {}\n", timestamp(), prefix_, log_level_name(level), message);
}

void Logger::write_line(const std::string& line) {
  // flushed per line: a crashed rank's last lines are the ones that matter
  errno = 0;
  const bool written = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  if (!written) {
    const int err = errno ? errno : EIO;
    std::clearerr(file_);
    DFLASH_USER_FAIL("writing the log file {} failed: {}; free space on (or fix) the file system of run.out_dir",
                     path_, std::strerror(err));
  }
}

void Logger::log(LogLevel level, std::string_view message) {
  if (!enabled(level)) return;
  const std::string line = format_line(level, message);
  std::lock_guard<std::mutex> lock(mutex_);
  if (level == LogLevel::kError) {
    std::fputs(line.c_str(), stderr);  // before the file: a full disk must not hide the error
  } else if (console_ && level >= LogLevel::kInfo) {
    // console: the message alone (progress lines stay readable), warnings marked
    std::fputs(fmt::format("{}{}\n", level == LogLevel::kWarn ? "warning: " : "", message).c_str(), stdout);
    std::fflush(stdout);
  }
  write_line(line);
}

}  // namespace dflash::report
