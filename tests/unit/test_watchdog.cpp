// The watchdog on blocking waits: a wait armed past the timeout is reported once with its description; short
// waits never are; timeout 0 is off (no description is even built). The SIGSTOP test of the whole job is
// tests/integration/trainer_cli.sh, case watchdog.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "lib/comm/tags.h"
#include "lib/train/heartbeat.h"
#include "lib/train/watchdog.h"

using namespace dflash::train;
namespace comm = dflash::comm;
using namespace std::chrono_literals;

namespace {
struct Stalls {
  std::mutex mutex;
  std::string what;
  double waited = 0;
  int count = 0;
  void operator()(const std::string& w, double s) {
    std::lock_guard<std::mutex> lock(mutex);
    what = w, waited = s, ++count;
  }
};
}  // namespace

TEST_CASE("watchdog: a wait longer than the timeout is reported once, with what it waits on") {
  Stalls stalls;
  Watchdog w(0.2, [&](const std::string& what, double s) { stalls(what, s); });
  {
    auto g = w.arm([] { return std::string("receive of packet taps (64 bytes) from rank 2 of the world"); });
    std::this_thread::sleep_for(900ms);
  }
  std::lock_guard<std::mutex> lock(stalls.mutex);
  CHECK(stalls.count == 1);
  CHECK(stalls.what == "receive of packet taps (64 bytes) from rank 2 of the world");
  CHECK(stalls.waited >= 0.2);
  CHECK(stalls.waited < 0.8);
}

TEST_CASE("watchdog: many short waits, and time between waits, are never reported") {
  Stalls stalls;
  Watchdog w(0.3, [&](const std::string& what, double s) { stalls(what, s); });
  for (int i = 0; i < 40; ++i) {
    auto g = w.arm([] { return std::string("all-reduce"); });
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(700ms);  // not waiting (computing): not watched
  std::lock_guard<std::mutex> lock(stalls.mutex);
  CHECK(stalls.count == 0);
}

TEST_CASE("watchdog: timeout 0 is off") {
  Stalls stalls;
  Watchdog w(0, [&](const std::string& what, double s) { stalls(what, s); });
  CHECK(!w.on());
  bool described = false;
  {
    auto g = w.arm([&] {
      described = true;
      return std::string("x");
    });
    std::this_thread::sleep_for(50ms);
  }
  CHECK(!described);
  CHECK(stalls.count == 0);
}

TEST_CASE("watchdog: tag names of the trainer's messages, one per tag of the table") {
  CHECK(comm::tag_name(7101) == "packet header");
  CHECK(comm::tag_name(comm::kTagMask) == "packet loss mask");
  CHECK(comm::tag_name(comm::kTagSpecResult) == "speculative-eval result");
  CHECK(comm::tag_name(comm::kTagDumpFinal) == "step-dump final hidden");
  CHECK(comm::tag_name(42) == "tag 42");
  // no two tags share a number or a name
  std::set<int> numbers;
  std::set<std::string> names;
  int count = 0;
  for (int t : {comm::kTagHeader, comm::kTagTokens, comm::kTagMask, comm::kTagTaps, comm::kTagFinal, comm::kTagStop,
                comm::kTagLast, comm::kTagSpecWeights, comm::kTagSpecResultSize, comm::kTagSpecResult,
                comm::kTagDumpHeader, comm::kTagDumpTokens, comm::kTagDumpMask, comm::kTagDumpAnchors,
                comm::kTagDumpTaps, comm::kTagDumpFinal}) {
    numbers.insert(t);
    names.insert(comm::tag_name(t));
    ++count;
  }
  CHECK(int(numbers.size()) == count);
  CHECK(int(names.size()) == count);
}

TEST_CASE("watchdog: the bound follows the steps, with a floor and a cap, and evals and saves are held to the cap") {
  Watchdog w(100, [](const std::string&, double) {});
  w.follow_steps(0.5, 4);
  CHECK(w.bound() == 100);  // before the first steps: run.watchdog_seconds
  CHECK(w.bound_reason().find("before the first steps") != std::string::npos);
  w.step_done();
  std::this_thread::sleep_for(50ms);
  w.step_done();
  CHECK(w.bound() == 0.5);  // 4 x ~0.05 s is below the floor
  CHECK(w.bound_reason().find("run.watchdog_floor_seconds") != std::string::npos);
  std::this_thread::sleep_for(300ms);
  w.step_done();
  CHECK(w.bound() >= 4 * 0.3);  // 4 x the slowest step
  CHECK(w.bound() < 4 * 0.3 + 1.5);
  w.relax(1);  // an eval: held to the cap, and not counted as a step
  CHECK(w.bound() == 100);
  std::this_thread::sleep_for(400ms);
  w.step_done();
  CHECK(w.bound() < 4 * 0.4);  // the relaxed 0.4 s interval did not become the slowest step
  Watchdog fixed(100, [](const std::string&, double) {});
  fixed.follow_steps(0.5, 0);  // multiple 0: the fixed bound
  fixed.step_done();
  std::this_thread::sleep_for(20ms);
  fixed.step_done();
  CHECK(fixed.bound() == 100);
}

TEST_CASE("watchdog: a wait past the bound that follows the steps is reported, and heartbeats say what the rank does") {
  Stalls stalls;
  const std::string dir = (std::filesystem::temp_directory_path() / ("dflash_hb_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir + "/logs");
  {
    Watchdog w(30, [&](const std::string& what, double s) { stalls(what, s); });
    w.follow_steps(0.3, 2);
    w.beat_to(heartbeat_path(dir, 1));
    w.step_done();
    std::this_thread::sleep_for(20ms);
    w.step_done();
    auto g = w.arm([] { return std::string("all-reduce of 8 floats on the drafter DP group"); });
    std::this_thread::sleep_for(1500ms);  // the bound is the 0.3 s floor, not 30 s
  }
  {
    std::lock_guard<std::mutex> lock(stalls.mutex);
    CHECK(stalls.count == 1);
    CHECK(stalls.what == "all-reduce of 8 floats on the drafter DP group");
  }
  // rank 0: a heartbeat 20 s old (stopped); rank 1: the watchdog's own (waiting); rank 2: alive, not waiting;
  // rank 3: none
  const double now = double(std::time(nullptr));
  std::ofstream(heartbeat_path(dir, 0)) << "{\"alive\": " << std::to_string(now - 20) << ", \"waiting\": null}\n";
  std::ofstream(heartbeat_path(dir, 2)) << "{\"alive\": " << std::to_string(now) << ", \"waiting\": null}\n";
  const std::string d = diagnose_heartbeats(dir, 4, now, 5.0, [](int r) { return r == 0 ? "target" : "drafter"; });
  CHECK(d.find("world rank 0 (target): STOPPED: no heartbeat for 20 s") != std::string::npos);
  CHECK(d.find("world rank 1 (drafter): waits") != std::string::npos);
  CHECK(d.find("for the all-reduce of 8 floats on the drafter DP group") != std::string::npos);
  CHECK(d.find("world rank 2 (drafter): alive and not in a wait") != std::string::npos);
  CHECK(d.find("world rank 3 (drafter): no readable heartbeat") != std::string::npos);
  CHECK(d.find("STOPPED") < d.find("waits"));  // the suspects come first
  std::filesystem::remove_all(dir);
}
