// dflash_logs' reader: logs written by Logger parse back, merge by time across ranks, filter, summarise.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <sys/stat.h>

#include "lib/core/error.h"
#include "lib/report/log.h"
#include "lib/report/log_reader.h"
#include "test_util.h"

using namespace dflash;

TEST_CASE("log reader: Logger output parses back, merges by time, filters by level and rank") {
  const std::string dir = test::scratch_dir("log_reader").string();
  {
    report::Logger target(dir, {0, "target", 0}, report::LogLevel::kDebug, false);
    report::Logger drafter(dir, {5, "drafter", 0}, report::LogLevel::kDebug, false);
    target.info("target: step {} | {} tok/s", 10, 900);
    drafter.warn("step {}: no scored positions", 3);
    target.debug("detail");
    drafter.info("step 10/20 | loss {:.3f}", 6.5);
  }
  {  // a torn last line (a crash mid-write) is kept, unparsed
    std::ofstream f(dir + "/logs/rank_05.log", std::ios::app);
    f << "2026-11-29 12:00:00.0";
  }
  const auto logs = report::read_run_logs(dir);
  REQUIRE(logs.size() == 2);
  CHECK(logs[0].rank == 0);
  CHECK(logs[1].rank == 5);
  REQUIRE(logs[0].lines.size() == 2);
  CHECK(logs[0].lines[0].prefix == "[rank 0 | target | 0]");
  CHECK(logs[0].lines[0].message == "target: step 10 | 900 tok/s");
  CHECK(logs[0].lines[1].level == report::LogLevel::kDebug);
  REQUIRE(logs[1].lines.size() == 3);
  CHECK(logs[1].lines[0].level == report::LogLevel::kWarn);
  CHECK(logs[1].count(report::LogLevel::kWarn) == 1);
  CHECK(logs[1].lines[2].message == "2026-11-29 12:00:00.0");

  const auto all = report::merge_logs(logs, report::LogLevel::kDebug);
  CHECK(all.size() == 5);
  for (size_t i = 1; i < all.size(); ++i)
    if (!all[i].time.empty() && !all[i - 1].time.empty()) CHECK(all[i - 1].time <= all[i].time);
  const auto warnings = report::merge_logs(logs, report::LogLevel::kWarn);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].rank == 5);
  CHECK(report::merge_logs(logs, report::LogLevel::kDebug, 0).size() == 2);

  const std::string summary = report::summarise_logs(logs);
  CHECK(summary.find("[rank 0 | target | 0]") != std::string::npos);
  CHECK(summary.find("detail") != std::string::npos);  // rank 0's last line
  CHECK_THROWS_WITH_AS(report::read_run_logs(dir + "/nothing"), doctest::Contains("no logs/ folder"), dflash::Error);
}

namespace {
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}
}  // namespace

TEST_CASE("log reader: a torn line followed by NUL bytes (a node crash) is reported with file:line, not a crash") {
  const std::string dir = test::scratch_dir("log_reader_garbled").string();
  {
    report::Logger drafter(dir, {5, "drafter", 0}, report::LogLevel::kDebug, false);
    drafter.info("step 1/2 | loss {:.3f}", 6.5);
  }
  const std::string path = dir + "/logs/rank_05.log";
  // a torn line, 200 KB of NUL bytes (what a crashed node leaves in a preallocated block), then a valid line
  const std::string torn = "2026-11-29 12:00:00.123 [rank 5 | drafter | 0] info  step 2/2 | lo";
  write_bytes(path, torn + std::string(200000, '\0') + "\n" + std::string(40000, 'x') + "\n");
  {
    report::Logger drafter(dir, {5, "drafter", 0}, report::LogLevel::kDebug, false);  // appends, like a resume
    drafter.warn("resumed");
  }
  const auto logs = report::read_run_logs(dir);
  REQUIRE(logs.size() == 1);
  const report::RankLog& log = logs[0];
  REQUIRE(log.lines.size() == 4);
  CHECK(log.lines[0].parsed);
  CHECK(log.lines[0].message == "step 1/2 | loss 6.500");
  CHECK(!log.lines[1].parsed);
  CHECK(log.lines[1].line_no == 2);
  CHECK(log.lines[2].line_no == 3);
  CHECK(log.lines[3].parsed);
  CHECK(log.lines[3].level == report::LogLevel::kWarn);
  CHECK(log.lines[3].line_no == 4);
  CHECK(log.garbled() == 2);
  // shown shortened and printable: no NUL byte reaches a terminal
  CHECK(log.lines[1].text.size() < 300);
  CHECK(log.lines[1].text.find('\0') == std::string::npos);
  const std::string report = report::garbled_report(logs);
  CHECK(report.find(fmt::format("{}:2: unparsed line of {} bytes", path, torn.size() + 200000)) != std::string::npos);
  CHECK(report.find(path + ":3: unparsed line of 40000 bytes") != std::string::npos);
  CHECK(report::summarise_logs(logs).find("2 garbled (first at " + path + ":2)") != std::string::npos);
}

