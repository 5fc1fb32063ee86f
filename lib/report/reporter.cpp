#include "lib/report/reporter.h"

#include "lib/core/error.h"

namespace dflash::report {

JsonlSink::JsonlSink(const std::string& out_dir, int64_t start_step, Logger& log) : writer_(out_dir, start_step) {
  if (writer_.dropped() > 0)
    log.warn("{}: dropped {} record(s) past step {} (steps a stopped attempt ran after its last checkpoint, or a "
             "torn line); kept {}", writer_.path(), writer_.dropped(), start_step, writer_.kept());
}

Reporter::Reporter(const ReporterSettings& s, Logger& log, comm::Transport& dp, std::function<uint64_t()> weights_hash)
    : s_(s), log_(log), dp_(dp), weights_hash_(std::move(weights_hash)), progress_(s.block_size) {}

void Reporter::add_sink(std::unique_ptr<MetricsSink> sink) { sinks_.push_back(std::move(sink)); }

bool Reporter::due(int log_every, int64_t next_step, bool last, bool stop) {
  return (log_every > 0 && next_step % log_every == 0) || last || stop;
}

// Every drafter rank must hold the same weights after each step; a divergence (non-deterministic reduction, a
// bad node) is an error rather than a silently forked run.
void Reporter::check_identical_weights(int64_t next_step) {
  uint64_t mine = weights_hash_(), root = mine;
  dp_.broadcast(&root, 1, 0);
  double differs = root != mine ? 1.0 : 0.0;
  dp_.allreduce_sum(&differs, 1);
  DFLASH_CHECK(differs == 0, "after step {}: {} drafter rank(s) hold weights that differ from drafter rank 0",
               next_step, differs);
}

void Reporter::after_step(const train::StepResult& r, int64_t next_step, bool last, bool stop) {
  progress_.add(r);
  if (r.skipped)
    log_.warn("step {}: no scored positions in the global batch (sum of weights 0): weights unchanged", next_step);
  if (!due(s_.log_every, next_step, last, stop)) return;
  check_identical_weights(next_step);
  const double secs = interval_.seconds();
  const double eta = secs / progress_.steps() * double(s_.total_steps - next_step);
  log_.info("{}", progress_.line(next_step, s_.total_steps, s_.top_k, secs, eta));
  if (s_.reporting) {
    const nlohmann::ordered_json record = progress_.record(next_step, secs, run_timer_.seconds());
    for (auto& sink : sinks_) sink->write(record);
  }
  interval_.reset();
  progress_.reset();
}

void Reporter::report(const ReportRecord& r) {
  if (!s_.reporting) return;
  log_.info("{}", r.line);
  for (auto& sink : sinks_) sink->write(r.metrics);
}

}  // namespace dflash::report
