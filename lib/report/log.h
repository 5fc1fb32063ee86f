#pragma once
// Per-rank logs: <out_dir>/logs/rank_XX.log, every line prefixed `[rank r | role | index]`. Knows nothing of MPI:
// the caller passes its rank, role (target | drafter) and index (TP rank or DP rank), so tests need no mpirun.
// Lines at or above the level go to the file; the designated console rank also prints info/warn to stdout;
// errors of every rank also go to stderr. Thread-safe (one mutex per logger). A file is never truncated: each
// attempt of a run (a resume, a requeue) appends to it after an attempt header line. A failed write (full disk)
// throws a dflash::Error naming the file.
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace dflash::report {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// "debug" | "info" | "warn" | "error"; anything else throws naming `what` (e.g. the config key) and the choices.
LogLevel parse_log_level(const std::string& name, const std::string& what = "log level");
const char* log_level_name(LogLevel level);
// The level a run uses: env DFLASH_LOG_LEVEL when set (checked), otherwise `config_level` (log.level).
LogLevel resolve_log_level(const std::string& config_level);

struct LogIdentity {
  int rank = 0;                  // world rank
  std::string role = "drafter";  // target | drafter
  int index = 0;                 // TP rank within the target group, or DP rank among drafters
  int group = -1;                // target group, shown only when >= 0 (jobs with several target groups)
};

class Logger {
 public:
  // Creates <out_dir>/logs/ and opens rank_XX.log for appending. console: this rank also prints info/warn lines
  // to stdout. attempt: when not empty, written first (at info level, whatever the level) as this attempt's
  // header, e.g. "===== attempt: host n7, pid 42, slurm job 991 =====".
  Logger(const std::string& out_dir, const LogIdentity& who, LogLevel level, bool console,
         const std::string& attempt = "");
  ~Logger();
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  // Throws dflash::Error naming the file when the line cannot be written (e.g. no space left on the device).
  void log(LogLevel level, std::string_view message);
  template <typename... A>
  void debug(fmt::format_string<A...> f, A&&... a) {
    if (enabled(LogLevel::kDebug)) log(LogLevel::kDebug, fmt::format(f, std::forward<A>(a)...));
  }
  template <typename... A>
  void info(fmt::format_string<A...> f, A&&... a) {
    if (enabled(LogLevel::kInfo)) log(LogLevel::kInfo, fmt::format(f, std::forward<A>(a)...));
  }
  template <typename... A>
  void warn(fmt::format_string<A...> f, A&&... a) {
    if (enabled(LogLevel::kWarn)) log(LogLevel::kWarn, fmt::format(f, std::forward<A>(a)...));
  }
  template <typename... A>
  void error(fmt::format_string<A...> f, A&&... a) {
    if (enabled(LogLevel::kError)) log(LogLevel::kError, fmt::format(f, std::forward<A>(a)...));
  }

  bool enabled(LogLevel level) const { return level >= level_; }
  LogLevel level() const { return level_; }
  const std::string& prefix() const { return prefix_; }  // "[rank 5 | drafter | 0]"
  const std::string& path() const { return path_; }

 private:
  std::string path_, prefix_;
  std::string format_line(LogLevel level, std::string_view message) const;
  void write_line(const std::string& line);  // to the file; throws on a failed write; mutex held

  LogLevel level_;
  bool console_;
  std::FILE* file_ = nullptr;
  std::mutex mutex_;
};

}  // namespace dflash::report
