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
#include "lib/train/log.h"
#include "lib/train/metrics.h"

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
    Logger target(dir.string(), {3, "target", 3}, LogLevel::kInfo, false);
    Logger drafter(dir.string(), {6, "drafter", 1}, LogLevel::kWarn, false);
    CHECK(target.path() == (dir / "logs" / "rank_03.log").string());
    CHECK(drafter.prefix() == "[rank 6 | drafter | 1]");
    target.debug("hidden {}", 1);
    target.info("step {} loss {:.3f}", 7, 2.5);
    target.warn("slow link to rank {}", 6);
    drafter.info("not written at level warn");
    drafter.warn("grad norm {}", 12.5);
    CHECK_FALSE(drafter.enabled(LogLevel::kInfo));
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

  // append keeps a resumed run's lines
  {
    Logger again(dir.string(), {3, "target", 3}, LogLevel::kInfo, false, /*append=*/true);
    again.info("resumed");
  }
  CHECK(lines_of((dir / "logs" / "rank_03.log").string()).size() == 3);
  fs::remove_all(dir);
}

TEST_CASE("log: levels parse from config and DFLASH_LOG_LEVEL overrides them") {
  CHECK(parse_log_level("debug") == LogLevel::kDebug);
  CHECK(parse_log_level("error") == LogLevel::kError);
  CHECK_THROWS_WITH_AS(parse_log_level("verbose", "config key 'log.level'"),
                       doctest::Contains("config key 'log.level' is 'verbose'; allowed: debug, info, warn, error"), Error);
  ::unsetenv("DFLASH_LOG_LEVEL");
  CHECK(resolve_log_level("warn") == LogLevel::kWarn);
  ::setenv("DFLASH_LOG_LEVEL", "debug", 1);
  CHECK(resolve_log_level("warn") == LogLevel::kDebug);
  ::setenv("DFLASH_LOG_LEVEL", "loud", 1);
  CHECK_THROWS_WITH_AS(resolve_log_level("info"), doctest::Contains("environment variable DFLASH_LOG_LEVEL is 'loud'"),
                       Error);
  ::unsetenv("DFLASH_LOG_LEVEL");
}

TEST_CASE("log: metrics.jsonl has one JSON object per line, in insertion order, NaN as null") {
  fs::path dir = fresh_dir("dflash_test_metrics");
  {
    MetricsWriter m(dir.string());
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
    MetricsWriter resumed(dir.string(), /*append=*/true);
    resumed.write({{"step", 50}});
  }
  CHECK(lines_of((dir / "metrics.jsonl").string()).size() == 5);
  fs::remove_all(dir);
}
