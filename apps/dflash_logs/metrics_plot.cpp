#include "apps/dflash_logs/metrics_plot.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lib/core/error.h"

namespace dflash::report {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double number_or_nan(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : kNaN;
}

// What each panel draws: series keys, a scale factor (shares as %) and whether the y axis is logarithmic.
struct Panel {
  std::string title;
  std::vector<std::string> keys;
  double scale = 1;
  bool log_y = false;
};

// Colours that stay apart on white (Okabe-Ito), then greys for the remaining block positions.
const char* colour(size_t i) {
  static const char* c[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
                            "#999999", "#666666", "#BBBBBB", "#444444", "#888888", "#333333", "#AAAAAA", "#555555"};
  return c[i % (sizeof c / sizeof c[0])];
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

std::string number_text(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  return a >= 1e4 || a < 1e-2 ? fmt::format("{:.2e}", v) : fmt::format("{:.3g}", v);
}

// One panel at (x0, y0) of size w x h: frame, title, y range labels, first/last step, a polyline per series
// (broken at NaN) and a legend.
std::string draw_panel(const MetricsSeries& s, const Panel& p, double x0, double y0, double w, double h) {
  const double left = 62, right = 10, top = 22, bottom = 22;
  const double px = x0 + left, py = y0 + top, pw = w - left - right, ph = h - top - bottom;
  auto ty = [&](double v) { return p.log_y ? std::log10(v) : v; };
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& k : p.keys) {
    const auto it = s.values.find(k);
    if (it == s.values.end()) continue;
    for (double v : it->second) {
      v *= p.scale;
      if (!std::isfinite(v) || (p.log_y && v <= 0)) continue;
      lo = std::min(lo, ty(v)), hi = std::max(hi, ty(v));
    }
  }
  std::string out = fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#888\"/>\n"
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" font-weight=\"bold\">{}</text>\n",
      px, py, pw, ph, px, y0 + 15, escape(p.title));
  if (!(lo <= hi) || s.steps.empty()) return out + fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" "
                                                               "fill=\"#888\">no data</text>\n", px + 8, py + 20);
  if (hi == lo) hi = lo + 1, lo = lo - 1;
  const double s0 = s.steps.front(), s1 = std::max(s.steps.back(), s0 + 1);
  auto X = [&](double step) { return px + (step - s0) / (s1 - s0) * pw; };
  auto Y = [&](double v) { return py + ph - (ty(v) - lo) / (hi - lo) * ph; };
  auto label = [&](double t) { return p.log_y ? std::pow(10.0, t) : t; };
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n", px - 4,
                     py + 10, number_text(label(hi)));
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n", px - 4,
                     py + ph, number_text(label(lo)));
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">step {}</text>\n", px, py + ph + 15,
                     number_text(s0));
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n", px + pw,
                     py + ph + 15, number_text(s1));
  size_t drawn = 0;
  for (size_t k = 0; k < p.keys.size(); ++k) {
    const auto it = s.values.find(p.keys[k]);
    if (it == s.values.end()) continue;
    std::string points;
    auto flush = [&] {
      if (!points.empty())
        out += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n", colour(k),
                           points);
      points.clear();
    };
    for (size_t i = 0; i < s.steps.size(); ++i) {
      const double v = it->second[i] * p.scale;
      if (!std::isfinite(v) || (p.log_y && v <= 0)) {
        flush();  // a gap where the value is null
        continue;
      }
      points += fmt::format("{:.1f},{:.1f} ", X(s.steps[i]), Y(v));
    }
    flush();
    if (p.keys.size() > 1 && drawn < 8)
      out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"{}\" text-anchor=\"end\">{}</text>\n",
                         px + pw - 4, py + 13 + 12.0 * double(drawn), colour(k), escape(p.keys[k]));
    ++drawn;
  }
  return out;
}

}  // namespace

MetricsSeries read_metrics(const std::string& run_dir, int* skipped) {
  const std::string path = (std::filesystem::path(run_dir) / "metrics.jsonl").string();
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  DFLASH_USER_CHECK(std::filesystem::exists(status), "{}: no such file; give the run's out_dir (run.out_dir in its "
                    "config)", path);
  DFLASH_USER_CHECK(std::filesystem::is_regular_file(status),
                    "{} is {}, not the metrics file a run writes; move it away or give the run's out_dir", path,
                    std::filesystem::is_directory(status) ? "a folder" : "not a regular file (a FIFO, socket or device)");
  std::ifstream in(path);
  DFLASH_USER_CHECK(in, "{}: cannot read it: {}", path, std::strerror(errno));
  MetricsSeries s;
  int bad = 0;
  static const char* kKeys[] = {"loss", "ce", "kl", "cap", "acc", "topk_acc", "tau", "lr", "grad_norm",
                                "tokens_per_s", "wait_share", "compute_share"};
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) {
      ++bad;
      continue;
    }
    if (j.contains("kind")) continue;  // an eval record ({"kind": "eval" | "spec_eval"}): not a training step
    const size_t i = s.steps.size();
    s.steps.push_back(j["step"].get<double>());
    for (const char* k : kKeys) s.values[k].push_back(number_or_nan(j, k));
    if (j.contains("acc_by_pos") && j["acc_by_pos"].is_array()) {
      const auto& a = j["acc_by_pos"];
      s.block_positions = std::max(s.block_positions, int(a.size()));
      for (size_t k = 0; k < a.size(); ++k) {
        auto& col = s.values[fmt::format("acc_pos{}", k + 1)];
        col.resize(i, kNaN);  // a position first seen now: earlier records lack it
        col.push_back(a[k].is_number() ? a[k].get<double>() : kNaN);
      }
    }
    for (auto& [k, col] : s.values) col.resize(i + 1, kNaN);
  }
  if (skipped) *skipped = bad;
  DFLASH_USER_CHECK(!s.steps.empty(), "{}: no metrics record (a run writes one every log.every steps)", path);
  return s;
}

std::string plot_metrics_svg(const MetricsSeries& s, const std::string& title, int width, int height) {
  std::vector<std::string> positions;
  for (int k = 1; k <= s.block_positions; ++k) positions.push_back(fmt::format("acc_pos{}", k));
  const std::vector<Panel> panels = {
      {"loss and its parts", {"loss", "ce", "kl", "cap"}},
      {"accuracy by block position k", positions},
      {"tau (accepted length, teacher forcing)", {"tau"}},
      {"learning rate", {"lr"}},
      {"gradient norm (before clipping)", {"grad_norm"}, 1, true},
      {"tokens/s (all drafter ranks)", {"tokens_per_s"}},
      {"drafter time waiting for packets (%)", {"wait_share"}, 100},
      {"accuracy: top-1, top-k", {"acc", "topk_acc"}},
  };
  const int cols = 2, rows = int((panels.size() + 1) / 2);
  const double header = 30, pw = double(width) / cols, ph = (double(height) - header) / rows;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"20\" font-size=\"15\">{}</text>\n",
      width, height, width, height, escape(title));
  for (size_t i = 0; i < panels.size(); ++i)
    svg += draw_panel(s, panels[i], double(i % cols) * pw, header + double(i / cols) * ph, pw - 6, ph - 6);
  return svg + "</svg>\n";
}

}  // namespace dflash::report
