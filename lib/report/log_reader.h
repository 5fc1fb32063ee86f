#pragma once
// Reading a run's per-rank logs (<out_dir>/logs/rank_XX.log, written by Logger) back: parse, merge by time,
// filter by rank and level, summarise. What `dflash_logs` prints; unit-tested without MPI.
#include <string>
#include <vector>

#include "lib/report/log.h"

namespace dflash::report {

struct LogLine {
  std::string time;    // "2026-11-29 11:56:26.928": sorts as text
  int rank = -1;       // world rank, from the file name
  std::string prefix;  // "[rank 5 | drafter | 0]"
  LogLevel level = LogLevel::kInfo;
  std::string message;
  std::string text;    // the whole line as written; for an unparsed line a printable preview of it
  size_t line_no = 0;  // 1-based line number in its file
  bool parsed = false; // false: not in Logger's format (a torn write, NUL bytes after a crash)
  size_t bytes = 0;    // length of the line in the file
};

constexpr int kMaxRank = 999999;  // rank numbers beyond this are not a file Logger wrote

struct RankLog {
  std::string path;
  int rank = -1;
  std::vector<LogLine> lines;  // lines that do not parse are kept (unparsed, at info level) and counted
  size_t count(LogLevel level) const;
  size_t garbled() const;      // lines that did not parse
};

// Every logs/rank_XX.log of run_dir, by rank. Throws naming the folder when there is none, and naming the file when
// a rank_XX.log is a folder or its rank number is out of range. Parses without regexes: any line, of any length
// and content, is read (a line not in Logger's format is kept as unparsed).
std::vector<RankLog> read_run_logs(const std::string& run_dir);

// One line per unparsed log line: "<file>:<line>: unparsed line of N bytes: <printable preview>"; "" when none.
std::string garbled_report(const std::vector<RankLog>& logs);

// All lines at or above min_level (of one rank when rank >= 0), ordered by time, then rank, then file order.
std::vector<LogLine> merge_logs(const std::vector<RankLog>& logs, LogLevel min_level, int rank = -1);

// One line per rank: its prefix, line / warning / error counts, the age of its last timestamped line (before
// `now`, local seconds since the epoch; < 0 = the current time) and the line itself. A rank whose last line is
// more than straggler_seconds older than the newest last line of any rank is flagged "STRAGGLER": in a job that
// hangs, it is the rank that stopped first.
std::string summarise_logs(const std::vector<RankLog>& logs, double now = -1, double straggler_seconds = 60);

// "2026-11-29 11:56:26.928" (local time) as seconds since the epoch; < 0 when the text is not such a time.
double log_time_seconds(const std::string& time);

}  // namespace dflash::report
