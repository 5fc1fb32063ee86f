#pragma once
// drafter.init: a run that starts from a released drafter's weights (ours exported, a published DFlash folder with
// config.json + model.safetensors, a checkpoint step folder, or a run folder: its newest complete checkpoint) with
// a fresh optimizer at step 0 (docs/checkpoints.md "Warm start"). Every shape, the block size, the mask token, the
// vocabulary and the target layer ids must be this run's; a difference is refused naming the key and both values.
// A resumed run (ckpt.resume) takes its checkpoint and ignores drafter.init.
#include <string>

#include "lib/config/config.h"
#include "lib/model/drafter_params.h"
#include "lib/train/run_plan.h"

namespace dflash::state {

struct WarmStart {
  model::DrafterParams<float> params;
  std::string identity;  // warm_start_identity(cfg.drafter.init), as the caller computed it
};

// Reads and checks cfg.drafter.init against the run (plan: the drafter with every "0 = the target's" resolved).
// identity: warm_start_identity(cfg.drafter.init), computed once by the caller (it reads the whole weight file).
WarmStart load_warm_start(const TrainConfig& cfg, const train::RunPlan& plan, std::string identity);

// "export /path/to/dir (model.safetensors 123456 bytes, content 0x...)": the folder read and its weight file's
// content hash (FNV-1a 64 of its bytes), recorded in config.resolved.yaml, the log and every checkpoint.
std::string warm_start_identity(const std::string& init);

}  // namespace dflash::state
