#pragma once
// The trainer's side of checkpoints (the format and its guarantees are lib/state/checkpoint.h, docs/checkpoints.md):
// what a run expects of a checkpoint, what it records, and which one ckpt.resume names.
#include <cstdint>
#include <string>

#include "lib/state/checkpoint.h"
#include "lib/train/run_plan.h"

namespace dflash::state {

// What a run is made of besides its config: recorded in every checkpoint, compared on resume ("" = not compared).
struct RunIdentity {
  std::string dataset;  // DataFacts::identity()
  std::string target;   // target_identity(target.path)
  std::string init;     // warm_start_identity(drafter.init) when the run began from one (recorded, not compared)
};

// Layout, drafter shape, config hash and the identities: a checkpoint that differs in any of them is refused.
CheckpointExpectation checkpoint_expectation(const TrainConfig& cfg, const train::RunPlan& plan,
                                             const RunIdentity& id = {});

// The training state after `next_step` steps: data cursor, layout, config hash, the identities, every drafter
// rank's RNG key and
// the export facts (tap layer ids, target layers) so that a checkpoint can be exported on its own.
// Randomness is counter-based (lib/core/rng.h): rank r's anchors at step s come from (seed, step s, slot), so its
// recorded state is {seed, stream = r, counter = next_step}.
TrainingState training_state(const TrainConfig& cfg, const train::RunPlan& plan, int64_t next_step,
                             const RunIdentity& id = {});

// ckpt.resume: "none" → "", "auto" → the newest complete checkpoint in run.out_dir ("" when none), else the path.
std::string resolve_resume_dir(const TrainConfig& cfg);

}  // namespace dflash::state
