// The watchdog on blocking waits: a wait armed past the timeout is reported once with its description; short
// waits never are; timeout 0 is off (no description is even built). The SIGSTOP test of the whole job is
// tests/integration/trainer_cli.sh, case watchdog.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "lib/train/watchdog.h"

using namespace dflash::train;
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

TEST_CASE("watchdog: tag names of the trainer's messages") {
  CHECK(tag_name(7101) == "packet header");
  CHECK(tag_name(7103) == "packet loss mask");
  CHECK(tag_name(42) == "tag 42");
}
