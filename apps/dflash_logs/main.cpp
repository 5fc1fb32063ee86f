// dflash_logs RUN_DIR [--merge] [--level warn] [--rank R] [--tail N] [--garbled]: reads a run's per-rank logs.
// Without --merge: one summary line per rank (line, warning and error counts, age of its last line, stragglers)
// — the first look after a failed or hanging job. With --merge: the lines of every rank interleaved by time.
// --garbled: the lines not in the log format (a torn write after a crash), as file:line.
// dflash_logs plot RUN_DIR [--out FILE.svg]: a picture of metrics.jsonl (apps/dflash_logs/metrics_plot.h).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "apps/dflash_logs/metrics_plot.h"
#include "lib/core/cli_app.h"
#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/report/log_reader.h"

namespace {

constexpr const char* kDescription =
    "dflash_logs: reads a run's per-rank logs (RUN_DIR/logs/rank_XX.log). Without an option: one summary line per "
    "rank (line, warning and error counts, age of its last line, its last line; a rank whose last line is over 60 s "
    "older than the newest is flagged STRAGGLER). `dflash_logs plot RUN_DIR`: a picture of metrics.jsonl.";

struct LogsOptions {
  std::string run_dir;
  bool merge = false, garbled = false;
  std::optional<std::string> level;
  std::optional<long long> rank, tail;
  bool plot = false;
  std::string plot_out;  // default RUN_DIR/metrics.svg
};

int plot(const std::string& run_dir, std::string out) {
  int skipped = 0;
  const auto series = dflash::report::read_metrics(run_dir, &skipped);
  if (out.empty()) out = run_dir + "/metrics.svg";
  dflash::write_file_atomic(out, dflash::report::plot_metrics_svg(series, "dflash run " + run_dir));
  std::printf("wrote %s: %zu records (steps %.0f..%.0f)%s\n", out.c_str(), series.steps.size(), series.steps.front(),
              series.steps.back(),
              skipped ? (" ; skipped " + std::to_string(skipped) + " unreadable line(s)").c_str() : "");
  return 0;
}

int show(const LogsOptions& o) {
  const auto logs = dflash::report::read_run_logs(o.run_dir);
  if (o.garbled) {
    std::fputs(dflash::report::garbled_report(logs).c_str(), stdout);
    return 0;
  }
  if (!(o.merge || o.level || o.rank || o.tail)) {
    std::fputs(dflash::report::summarise_logs(logs).c_str(), stdout);
    return 0;
  }
  const auto level = dflash::report::parse_log_level(o.level.value_or("debug"), "--level");
  const long long rank = o.rank.value_or(-1);
  if (o.rank && std::none_of(logs.begin(), logs.end(), [&](const auto& l) { return l.rank == rank; })) {
    std::string ranks;
    for (const auto& l : logs) ranks += (ranks.empty() ? "" : ", ") + std::to_string(l.rank);
    throw dflash::Error(fmt::format("--rank {}: {}/logs has no rank_{:02d}.log (ranks with logs: {})", rank,
                                    o.run_dir, rank, ranks));
  }
  const auto lines = dflash::report::merge_logs(logs, level, int(rank));
  const size_t tail = size_t(o.tail.value_or(0));
  for (size_t i = tail && lines.size() > tail ? lines.size() - tail : 0; i < lines.size(); ++i)
    std::printf("%s\n", lines[i].text.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  LogsOptions o;
  dflash::CliApp app(kDescription, "dflash_logs");
  app.add_option("RUN_DIR", o.run_dir, "the run's out_dir (it holds logs/rank_XX.log and metrics.jsonl)")
      ->type_name("DIR");
  app.add_flag("--merge", o.merge, "the lines of every rank interleaved by time (implied by --level, --rank, --tail)");
  app.add_option("--level", o.level, "only lines at or above this level")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));
  // the bounds' messages say what the number is (scripts match them)
  app.add_option("--rank", o.rank, "only world rank R")->type_name("R")->check(CLI::Validator(
      [](const std::string& v) -> std::string {
        long long r = -1;
        return CLI::detail::lexical_cast(v, r) && r >= 0 && r <= dflash::report::kMaxRank
                   ? ""
                   : fmt::format("--rank {}: a world rank is 0 .. {}", v, dflash::report::kMaxRank);
      }, ""));
  app.add_option("--tail", o.tail, "only the last N lines")->type_name("N")->check(CLI::Validator(
      [](const std::string& v) -> std::string {
        long long n = 0;
        return CLI::detail::lexical_cast(v, n) && n >= 1 ? ""
                                                          : fmt::format("--tail {}: give the number of last lines to "
                                                                        "show, ≥ 1", v);
      }, ""));
  app.add_flag("--garbled", o.garbled, "list the lines not in the log format (torn writes after a crash) as file:line");
  CLI::App* plot_cmd = app.add_subcommand("plot", "an SVG of loss and its parts, accuracy by block position, tau, lr, "
                                          "grad norm, tokens/s and the drafters' waiting share over steps");
  plot_cmd->add_option("RUN_DIR", o.run_dir, "the run's out_dir")->required()->type_name("DIR");
  plot_cmd->add_option("--out", o.plot_out, "the picture to write (default RUN_DIR/metrics.svg)")->type_name("FILE.svg");
  if (const std::optional<int> rc = dflash::parse_or_exit_code(app, argc, argv)) return *rc;
  if (!plot_cmd->parsed() && o.run_dir.empty()) {
    std::fprintf(stderr, "dflash_logs: error: RUN_DIR is required; `dflash_logs --help` lists the options\n");
    return 2;
  }
  return dflash::run_program("dflash_logs", [&] { return plot_cmd->parsed() ? plot(o.run_dir, o.plot_out) : show(o); });
}
