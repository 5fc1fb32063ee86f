// dflash_logs RUN_DIR [--merge] [--level warn] [--rank R] [--tail N] [--garbled]: reads a run's per-rank logs.
// Without --merge: one summary line per rank (line, warning and error counts, age of its last line, stragglers)
// — the first look after a failed or hanging job. With --merge: the lines of every rank interleaved by time.
// --garbled: the lines not in the log format (a torn write after a crash), as file:line.
// dflash_logs plot RUN_DIR [--out FILE.svg]: a picture of metrics.jsonl (apps/dflash_logs/metrics_plot.h).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "apps/dflash_logs/metrics_plot.h"
#include "lib/core/args.h"
#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/report/log_reader.h"

namespace {
constexpr const char* kUsage =
    "usage: dflash_logs RUN_DIR [--merge] [--level debug|info|warn|error] [--rank R] [--tail N] [--garbled]\n"
    "       dflash_logs plot RUN_DIR [--out FILE.svg]\n"
    "  RUN_DIR     the run's out_dir (it holds logs/rank_XX.log and metrics.jsonl)\n"
    "  (no option) one summary line per rank: line, warning and error counts, age of its last line, its last\n"
    "              line; a rank whose last line is over 60 s older than the newest is flagged STRAGGLER\n"
    "  --merge     the lines of every rank interleaved by time (implied by --level, --rank, --tail)\n"
    "  --level L   only lines at or above level L\n"
    "  --rank R    only world rank R\n"
    "  --tail N    only the last N lines\n"
    "  --garbled   list the lines not in the log format (torn writes after a crash) as file:line\n"
    "  plot        an SVG of loss and its parts, accuracy by block position, tau, lr, grad norm, tokens/s and the\n"
    "              drafters' waiting share over steps; --out FILE.svg (default RUN_DIR/metrics.svg)\n";
}  // namespace

int main(int argc, char** argv) {
  try {
    const dflash::Args args(argc, argv, {"level", "rank", "tail", "out"}, {"merge", "garbled"}, kUsage);
    if (args.positional().size() == 2 && args.positional()[0] == "plot") {
      const std::string run_dir = args.positional()[1];
      int skipped = 0;
      const auto series = dflash::train::read_metrics(run_dir, &skipped);
      const std::string out = args.str("out", run_dir + "/metrics.svg");
      dflash::write_file_atomic(out, dflash::train::plot_metrics_svg(series, "dflash run " + run_dir));
      std::printf("wrote %s: %zu records (steps %.0f..%.0f)%s\n", out.c_str(), series.steps.size(),
                  series.steps.front(), series.steps.back(),
                  skipped ? (" ; skipped " + std::to_string(skipped) + " unreadable line(s)").c_str() : "");
      return 0;
    }
    if (args.positional().size() != 1) {
      std::fputs(kUsage, stderr);
      return 2;
    }
    const auto logs = dflash::train::read_run_logs(args.positional()[0]);
    if (args.has("garbled")) {
      std::fputs(dflash::train::garbled_report(logs).c_str(), stdout);
      return 0;
    }
    const bool merge = args.has("merge") || args.has("level") || args.has("rank") || args.has("tail");
    if (!merge) {
      std::fputs(dflash::train::summarise_logs(logs).c_str(), stdout);
      return 0;
    }
    const auto level = dflash::train::parse_log_level(args.str("level", "debug"), "--level");
    const long long rank = args.integer("rank", -1), tail_n = args.integer("tail", 0);
    DFLASH_USER_CHECK(!args.has("rank") || (rank >= 0 && rank <= dflash::train::kMaxRank),
                      "--rank {}: a world rank is 0 .. {}", args.str("rank", ""), dflash::train::kMaxRank);
    if (args.has("rank") && std::none_of(logs.begin(), logs.end(), [&](const auto& l) { return l.rank == rank; })) {
      std::string ranks;
      for (const auto& l : logs) ranks += (ranks.empty() ? "" : ", ") + std::to_string(l.rank);
      throw dflash::Error(fmt::format("--rank {}: {}/logs has no rank_{:02d}.log (ranks with logs: {})", rank,
                                      args.positional()[0], rank, ranks));
    }
    DFLASH_USER_CHECK(!args.has("tail") || tail_n >= 1, "--tail {}: give the number of last lines to show, ≥ 1",
                      args.str("tail", ""));
    const auto lines = dflash::train::merge_logs(logs, level, int(rank));
    const size_t tail = size_t(tail_n);
    for (size_t i = tail && lines.size() > tail ? lines.size() - tail : 0; i < lines.size(); ++i)
      std::printf("%s\n", lines[i].text.c_str());
    return 0;
  } catch (const dflash::HelpShown&) {
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dflash_logs: error: %s\n", e.what());
    return 1;
  }
}
