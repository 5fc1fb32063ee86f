#pragma once
// `dflash_logs plot RUN_DIR`: a picture of a run from its metrics.jsonl, as an SVG written by this code (no
// plotting dependency). Eight panels over steps: loss and its parts (ce, kl, cap), accuracy by block position
// (one line per position k), τ (accepted length under teacher forcing), learning rate, gradient norm, tokens/s,
// the drafters' waiting share, and top-1 / top-k accuracy. Null values (non-finite numbers) leave gaps.
#include <map>
#include <string>
#include <vector>

namespace dflash::report {

// One metrics.jsonl as columns: steps[i] and, per key, values[key][i] (NaN where a record lacks it or is null).
struct MetricsSeries {
  std::vector<double> steps;
  std::map<std::string, std::vector<double>> values;
  int block_positions = 0;  // length of acc_by_pos (B - 1); its values are acc_pos1, acc_pos2, ...
};

// Reads the training records of <run_dir>/metrics.jsonl (eval records, which carry a "kind", are left out); a line that is not a JSON record with a "step" (a torn last line) is skipped
// and counted in *skipped. Throws naming the file when there is none or it holds no record.
MetricsSeries read_metrics(const std::string& run_dir, int* skipped = nullptr);

// The SVG text of the eight panels (width x height pixels).
std::string plot_metrics_svg(const MetricsSeries& series, const std::string& title, int width = 1200,
                             int height = 900);

}  // namespace dflash::report
