#include "lib/state/out_dir_guard.h"

#include <cstdio>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/state/checkpoint.h"
#include "lib/state/checkpointing.h"

namespace dflash::state {

namespace fs = std::filesystem;

namespace {

bool has_metrics_records(const fs::path& file) {
  std::error_code ec;
  return fs::is_regular_file(file, ec) && fs::file_size(file, ec) > 0 && !ec;
}

std::string utc_stamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

}  // namespace

std::vector<std::string> earlier_run_files(const TrainConfig& cfg) {
  const fs::path out(cfg.run.out_dir);
  std::vector<std::string> found;
  if (!resolve_resume_dir(cfg).empty()) return found;  // resuming: the files are this run's own
  const bool fresh = cfg.ckpt.resume == "none";
  std::error_code ec;
  if (fresh)
    for (const std::string& dir : list_complete_checkpoints(cfg.run.out_dir))
      found.push_back(fs::relative(dir, out, ec).string());
  // auto with no step checkpoint keeps best (the value to beat); none would replace it
  if (fresh && fs::exists(out / "ckpt" / "best", ec)) found.push_back("ckpt/best");
  if (fs::exists(out / "drafter_final.safetensors", ec)) found.push_back("drafter_final.safetensors");
  // auto's metrics rows past the resumed step (all of them at step 0) are this job's earlier attempt
  if (fresh && has_metrics_records(out / "metrics.jsonl")) found.push_back("metrics.jsonl");
  return found;
}

std::string guard_out_dir(const TrainConfig& cfg) {
  const std::vector<std::string> found = earlier_run_files(cfg);
  if (found.empty()) return "";
  const std::string list = fmt::format("{}", fmt::join(found, ", "));
  DFLASH_USER_CHECK(cfg.run.start_over,
                    "run.out_dir = {} holds an earlier run ({}) and this run would start at step 0 over it "
                    "(ckpt.resume = {}): continue it with ckpt.resume: auto, train into another run.out_dir, or "
                    "set run.start_over: true to move the earlier run's files to {}/superseded/ (nothing is deleted)",
                    cfg.run.out_dir, list, cfg.ckpt.resume, cfg.run.out_dir);
  const fs::path out(cfg.run.out_dir), aside = out / "superseded" / utc_stamp();
  std::error_code ec;
  fs::create_directories(aside, ec);
  DFLASH_USER_CHECK(!ec, "run.start_over: cannot create {}: {}", aside.string(), ec.message());
  // whole folders and files move with one rename each; ckpt/ goes as a whole (its partial saves with it)
  std::vector<std::string> moved;
  auto move = [&](const fs::path& rel) {
    if (!fs::exists(out / rel, ec)) return;
    fs::create_directories((aside / rel).parent_path(), ec);
    fs::rename(out / rel, aside / rel, ec);
    DFLASH_USER_CHECK(!ec, "run.start_over: cannot move {} to {}: {}", (out / rel).string(), (aside / rel).string(),
                      ec.message());
    moved.push_back(rel.string());
  };
  move("ckpt");
  move("drafter_final.safetensors");
  move("metrics.jsonl");
  fsync_path(aside.string(), true);
  fsync_path(out.string(), true);
  return fmt::format("run.start_over: the earlier run's {} moved to {} (delete it yourself when it is no longer "
                     "needed)", fmt::join(moved, ", "), aside.string());
}

}  // namespace dflash::state
