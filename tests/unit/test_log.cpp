// Per-rank logs and metrics.jsonl: files where they belong, the prefix, level filtering (config and env),
// and metrics lines that parse back as JSON.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/report/log.h"
#include "lib/report/metrics.h"

using namespace dflash;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  return lines;
}

fs::path fresh_dir(const char* name) {
  fs::path d = fs::temp_directory_path() / (name + std::string("_") + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

}  // namespace

TEST_CASE("log: one file per rank under out_dir/logs with the [rank | role | index] prefix and level filter") {
  fs::path dir = fresh_dir("dflash_test_log");
  {
    report::Logger target(dir.string(), {3, "target", 3}, report::LogLevel::kInfo, false);
    report::Logger drafter(dir.string(), {6, "drafter", 1}, report::LogLevel::kWarn, false);
    CHECK(target.path() == (dir / "logs" / "rank_03.log").string());
    CHECK(drafter.prefix() == "[rank 6 | drafter | 1]");
    target.debug("hidden {}", 1);
    target.info("step {} loss {:.3f}", 7, 2.5);
    target.warn("slow link to rank {}", 6);
    drafter.info("not written at level warn");
    drafter.warn("grad norm {}", 12.5);
    CHECK_FALSE(drafter.enabled(report::LogLevel::kInfo));
  }
  auto t = lines_of((dir / "logs" / "rank_03.log").string());
  REQUIRE(t.size() == 2);
  CHECK(t[0].find("[rank 3 | target | 3] info  step 7 loss 2.500") != std::string::npos);
  CHECK(t[1].find("[rank 3 | target | 3] warn  slow link to rank 6") != std::string::npos);
  CHECK(t[0].size() > 24);
  CHECK(t[0][4] == '-');  // starts with the date: YYYY-MM-DD hh:mm:ss.mmm
  auto d = lines_of((dir / "logs" / "rank_06.log").string());
  REQUIRE(d.size() == 1);
  CHECK(d[0].find("[rank 6 | drafter | 1] warn  grad norm 12.5") != std::string::npos);

  // a second attempt (a resume) appends after its header, at whatever level; the first attempt's lines stay
  {
    report::Logger again(dir.string(), {3, "target", 3}, report::LogLevel::kWarn, false,
                         "===== attempt: host h, pid 7 =====");
    again.info("not written at level warn");
    again.warn("resumed");
  }
  t = lines_of((dir / "logs" / "rank_03.log").string());
  REQUIRE(t.size() == 4);
  CHECK(t[1].find("warn  slow link to rank 6") != std::string::npos);
  CHECK(t[2].find("[rank 3 | target | 3] info  ===== attempt: host h, pid 7 =====") != std::string::npos);
  CHECK(t[3].find("warn  resumed") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("log: a failed write (full disk) is an error naming the log file") {
  fs::path dir = fresh_dir("dflash_test_log_full");
  fs::create_directories(dir / "logs");
  fs::create_symlink("/dev/full", dir / "logs" / "rank_04.log");  // every write: ENOSPC
  report::Logger full(dir.string(), {4, "target", 4}, report::LogLevel::kInfo, false);
  CHECK_THROWS_WITH_AS(full.info("step {}", 1),
                       doctest::Contains(
                           ((dir / "logs" / "rank_04.log").string() + " failed: No space left on device").c_str()),
                       Error);
  CHECK_THROWS_AS(report::Logger(dir.string(), {4, "target", 4}, report::LogLevel::kInfo, false, "===== attempt ====="),
                  Error);
  fs::remove_all(dir);
}

TEST_CASE("log: levels parse from config and DFLASH_LOG_LEVEL overrides them") {
  CHECK(report::parse_log_level("debug") == report::LogLevel::kDebug);
  CHECK(report::parse_log_level("error") == report::LogLevel::kError);
  CHECK_THROWS_WITH_AS(report::parse_log_level("verbose", "config key 'log.level'"),
                       doctest::Contains("config key 'log.level' is 'verbose'; allowed: debug, info, warn, error"),
                       Error);
  ::unsetenv("DFLASH_LOG_LEVEL");
  CHECK(report::resolve_log_level("warn") == report::LogLevel::kWarn);
  ::setenv("DFLASH_LOG_LEVEL", "debug", 1);
  CHECK(report::resolve_log_level("warn") == report::LogLevel::kDebug);
  ::setenv("DFLASH_LOG_LEVEL", "loud", 1);
  CHECK_THROWS_WITH_AS(report::resolve_log_level("info"),
                       doctest::Contains("environment variable DFLASH_LOG_LEVEL is 'loud'"), Error);
  ::unsetenv("DFLASH_LOG_LEVEL");
}

TEST_CASE("log: metrics.jsonl has one JSON object per line, in insertion order, NaN as null") {
  fs::path dir = fresh_dir("dflash_test_metrics");
  {
    report::MetricsWriter m(dir.string());
    CHECK(m.path() == (dir / "metrics.jsonl").string());
    for (int step = 10; step <= 30; step += 10)
      m.write({{"step", step}, {"loss", 3.0 / step}, {"lr", 6e-4}, {"acc", {0.5, 0.25}}});
    m.write({{"step", 40}, {"loss", std::nan("")}});
    CHECK_THROWS_WITH_AS(m.write(nlohmann::ordered_json::array({1, 2})), doctest::Contains("must be a JSON object"),
                         Error);
  }
  auto lines = lines_of((dir / "metrics.jsonl").string());
  REQUIRE(lines.size() == 4);
  CHECK(lines[0].rfind("{\"step\":10,", 0) == 0);  // step first
  for (int i = 0; i < 3; ++i) {
    auto j = nlohmann::json::parse(lines[i]);
    CHECK(j["step"] == 10 * (i + 1));
    CHECK(j["loss"].get<double>() == doctest::Approx(3.0 / (10 * (i + 1))));
    CHECK(j["lr"].get<double>() == 6e-4);
    CHECK(j["acc"][1].get<double>() == 0.25);
  }
  CHECK(nlohmann::json::parse(lines[3])["loss"].is_null());
  {
    report::MetricsWriter resumed(dir.string(), /*start_step=*/40);
    CHECK(resumed.kept() == 4);
    CHECK(resumed.dropped() == 0);
    resumed.write({{"step", 50}});
    CHECK_THROWS_WITH_AS(resumed.write({{"loss", 1.0}}), doctest::Contains("integer \"step\""), Error);
  }
  CHECK(lines_of((dir / "metrics.jsonl").string()).size() == 5);
  fs::remove_all(dir);
}

TEST_CASE("log: metrics.jsonl after a crash and a resume is one clean series (later records and torn lines dropped)") {
  fs::path dir = fresh_dir("dflash_test_metrics_resume");
  const std::string path = (dir / "metrics.jsonl").string();
  {
    report::MetricsWriter m(dir.string());
    for (int step = 1; step <= 8; ++step) m.write({{"step", step}, {"loss", 1.0 / step}});
  }
  {  // kill -9 in the middle of a line
    std::ofstream f(path, std::ios::app);
    f << "{\"step\":9,\"lo";
  }
  {  // resumed from the checkpoint of step 5: steps 6..8 and the torn line are gone, 6.. are written again
    report::MetricsWriter m(dir.string(), 5);
    CHECK(m.kept() == 5);
    CHECK(m.dropped() == 4);
    for (int step = 6; step <= 7; ++step) m.write({{"step", step}, {"loss", 2.0 / step}});
  }
  auto lines = lines_of(path);
  REQUIRE(lines.size() == 7);
  for (int i = 0; i < 7; ++i) CHECK(nlohmann::json::parse(lines[size_t(i)])["step"] == i + 1);
  CHECK(nlohmann::json::parse(lines[4])["loss"].get<double>() == doctest::Approx(1.0 / 5));
  CHECK(nlohmann::json::parse(lines[5])["loss"].get<double>() == doctest::Approx(2.0 / 6));
  CHECK(!fs::exists(path + ".partial"));  // rewritten through write_file_atomic
  {  // a run from scratch in the same folder starts a new series
    report::MetricsWriter m(dir.string(), 0);
    CHECK(m.dropped() == 7);
  }
  CHECK(fs::file_size(path) == 0);
  fs::remove_all(dir);
}

TEST_CASE("log: a failed metrics write (full disk) is an error naming the file and the step") {
  fs::path dir = fresh_dir("dflash_test_metrics_full");
  fs::create_directories(dir);
  fs::create_symlink("/dev/full", dir / "metrics.jsonl");  // every write: ENOSPC
  report::MetricsWriter m(dir.string(), 0);
  CHECK_THROWS_WITH_AS(m.write({{"step", 3}, {"loss", 1.0}}),
                       doctest::Contains(
                           ((dir / "metrics.jsonl").string() + " failed at step 3: No space left on device").c_str()),
                       Error);
  fs::remove_all(dir);
}
