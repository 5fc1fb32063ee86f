#pragma once
// Training metrics as JSONL: <out_dir>/metrics.jsonl, one JSON object per logged step, flushed per line so a
// crashed or running job can be plotted. Written by one rank (the first drafter rank). Keys keep their insertion
// order ("step" first, by convention); non-finite numbers are written as null (JSON has no NaN).
//
// One clean series across attempts: a run that starts at step s (0 = from scratch, else the resumed
// checkpoint's step) first drops every record past s (records of steps a crash lost, a torn last line), by
// rewriting the file atomically (lib/core/atomic_file.h), then appends. A failed write is an error naming the
// file and the step.
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace dflash::report {

class MetricsWriter {
 public:
  // Creates out_dir; keeps the records of <out_dir>/metrics.jsonl with "step" <= start_step, drops the rest.
  explicit MetricsWriter(const std::string& out_dir, int64_t start_step = 0);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // record must be a JSON object with an integer "step", e.g. {{"step", 10}, {"loss", 2.31}, {"lr", 6e-4}}.
  void write(const nlohmann::ordered_json& record);
  const std::string& path() const { return path_; }
  int64_t kept() const { return kept_; }        // records of earlier attempts kept on open
  int64_t dropped() const { return dropped_; }  // lines dropped on open (past start_step, or not a JSON record)

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t kept_ = 0, dropped_ = 0;
};

}  // namespace dflash::report
