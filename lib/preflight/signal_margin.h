#pragma once
// How long before a time limit slurm should signal the job (`#SBATCH --signal=USR1@<margin>`): the ranks finish
// the step in progress and write a checkpoint before they stop, so the margin must cover one step plus one
// checkpoint save, with room to spare. `dflash_mpi --check` prints it, measured from an earlier attempt in the same
// run.out_dir when there is one (step time from metrics.jsonl, save time from the "checkpoint: ... (X s)" log
// lines), else says it cannot be measured yet.
#include <cstdint>
#include <string>

#include "lib/report/check_item.h"

namespace dflash::preflight {

struct SignalMargin {
  double step_seconds = -1;  // < 0: not measured
  double save_seconds = -1;  // < 0: not measured
  int margin_seconds = 600;  // recommended; 600 (the scripts' default) when nothing is measured
  bool measured = false;     // both step and save time were measured
};

// margin = max(120 s, 2 x (step + save) + 60 s), rounded up to a whole minute.
SignalMargin recommend_signal_margin(const std::string& out_dir);

// --check's item: the #SBATCH --signal line for out_dir, measured or a start.
report::CheckItem slurm_item(const std::string& out_dir);

}  // namespace dflash::preflight
