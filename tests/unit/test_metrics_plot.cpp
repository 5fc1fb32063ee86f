// dflash_logs plot: metrics.jsonl read back as columns (nulls and torn lines tolerated) and drawn as an SVG of
// eight panels.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "lib/core/error.h"
#include "apps/dflash_logs/metrics_plot.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::report;

namespace {
size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("metrics plot: records become columns, nulls are gaps, a torn line is skipped and counted") {
  const std::string dir = test::scratch_dir("metrics_plot").string();
  {
    std::ofstream f(dir + "/metrics.jsonl");
    f << R"({"step":10,"loss":3.5,"ce":3.0,"kl":1.0,"cap":0.1,"acc":0.1,"acc_by_pos":[0.2,0.1],"topk_acc":0.3,)"
         R"("tau":1.2,"lr":1e-3,"grad_norm":2.0,"tokens_per_s":900,"wait_share":0.5})" "\n";
    f << R"({"step":20,"loss":null,"ce":2.5,"kl":0.9,"cap":0.1,"acc":0.2,"acc_by_pos":[0.3,0.2],"topk_acc":0.4,)"
         R"("tau":1.4,"lr":2e-3,"grad_norm":1.5,"tokens_per_s":950,"wait_share":0.4})" "\n";
    f << R"({"step":30,"loss":2.9,"ce":2.4,"kl":0.8,"cap":0.1,"acc":0.3,"acc_by_pos":[0.4,0.3],"topk_acc":0.5,)"
         R"("tau":1.6,"lr":1e-3,"grad_norm":1.0,"tokens_per_s":1000,"wait_share":0.3})" "\n";
    f << R"({"step":40,"lo)";
  }
  int skipped = 0;
  const MetricsSeries s = read_metrics(dir, &skipped);
  CHECK(skipped == 1);
  REQUIRE(s.steps == std::vector<double>{10, 20, 30});
  CHECK(s.block_positions == 2);
  CHECK(std::isnan(s.values.at("loss")[1]));
  CHECK(s.values.at("loss")[2] == 2.9);
  CHECK(s.values.at("acc_pos2")[2] == 0.3);
  CHECK(s.values.at("tokens_per_s")[0] == 900);

  const std::string svg = plot_metrics_svg(s, "run <x>");
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("</svg>") == svg.size() - 7);
  CHECK(svg.find("run &lt;x&gt;") != std::string::npos);
  for (const char* title : {"loss and its parts", "accuracy by block position k", "tau (accepted length",
                            "learning rate", "gradient norm", "tokens/s", "waiting for packets (%)", "top-1, top-k"})
    CHECK_MESSAGE(svg.find(title) != std::string::npos, title);
  // loss: 2 pieces (the null splits it), ce/kl/cap 3, acc_pos1..2 2, tau, lr, grad norm, tok/s, wait 5, acc/topk 2
  CHECK(count(svg, "<polyline") == 2 + 3 + 2 + 5 + 2);
  CHECK(count(svg, "no data") == 0);
  // geometry: the first loss point (step 10 = the first step, 3.5 = the panel's maximum) is the plot area's
  // top-left corner (x 62 = left margin, y 52 = 30 header + 22 panel title); cap 0.1 (the minimum) at its bottom
  CHECK(svg.find("points=\"62.0,52.0 ") != std::string::npos);
  const double bottom = 30 + (900.0 - 30) / 4 - 6 - 22;  // panel height minus the step labels' margin
  CHECK(svg.find(fmt::format("points=\"62.0,{:.1f} ", bottom)) != std::string::npos);
}

TEST_CASE("metrics plot: a run folder without metrics is an error naming the file") {
  const std::string dir = test::scratch_dir("metrics_plot_none").string();
  CHECK_THROWS_WITH_AS(read_metrics(dir), doctest::Contains("metrics.jsonl: no such file"), Error);
  std::ofstream(dir + "/metrics.jsonl") << "garbage\n";
  CHECK_THROWS_WITH_AS(read_metrics(dir), doctest::Contains("no metrics record"), Error);
}

TEST_CASE("metrics plot: a metrics.jsonl that is a folder or a FIFO is refused as such (a FIFO would block)") {
  const std::string dir = test::scratch_dir("metrics_plot_not_file").string();
  std::filesystem::create_directories(dir + "/metrics.jsonl");
  CHECK_THROWS_WITH_AS(read_metrics(dir), doctest::Contains("metrics.jsonl is a folder, not the metrics file"), Error);
  std::filesystem::remove(dir + "/metrics.jsonl");
  REQUIRE(mkfifo((dir + "/metrics.jsonl").c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(read_metrics(dir), doctest::Contains("metrics.jsonl is not a regular file (a FIFO"), Error);
}
