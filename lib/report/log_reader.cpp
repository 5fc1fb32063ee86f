#include "lib/report/log_reader.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "lib/core/error.h"

namespace dflash::report {

namespace fs = std::filesystem;

size_t RankLog::count(LogLevel level) const {
  return size_t(std::count_if(lines.begin(), lines.end(), [&](const LogLine& l) { return l.level == level; }));
}

size_t RankLog::garbled() const {
  return size_t(std::count_if(lines.begin(), lines.end(), [](const LogLine& l) { return !l.parsed; }));
}

namespace {

constexpr size_t kPreviewBytes = 160;  // of an unparsed line, shown

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// "YYYY-MM-DD HH:MM:SS.mmm": digits where digits belong, separators where separators belong.
bool is_timestamp(std::string_view t) {
  static constexpr std::string_view shape = "0000-00-00 00:00:00.000";
  if (t.size() != shape.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == '0' ? !is_digit(t[i]) : t[i] != shape[i]) return false;
  return true;
}

// The line with control bytes shown as '?' and cut to kPreviewBytes: safe to print on a terminal.
std::string printable_preview(std::string_view text) {
  std::string s;
  for (size_t i = 0; i < text.size() && i < kPreviewBytes; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    s += c < 0x20 || c == 0x7f ? '?' : char(c);
  }
  if (text.size() > kPreviewBytes) s += "...";
  return s;
}

// "<date> <time> [prefix] <level> <message>", as Logger::log writes it (the level padded to 5 columns, then a
// space). Linear in the line's length whatever it holds; a line in another shape comes back unparsed.
LogLine parse_line(std::string_view text, int rank, size_t line_no) {
  LogLine l;
  l.rank = rank;
  l.line_no = line_no;
  l.bytes = text.size();
  const size_t time_end = 23;  // strlen("2026-11-29 11:56:26.928")
  // Logger writes no control bytes: a line holding one (NULs after a crash) is torn, whatever its start looks like
  const bool clean = std::none_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return (u < 0x20 && c != '\t') || u == 0x7f;
  });
  bool ok = clean && text.size() > time_end + 1 && is_timestamp(text.substr(0, time_end)) && text[time_end] == ' ' &&
            text[time_end + 1] == '[';
  size_t prefix_end = ok ? text.find(']', time_end + 1) : std::string_view::npos;
  ok = ok && prefix_end != std::string_view::npos && prefix_end + 1 < text.size() && text[prefix_end + 1] == ' ';
  std::string_view level_word;
  size_t message_begin = 0;
  if (ok) {
    const size_t level_begin = prefix_end + 2;
    const size_t level_end = text.find(' ', level_begin);
    ok = level_end != std::string_view::npos;
    if (ok) {
      level_word = text.substr(level_begin, level_end - level_begin);
      ok = level_word == "debug" || level_word == "info" || level_word == "warn" || level_word == "error";
      message_begin = level_end;
      while (message_begin < text.size() && text[message_begin] == ' ') ++message_begin;
    }
  }
  if (!ok) {
    l.text = printable_preview(text);
    l.message = l.text;  // kept, unparsed, at info level
    return l;
  }
  l.parsed = true;
  l.text = std::string(text);
  l.time = std::string(text.substr(0, time_end));
  l.prefix = std::string(text.substr(time_end + 1, prefix_end - time_end));
  l.level = parse_log_level(std::string(level_word));
  l.message = std::string(text.substr(message_begin));
  return l;
}

// The rank of "rank_<digits>.log", -1 for any other name; a number out of range is an error naming the file.
int rank_of_file_name(const fs::path& path) {
  const std::string name = path.filename().string();
  const std::string_view head = "rank_", tail = ".log";
  if (name.size() <= head.size() + tail.size() || !name.starts_with(head) || !name.ends_with(tail)) return -1;
  const std::string_view digits = std::string_view(name).substr(head.size(), name.size() - head.size() - tail.size());
  if (!std::all_of(digits.begin(), digits.end(), is_digit)) return -1;
  DFLASH_USER_CHECK(digits.size() <= 6 && std::stoi(std::string(digits)) <= kMaxRank,
                    "{}: rank number out of range (at most {}): not a file dflash_mpi wrote; move it out of the "
                    "logs/ folder",
                    path.string(), kMaxRank);
  return std::stoi(std::string(digits));
}

}  // namespace

