#pragma once
// What a fresh start does to an earlier run's files in run.out_dir (docs/checkpoints.md "What is never deleted").
// A run that starts at step 0 never deletes or overwrites weights it did not write:
// - ckpt.resume: none over an out_dir that holds an earlier run (step checkpoints, ckpt/best, drafter_final.safetensors
//   or metrics records) is refused, naming what is there and the ways out, unless run.start_over is true: then the
//   earlier run's files move to out_dir/superseded/<UTC time>/ (nothing is deleted; remove that folder yourself).
// - ckpt.resume: auto that finds no complete step checkpoint (a requeue of an attempt killed before its first save)
//   starts at step 0 and keeps ckpt/best as the value to beat; final weights without a checkpoint (a finished run
//   with ckpt.every: 0) cannot be resumed and are refused the same way (or moved aside with run.start_over).
// Resuming (a checkpoint found or named) touches nothing here.
#include <string>
#include <vector>

#include "lib/config/config.h"

namespace dflash::state {

// The earlier run's files a fresh start would replace, as paths relative to out_dir ("ckpt/step_00000200",
// "ckpt/best", "drafter_final.safetensors", "metrics.jsonl"); what the resume mode allows is left out.
std::vector<std::string> earlier_run_files(const TrainConfig& cfg);

// Called by world rank 0 after it holds the run lock and before anything is written to out_dir. Returns a notice for
// the log ("" when there was nothing to do); throws dflash::Error for a refused start.
std::string guard_out_dir(const TrainConfig& cfg);

}  // namespace dflash::state
