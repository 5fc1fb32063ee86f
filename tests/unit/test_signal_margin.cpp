// The slurm signal margin --check recommends: measured from an earlier attempt's metrics and logs.
#include <doctest/doctest.h>

#include <fstream>

#include "lib/report/log.h"
#include "lib/preflight/signal_margin.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::report;
using namespace dflash::preflight;

TEST_CASE("signal margin: 2 x (measured step + longest save) + 60 s, rounded up to minutes, 600 s unmeasured") {
  const std::string dir = test::scratch_dir("signal_margin").string();
  preflight::SignalMargin none = recommend_signal_margin(dir);
  CHECK(!none.measured);
  CHECK(none.margin_seconds == 600);

  {  // two attempts: elapsed_s restarts; the last pair of the last attempt gives 45 s per step
    std::ofstream f(dir + "/metrics.jsonl");
    f << R"({"step":10,"elapsed_s":100.0})" "\n" R"({"step":20,"elapsed_s":200.0})" "\n"
      << R"({"step":30,"elapsed_s":50.0})" "\n" R"({"step":40,"elapsed_s":500.0})" "\n";
  }
  {
    report::Logger log(dir, {5, "drafter", 0}, report::LogLevel::kInfo, false);
    log.info("checkpoint: {}/ckpt/step_00000020 ({:.2f} s)", dir, 80.0);
    log.info("checkpoint: {}/ckpt/step_00000040 ({:.2f} s); removed 1 older", dir, 130.5);
    log.info("step 40/100 | loss 2.0");
  }
  const SignalMargin m = recommend_signal_margin(dir);
  CHECK(m.measured);
  CHECK(m.step_seconds == doctest::Approx(45.0));
  CHECK(m.save_seconds == doctest::Approx(130.5));
  CHECK(m.margin_seconds == 420);  // 2 x 175.5 + 60 = 411 -> 7 min
}
