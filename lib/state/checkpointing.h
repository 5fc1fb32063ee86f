#pragma once
// The trainer's side of checkpoints (the format and its guarantees are lib/state/checkpoint.h, docs/checkpoints.md):
// what a run expects of a checkpoint, what it records, and which one ckpt.resume names.
#include <cstdint>
#include <string>

#include "lib/state/checkpoint.h"
#include "lib/train/run_plan.h"

namespace dflash::train {

// Layout, drafter shape, config hash and the dataset's identity (DataFacts::identity(); "" = not compared): a
// checkpoint that differs in any of them is refused.
CheckpointExpectation checkpoint_expectation(const TrainConfig& cfg, const RunPlan& plan,
                                                 const std::string& dataset_identity = "");

// The training state after `next_step` steps: data cursor, layout, config hash, dataset identity, every drafter
// rank's RNG key and
// the export facts (tap layer ids, target layers) so that a checkpoint can be exported on its own.
// Randomness is counter-based (lib/core/rng.h): rank r's anchors at step s come from (seed, step s, slot), so its
// recorded state is {seed, stream = r, counter = next_step}.
TrainingState training_state(const TrainConfig& cfg, const RunPlan& plan, int64_t next_step,
                                 const std::string& dataset_identity = "");

// ckpt.resume: "none" → "", "auto" → the newest complete checkpoint in run.out_dir ("" when none), else the path.
std::string resolve_resume_dir(const TrainConfig& cfg);

}  // namespace dflash::train
