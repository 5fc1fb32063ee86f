#include "lib/report/metrics.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"

namespace dflash::report {

namespace {

// The "step" of one metrics line, or -1 when the line is not a JSON object with an integer step (a torn write).
int64_t step_of(const std::string& line) {
  const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return -1;
  return j["step"].get<int64_t>();
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& out_dir, int64_t start_step) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  DFLASH_USER_CHECK(!ec, "cannot create '{}': {}; set run.out_dir to a writable folder", out_dir, ec.message());
  path_ = (fs::path(out_dir) / "metrics.jsonl").string();
  // only a regular file is rewritten (a pipe or device the user pointed it at is appended to as it is)
  if (fs::is_regular_file(path_)) {
    std::ifstream in(path_, std::ios::binary);
    DFLASH_USER_CHECK(in, "cannot read {}: {}", path_, std::strerror(errno));
    std::string kept, line;
    while (std::getline(in, line)) {
      const int64_t step = step_of(line);
      if (step >= 1 && step <= start_step) {
        kept += line + "\n";
        ++kept_;
      } else if (!line.empty()) {
        ++dropped_;
      }
    }
    DFLASH_USER_CHECK(in.eof(), "reading {} failed: {}", path_, std::strerror(errno));
    if (dropped_ > 0) write_file_atomic(path_, kept);
  }
  file_ = std::fopen(path_.c_str(), "a");
  DFLASH_USER_CHECK(file_, "cannot open '{}' for appending: {}; check run.out_dir", path_, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::ordered_json& record) {
  DFLASH_CHECK(record.is_object() && record.contains("step") && record["step"].is_number_integer(),
               "metrics record must be a JSON object with an integer \"step\", got {}", record.dump());
  // replace: invalid UTF-8 in a string must not throw in the middle of training
  const std::string line = record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  errno = 0;
  const bool written = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  if (!written) {
    const int err = errno ? errno : EIO;
    std::clearerr(file_);
    DFLASH_USER_FAIL("writing {} failed at step {}: {}; free space on (or fix) the file system of run.out_dir",
                     path_, record["step"].get<int64_t>(), std::strerror(err));
  }
}

}  // namespace dflash::report
