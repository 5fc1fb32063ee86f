#pragma once
// What the first drafter rank reports every log.every steps: sums and counts of the steps since the last report
// (loss parts weighted by Σw, accuracy per block position, top-k, τ), rates and shares of wall time, as one
// progress line and one metrics.jsonl object.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/train/drafter_step.h"

namespace dflash::report {

class ProgressInterval {
 public:
  explicit ProgressInterval(int block_size) : block_size_(block_size) { reset(); }

  void add(const train::StepResult& r);  // one step's global result and this rank's timings
  // Both describe the interval ending after step `next_step` (1-based count) of `total_steps`.
  std::string line(int64_t next_step, int64_t total_steps, int top_k, double seconds, double eta_seconds) const;
  nlohmann::ordered_json record(int64_t next_step, double seconds, double elapsed_seconds) const;
  int64_t steps() const { return steps_; }
  void reset();

 private:
  struct Rates {
    double loss, ce, kl, cap, acc, topk, tau;
    std::vector<double> acc_by_pos;  // k = 1..B-1
  };
  Rates rates() const;

  int block_size_;
  train::StepResult sum_;  // sums and counts of the interval's steps
  double last_lr_ = 0, last_grad_norm_ = 0;
  int64_t steps_ = 0, tokens_ = 0;
  double wait_ = 0, compute_ = 0;
};

}  // namespace dflash::report
