#pragma once
// Reading a run's per-rank logs (<out_dir>/logs/rank_XX.log, written by Logger) back: parse, merge by time,
// filter by rank and level, summarise. What `dflash_logs` prints; unit-tested without MPI.
#include <string>
#include <vector>

#include "lib/train/log.h"

namespace dflash {

struct LogLine {
  std::string time;    // "2026-11-29 11:56:26.928": sorts as text
  int rank = -1;       // world rank, from the file name
  std::string prefix;  // "[rank 5 | drafter | 0]"
  LogLevel level = LogLevel::kInfo;
  std::string message;
  std::string text;    // the whole line as written
};

struct RankLog {
  std::string path;
  int rank = -1;
  std::vector<LogLine> lines;  // lines that do not parse (e.g. a crash's partial write) are kept as info
  size_t count(LogLevel level) const;
};

// Every logs/rank_XX.log of run_dir, by rank. Throws naming the folder when there is none.
std::vector<RankLog> read_run_logs(const std::string& run_dir);

// All lines at or above min_level (of one rank when rank >= 0), ordered by time, then rank, then file order.
std::vector<LogLine> merge_logs(const std::vector<RankLog>& logs, LogLevel min_level, int rank = -1);

// One line per rank: its prefix, line / warning / error counts and its last line.
std::string summarise_logs(const std::vector<RankLog>& logs);

}  // namespace dflash