TEST_CASE("log reader: every well-formed level and prefix parses, near misses are garbled, not misread") {
  const std::string dir = test::scratch_dir("log_reader_forms").string();
  std::filesystem::create_directories(dir + "/logs");
  write_bytes(dir + "/logs/rank_00.log",
              "2026-11-29 12:00:00.001 [rank 0 | target | group 1 tp 0] debug x\n"
              "2026-11-29 12:00:00.002 [rank 0 | target | 0] error  two spaces kept: a  b\n"
              "2026-11-29 12:00:00.003 [rank 0 | target | 0] info  \n"
              "2026-11-29 12:00:00.004 [rank 0 | target | 0] fatal x\n"      // unknown level
              "2026-11-29 12:00:0a.004 [rank 0 | target | 0] info  x\n"      // not a digit
              "2026-11-29 12:00:00.004 [rank 0 | target | 0 info  x\n"       // unclosed prefix
              "2026-11-29 12:00:00.004 [rank 0 | target | 0] infox\n");      // no space after the level
  const auto logs = report::read_run_logs(dir);
  const auto& l = logs[0].lines;
  REQUIRE(l.size() == 7);
  CHECK(l[0].parsed);
  CHECK(l[0].prefix == "[rank 0 | target | group 1 tp 0]");
  CHECK(l[0].level == report::LogLevel::kDebug);
  CHECK(l[0].time == "2026-11-29 12:00:00.001");
  CHECK(l[1].level == report::LogLevel::kError);
  CHECK(l[1].message == "two spaces kept: a  b");
  CHECK(l[2].parsed);
  CHECK(l[2].message == "");
  for (int i = 3; i < 7; ++i) CHECK_MESSAGE(!l[i].parsed, "line ", i + 1);
  CHECK(logs[0].garbled() == 4);
}

TEST_CASE("log reader: a rank file name out of range or a folder where a log should be is an error naming it") {
  const std::string dir = test::scratch_dir("log_reader_names").string();
  std::filesystem::create_directories(dir + "/logs");
  write_bytes(dir + "/logs/rank_05.log", "");
  write_bytes(dir + "/logs/notes.txt", "not a log\n");  // other files are ignored
  CHECK(report::read_run_logs(dir).size() == 1);
  write_bytes(dir + "/logs/rank_99999999999999999999.log", "x\n");
  CHECK_THROWS_WITH_AS(report::read_run_logs(dir),
                       doctest::Contains("rank_99999999999999999999.log: rank number out of range"), dflash::Error);
  std::filesystem::remove(dir + "/logs/rank_99999999999999999999.log");
  std::filesystem::create_directories(dir + "/logs/rank_07.log");
  CHECK_THROWS_WITH_AS(report::read_run_logs(dir), doctest::Contains("rank_07.log is a folder, not a log file"),
                       dflash::Error);
}

TEST_CASE("log reader: a FIFO where a log should be is refused by name, never read (it would block)") {
  const std::string dir = test::scratch_dir("log_reader_fifo").string();
  std::filesystem::create_directories(dir + "/logs");
  write_bytes(dir + "/logs/rank_00.log", "");
  REQUIRE(mkfifo((dir + "/logs/rank_01.log").c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(report::read_run_logs(dir),
                       doctest::Contains("rank_01.log is not a regular file (a FIFO, socket or device)"),
                       dflash::Error);
}

TEST_CASE("log reader: the summary shows each rank's last-line age and flags stragglers") {
  const std::string dir = test::scratch_dir("log_reader_age").string();
  std::filesystem::create_directories(dir + "/logs");
  write_bytes(dir + "/logs/rank_00.log", "2026-11-29 12:00:00.000 [rank 0 | target | 0] info  a\n"
                                         "2026-11-29 12:10:00.000 [rank 0 | target | 0] info  step 90\n");
  write_bytes(dir + "/logs/rank_06.log", "2026-11-29 12:03:00.500 [rank 6 | drafter | 1] info  step 20\n");
  const double t0 = report::log_time_seconds("2026-11-29 12:10:00.000");
  REQUIRE(t0 > 0);
  CHECK(report::log_time_seconds("2026-11-29 12:03:00.500") == doctest::Approx(t0 - 419.5));
  CHECK(report::log_time_seconds("not a time") < 0);
  const std::string s = report::summarise_logs(report::read_run_logs(dir), t0 + 30, 60);
  CHECK(s.find("age") != std::string::npos);
  CHECK(s.find("  30 s  step 90") != std::string::npos);
  CHECK(s.find("  7 min  step 20") != std::string::npos);
  CHECK(s.find("STRAGGLER: its last line is 7 min older than the newest of any rank") != std::string::npos);
  CHECK(s.find("STRAGGLER") == s.rfind("STRAGGLER"));  // rank 0 is not one
}
