#pragma once
// What the drafter ranks report after each step (torchtitan's metrics logger with its list of sinks): the
// progress interval (one line every log.every steps, at the last step and at a stop), the weights-hash check
// across drafter ranks at each of those steps, and the records that go to every metrics sink. The trainer emits
// one record; the sinks decide where it goes (JsonlSink: <out_dir>/metrics.jsonl; a TensorBoard or W&B sink is
// one more MetricsSink and one add_sink line where the reporter is built).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/comm/transport.h"
#include "lib/core/timer.h"
#include "lib/report/log.h"
#include "lib/report/metrics.h"
#include "lib/report/progress.h"
#include "lib/train/drafter_step.h"

namespace dflash::report {

// Where metrics records go. Records are JSON objects with an integer "step" (and "kind" for non-training ones).
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void write(const nlohmann::ordered_json& record) = 0;
};

// <out_dir>/metrics.jsonl (MetricsWriter: one clean series across attempts; the drop on open is logged).
class JsonlSink : public MetricsSink {
 public:
  JsonlSink(const std::string& out_dir, int64_t start_step, Logger& log);
  void write(const nlohmann::ordered_json& record) override { writer_.write(record); }

 private:
  MetricsWriter writer_;
};

// One thing to report besides the progress interval (an eval's result): its line and its metrics record.
struct ReportRecord {
  std::string line;
  nlohmann::ordered_json metrics;
};

struct ReporterSettings {
  int log_every = 1;         // log.every
  int64_t total_steps = 0;
  int top_k = 1;             // loss.top_k (the progress line's top-k accuracy)
  int block_size = 1;
  bool reporting = false;    // this rank writes the records and logs the eval lines (drafter rank 0)
};

class Reporter {
 public:
  // dp, weights_hash (DrafterStep::weights_hash): the check that every drafter rank holds the same weights,
  // collective over the drafter DP group at every progress line.
  Reporter(const ReporterSettings& s, Logger& log, comm::Transport& dp, std::function<uint64_t()> weights_hash);
  void add_sink(std::unique_ptr<MetricsSink> sink);

  // The progress interval ends after `next_step` steps: every log_every steps (0: never), at the last step, at a stop.
  static bool due(int log_every, int64_t next_step, bool last, bool stop);
  // After each step (every drafter rank: the check is collective): sums the step into the interval; when due,
  // checks the weights, logs the progress line and sends its record to the sinks.
  void after_step(const train::StepResult& r, int64_t next_step, bool last, bool stop);
  // Drafter rank 0: logs the line and sends the record to every sink; other ranks: nothing.
  void report(const ReportRecord& r);

 private:
  void check_identical_weights(int64_t next_step);

  ReporterSettings s_;
  Logger& log_;
  comm::Transport& dp_;
  std::function<uint64_t()> weights_hash_;
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
  ProgressInterval progress_;
  Timer run_timer_, interval_;
};

}  // namespace dflash::report
