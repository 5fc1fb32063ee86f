#include "lib/state/best_checkpoint.h"

#include <fcntl.h>
#include <stdio.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/core/named_enum.h"

namespace dflash::state {

namespace fs = std::filesystem;

std::string best_checkpoint_dir(const std::string& out_dir) { return (fs::path(out_dir) / "ckpt" / "best").string(); }

BestCheckpoint::BestCheckpoint(const std::string& out_dir, TauMetric metric) : out_dir_(out_dir), metric_(metric) {
  const std::string dir = best_checkpoint_dir(out_dir);
  std::error_code ec;
  fs::remove_all(dir + ".partial", ec);  // a save a crash interrupted
  if (!fs::exists(dir, ec)) return;
  try {
    const TrainingState s = read_checkpoint_state(dir);
    const auto& b = s.extra.value("best", nlohmann::json::object());
    if (parse_name<TauMetric>(b.value("metric", std::string())) == metric_ && b.contains("value") &&
        b["value"].is_number()) {
      value_ = b["value"].get<double>();
      notice_ = fmt::format("{} holds step {} ({} {:.4f}): the value to beat", dir, s.step, name_of(metric_), value_);
    } else {
      notice_ = fmt::format("{} was chosen by another metric: the next eval replaces it", dir);
    }
  } catch (const std::exception& e) {  // incomplete or damaged: replaced by the next eval
    notice_ = fmt::format("{} is not a readable checkpoint ({}): the next eval replaces it", dir, e.what());
  }
}

bool BestCheckpoint::offer(double value, const model::DrafterConfig& drafter, const model::DrafterParams<float>& params,
                           TrainingState state) {
  if (!(value > value_)) return false;
  const std::string dir = best_checkpoint_dir(out_dir_), partial = dir + ".partial";
  std::error_code ec;
  fs::remove_all(partial, ec);
  DFLASH_USER_CHECK(!ec, "cannot delete {}: {}", partial, ec.message());
  state.extra["best"] = {{"metric", name_of(metric_)}, {"value", value}, {"step", state.step}};
  save_checkpoint_in(partial, drafter, params, model::AdamWState{}, state);  // weights only
  if (fs::exists(dir, ec)) {
    // one atomic exchange: `best` is the old complete checkpoint or the new one, never neither
    if (renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
      // a file system without the exchange: the old best goes aside first (a crash here leaves only best.partial)
      DFLASH_USER_CHECK(std::rename(dir.c_str(), (dir + ".old").c_str()) == 0, "cannot rename {}: {}", dir,
                        std::strerror(errno));
      DFLASH_USER_CHECK(std::rename(partial.c_str(), dir.c_str()) == 0, "cannot rename {} to {}: {}", partial, dir,
                        std::strerror(errno));
      fs::remove_all(dir + ".old", ec);
    }
  } else {
    DFLASH_USER_CHECK(std::rename(partial.c_str(), dir.c_str()) == 0, "cannot rename {} to {}: {}", partial, dir,
                      std::strerror(errno));
  }
  fsync_path((fs::path(out_dir_) / "ckpt").string(), true);
  fs::remove_all(partial, ec);  // after an exchange: the old best
  value_ = value;
  return true;
}

}  // namespace dflash::state
