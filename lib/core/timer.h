#pragma once
// Wall-clock timing for logs and benchmarks.
#include <chrono>

namespace dflash {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Timer {
  double start = now_seconds();
  double seconds() const { return now_seconds() - start; }
  void reset() { start = now_seconds(); }
};

}  // namespace dflash
