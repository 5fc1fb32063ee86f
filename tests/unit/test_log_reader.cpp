// dflash_logs' reader: logs written by Logger parse back, merge by time across ranks, filter, summarise.
#include <doctest/doctest.h>

#include <fstream>

#include "lib/core/error.h"
#include "lib/train/log.h"
#include "lib/train/log_reader.h"
#include "test_util.h"

using namespace dflash;

TEST_CASE("log reader: Logger output parses back, merges by time, filters by level and rank") {
  const std::string dir = test::scratch_dir("log_reader").string();
  {
    Logger target(dir, {0, "target", 0}, LogLevel::kDebug, false);
    Logger drafter(dir, {5, "drafter", 0}, LogLevel::kDebug, false);
    target.info("target: step {} | {} tok/s", 10, 900);
    drafter.warn("step {}: no scored positions", 3);
    target.debug("detail");
    drafter.info("step 10/20 | loss {:.3f}", 6.5);
  }
  {  // a torn last line (a crash mid-write) is kept, unparsed
    std::ofstream f(dir + "/logs/rank_05.log", std::ios::app);
    f << "2026-11-29 12:00:00.0";
  }
  const auto logs = read_run_logs(dir);
  REQUIRE(logs.size() == 2);
  CHECK(logs[0].rank == 0);
  CHECK(logs[1].rank == 5);
  REQUIRE(logs[0].lines.size() == 2);
  CHECK(logs[0].lines[0].prefix == "[rank 0 | target | 0]");
  CHECK(logs[0].lines[0].message == "target: step 10 | 900 tok/s");
  CHECK(logs[0].lines[1].level == LogLevel::kDebug);
  REQUIRE(logs[1].lines.size() == 3);
  CHECK(logs[1].lines[0].level == LogLevel::kWarn);
  CHECK(logs[1].count(LogLevel::kWarn) == 1);
  CHECK(logs[1].lines[2].message == "2026-11-29 12:00:00.0");

  const auto all = merge_logs(logs, LogLevel::kDebug);
  CHECK(all.size() == 5);
  for (size_t i = 1; i < all.size(); ++i)
    if (!all[i].time.empty() && !all[i - 1].time.empty()) CHECK(all[i - 1].time <= all[i].time);
  const auto warnings = merge_logs(logs, LogLevel::kWarn);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].rank == 5);
  CHECK(merge_logs(logs, LogLevel::kDebug, 0).size() == 2);

  const std::string summary = summarise_logs(logs);
  CHECK(summary.find("[rank 0 | target | 0]") != std::string::npos);
  CHECK(summary.find("detail") != std::string::npos);  // rank 0's last line
  CHECK_THROWS_WITH_AS(read_run_logs(dir + "/nothing"), doctest::Contains("no logs/ folder"), dflash::Error);
}
