#include "lib/preflight/signal_margin.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lib/report/log_reader.h"

namespace dflash::preflight {

namespace {

// Seconds per step between the last two records of one attempt (elapsed_s restarts at 0 with each attempt).
double measured_step_seconds(const std::string& out_dir) {
  std::ifstream in(std::filesystem::path(out_dir) / "metrics.jsonl");
  double best = -1, prev_step = -1, prev_elapsed = -1;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j.contains("elapsed_s") || !j["step"].is_number() ||
        !j["elapsed_s"].is_number())
      continue;
    const double step = j["step"].get<double>(), elapsed = j["elapsed_s"].get<double>();
    if (prev_step >= 0 && step > prev_step && elapsed > prev_elapsed)
      best = (elapsed - prev_elapsed) / (step - prev_step);
    prev_step = step, prev_elapsed = elapsed;
  }
  return best;
}

// The longest "checkpoint: <dir> (X s)" a rank logged.
double measured_save_seconds(const std::string& out_dir) {
  if (!std::filesystem::is_directory(std::filesystem::path(out_dir) / "logs")) return -1;
  double worst = -1;
  try {
    for (const report::RankLog& log : report::read_run_logs(out_dir))
      for (const report::LogLine& l : log.lines) {
        if (!l.parsed || l.message.rfind("checkpoint: ", 0) != 0) continue;
        const size_t open = l.message.rfind(" ("), unit = l.message.find(" s)", open == std::string::npos ? 0 : open);
        if (open == std::string::npos || unit == std::string::npos) continue;
        char* end = nullptr;
        const double s = std::strtod(l.message.c_str() + open + 2, &end);
        if (end == l.message.c_str() + unit) worst = std::max(worst, s);
      }
  } catch (const std::exception&) {
    return -1;  // unreadable logs: not measured (--check reports the logs' own problems elsewhere)
  }
  return worst;
}

}  // namespace

SignalMargin recommend_signal_margin(const std::string& out_dir) {
  SignalMargin m;
  m.step_seconds = measured_step_seconds(out_dir);
  m.save_seconds = measured_save_seconds(out_dir);
  m.measured = m.step_seconds >= 0 && m.save_seconds >= 0;
  if (m.measured) {
    const double need = std::max(120.0, 2 * (m.step_seconds + m.save_seconds) + 60);
    m.margin_seconds = int(std::ceil(need / 60) * 60);
  }
  return m;
}

report::CheckItem slurm_item(const std::string& out_dir) {
  const SignalMargin margin = recommend_signal_margin(out_dir);
  if (margin.measured)
    return {"slurm", {fmt::format("#SBATCH --signal=USR1@{} (2 x (step {:.1f} s + checkpoint save {:.1f} s, measured "
                                  "in this out_dir) + 60 s)", margin.margin_seconds, margin.step_seconds,
                                  margin.save_seconds)}};
  return {"slurm", {fmt::format("#SBATCH --signal=USR1@{} for a start; nothing measured yet in {}: run --check again "
                                "after some steps and a checkpoint to size it", margin.margin_seconds, out_dir)}};
}
}  // namespace dflash::preflight
