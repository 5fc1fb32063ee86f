#pragma once
// Training metrics as JSONL: <out_dir>/metrics.jsonl, one JSON object per logged step, flushed per line so a
// crashed or running job can be plotted. Written by one rank (the first drafter rank). Keys keep their insertion
// order ("step" first, by convention); non-finite numbers are written as null (JSON has no NaN).
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace dflash {

class MetricsWriter {
 public:
  // Creates out_dir; append = continue a resumed run's file, else start a new one.
  explicit MetricsWriter(const std::string& out_dir, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // record must be a JSON object, e.g. {{"step", 10}, {"loss", 2.31}, {"lr", 6e-4}}.
  void write(const nlohmann::ordered_json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace dflash