std::vector<RankLog> read_run_logs(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir) / "logs";
  DFLASH_USER_CHECK(fs::is_directory(dir), "{}: no logs/ folder; give the run's out_dir (run.out_dir in its config)",
                    run_dir);
  std::vector<RankLog> logs;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const int rank = rank_of_file_name(entry.path());
    if (rank < 0) continue;
    // only regular files: reading a FIFO or a device would block or never end
    DFLASH_USER_CHECK(entry.is_regular_file(), "{} is {}, not a log file; move it out of the logs/ folder",
                      entry.path().string(), entry.is_directory() ? "a folder" : "not a regular file (a FIFO, socket or device)");
    RankLog log;
    log.path = entry.path().string();
    log.rank = rank;
    std::ifstream in(log.path, std::ios::binary);
    DFLASH_USER_CHECK(in, "cannot read {}: {}", log.path, std::strerror(errno));
    std::string text;
    for (size_t line_no = 1; std::getline(in, text); ++line_no)
      if (!text.empty()) log.lines.push_back(parse_line(text, log.rank, line_no));
    DFLASH_USER_CHECK(in.eof(), "reading {} failed: {}", log.path, std::strerror(errno));
    logs.push_back(std::move(log));
  }
  DFLASH_USER_CHECK(!logs.empty(), "{}: no rank_XX.log files", dir.string());
  std::sort(logs.begin(), logs.end(), [](const RankLog& a, const RankLog& b) { return a.rank < b.rank; });
  return logs;
}

std::string garbled_report(const std::vector<RankLog>& logs) {
  std::string s;
  for (const auto& log : logs)
    for (const auto& l : log.lines)
      if (!l.parsed) s += fmt::format("{}:{}: unparsed line of {} bytes: {}\n", log.path, l.line_no, l.bytes, l.text);
  return s;
}

std::vector<LogLine> merge_logs(const std::vector<RankLog>& logs, LogLevel min_level, int rank) {
  std::vector<LogLine> out;
  for (const auto& log : logs) {
    if (rank >= 0 && log.rank != rank) continue;
    for (const auto& l : log.lines)
      if (l.level >= min_level) out.push_back(l);
  }
  // stable: lines of one rank with the same timestamp keep their file order
  std::stable_sort(out.begin(), out.end(), [](const LogLine& a, const LogLine& b) {
    return a.time != b.time ? a.time < b.time : a.rank < b.rank;
  });
  return out;
}

double log_time_seconds(const std::string& time) {
  if (!is_timestamp(time)) return -1;
  std::tm tm{};
  tm.tm_year = std::stoi(time.substr(0, 4)) - 1900;
  tm.tm_mon = std::stoi(time.substr(5, 2)) - 1;
  tm.tm_mday = std::stoi(time.substr(8, 2));
  tm.tm_hour = std::stoi(time.substr(11, 2));
  tm.tm_min = std::stoi(time.substr(14, 2));
  tm.tm_sec = std::stoi(time.substr(17, 2));
  tm.tm_isdst = -1;  // as Logger wrote it: local time
  const std::time_t t = std::mktime(&tm);
  return t == std::time_t(-1) ? -1 : double(t) + std::stoi(time.substr(20, 3)) / 1000.0;
}

namespace {

// "12 s", "4 min", "3.2 h", "2.0 d"
std::string age_text(double seconds) {
  if (seconds < 0) return "?";
  if (seconds < 120) return fmt::format("{:.0f} s", seconds);
  if (seconds < 7200) return fmt::format("{:.0f} min", seconds / 60);
  if (seconds < 172800) return fmt::format("{:.1f} h", seconds / 3600);
  return fmt::format("{:.1f} d", seconds / 86400);
}

// The time of the last parsed line of a rank, < 0 when none.
double last_time(const RankLog& log) {
  for (auto it = log.lines.rbegin(); it != log.lines.rend(); ++it)
    if (it->parsed) return log_time_seconds(it->time);
  return -1;
}

}  // namespace

std::string summarise_logs(const std::vector<RankLog>& logs, double now, double straggler_seconds) {
  if (now < 0)
    now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  double newest = -1;
  for (const auto& log : logs) newest = std::max(newest, last_time(log));
  std::string s = fmt::format("{:<34} {:>6} {:>5} {:>6} {:>8}  {}\n", "rank", "lines", "warn", "errors", "age",
                              "last line");
  for (const auto& log : logs) {
    const std::string prefix = log.lines.empty() || log.lines.back().prefix.empty()
                                   ? fmt::format("[rank {}]", log.rank)
                                   : log.lines.back().prefix;
    const std::string last = log.lines.empty() ? "(empty)" : log.lines.back().message;
    const double t = last_time(log);
    s += fmt::format("{:<34} {:>6} {:>5} {:>6} {:>8}  {}\n", prefix, log.lines.size(), log.count(LogLevel::kWarn),
                     log.count(LogLevel::kError), age_text(t < 0 ? -1 : std::max(0.0, now - t)),
                     last.size() > 90 ? last.substr(0, 87) + "..." : last);
    if (t >= 0 && newest - t > straggler_seconds)
      s += fmt::format("{:<34} STRAGGLER: its last line is {} older than the newest of any rank\n", "",
                       age_text(newest - t));
    if (const size_t bad = log.garbled(); bad > 0) {
      const auto first = std::find_if(log.lines.begin(), log.lines.end(), [](const LogLine& l) { return !l.parsed; });
      s += fmt::format("{:<34} {} garbled (first at {}:{}); `dflash_logs RUN_DIR --garbled` lists them\n", "", bad,
                       log.path, first->line_no);
    }
  }
  return s;
}

}  // namespace dflash::report
