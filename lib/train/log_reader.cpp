#include "lib/train/log_reader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "lib/core/error.h"

namespace dflash {

namespace fs = std::filesystem;

size_t RankLog::count(LogLevel level) const {
  return size_t(std::count_if(lines.begin(), lines.end(), [&](const LogLine& l) { return l.level == level; }));
}

namespace {

// "<date> <time> [prefix] <level> <message>", as Logger::log writes it
LogLine parse_line(const std::string& text, int rank) {
  static const std::regex format(R"(^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) (\[[^\]]*\]) (debug|info|warn|error) +(.*)$)");
  LogLine l;
  l.rank = rank;
  l.text = text;
  std::smatch m;
  if (std::regex_match(text, m, format)) {
    l.time = m[1];
    l.prefix = m[2];
    l.level = parse_log_level(m[3]);
    l.message = m[4];
  } else {
    l.message = text;  // continuation or a torn last line: keep it, unparsed, at info level
  }
  return l;
}

}  // namespace

std::vector<RankLog> read_run_logs(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir) / "logs";
  DFLASH_USER_CHECK(fs::is_directory(dir), "{}: no logs/ folder; give the run's out_dir (run.out_dir in its config)",
                    run_dir);
  static const std::regex name(R"(^rank_(\d+)\.log$)");
  std::vector<RankLog> logs;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (!std::regex_match(file, m, name)) continue;
    RankLog log;
    log.path = entry.path().string();
    log.rank = std::stoi(m[1]);
    std::ifstream in(log.path);
    std::string text;
    while (std::getline(in, text))
      if (!text.empty()) log.lines.push_back(parse_line(text, log.rank));
    logs.push_back(std::move(log));
  }
  DFLASH_USER_CHECK(!logs.empty(), "{}: no rank_XX.log files", dir.string());
  std::sort(logs.begin(), logs.end(), [](const RankLog& a, const RankLog& b) { return a.rank < b.rank; });
  return logs;
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

std::string summarise_logs(const std::vector<RankLog>& logs) {
  std::string s = fmt::format("{:<34} {:>6} {:>5} {:>6}  {}\n", "rank", "lines", "warn", "errors", "last line");
  for (const auto& log : logs) {
    const std::string prefix = log.lines.empty() || log.lines.back().prefix.empty()
                                   ? fmt::format("[rank {}]", log.rank)
                                   : log.lines.back().prefix;
    const std::string last = log.lines.empty() ? "(empty)" : log.lines.back().message;
    s += fmt::format("{:<34} {:>6} {:>5} {:>6}  {}\n", prefix, log.lines.size(), log.count(LogLevel::kWarn),
                     log.count(LogLevel::kError), last.size() > 90 ? last.substr(0, 87) + "..." : last);
  }
  return s;
}

}  // namespace dflash
