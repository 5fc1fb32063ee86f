#include "lib/train/metrics.h"

#include <filesystem>

#include "lib/core/error.h"

namespace dflash {

MetricsWriter::MetricsWriter(const std::string& out_dir, bool append) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  DFLASH_CHECK(!ec, "cannot create '{}': {}; set run.out_dir to a writable folder", out_dir, ec.message());
  path_ = (fs::path(out_dir) / "metrics.jsonl").string();
  file_ = std::fopen(path_.c_str(), append ? "a" : "w");
  DFLASH_CHECK(file_, "cannot open '{}' for writing; check run.out_dir", path_);
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::ordered_json& record) {
  DFLASH_CHECK(record.is_object(), "metrics record must be a JSON object, got {}", record.dump());
  // replace: invalid UTF-8 in a string must not throw in the middle of training
  std::string line = record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::fputs(line.c_str(), file_);
  std::fflush(file_);
}

}  // namespace dflash
