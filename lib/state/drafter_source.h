#pragma once
// The drafter an evaluation runs (docs/eval.md): a training run folder (its newest complete checkpoint), one
// checkpoint step folder, or an exported drafter folder (config.json + model.safetensors).
#include <string>

#include "lib/model/drafter_export.h"

namespace dflash::state {

struct DrafterSource {
  std::string kind;  // "checkpoint" or "export"
  std::string dir;   // the folder read (for a run folder: its newest complete checkpoint)
  int64_t step = -1; // checkpoints: the optimizer step
  model::ExportedDrafter drafter;  // config, fp32 weights, target facts (target_layer_ids)
  std::string target_identity;     // checkpoints: the target it was trained against ("" when not recorded)
};

// Reads and verifies one of the three; a folder that is none of them is a user error naming it and the choices.
DrafterSource load_drafter_source(const std::string& path);
// The folder load_drafter_source(path) reads (an export folder, or a checkpoint step folder: a run folder's newest
// complete checkpoint), without reading the weights; the same errors.
std::string drafter_source_dir(const std::string& path);

}  // namespace dflash::state
