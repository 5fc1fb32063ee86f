#pragma once
// The dataset `dflash_data regenerate` writes: each prompt followed by the target's greedy continuation (the data
// tools' concern, so it lives beside the subcommand; the unit tests compile it from here).
#include <cstdint>
#include <functional>

#include "lib/io/dataset.h"
#include "lib/model/generate.h"
#include "lib/model/target.h"

namespace dflash::data {

struct RegenerateStats {
  int64_t sequences = 0;      // written so far
  int64_t prompt_tokens = 0;  // loss_mask 0
  int64_t new_tokens = 0;     // loss_mask 1
  int64_t eos_stops = 0;      // sequences that ended at eos before max_new_tokens
  double seconds = 0;         // wall time so far
};

// Collective. For each of the first `limit` sequences of `prompts` (0: all): the sequence prompt + greedy
// continuation, loss_mask 0 on the prompt and 1 on the continuation, added to `out` (null on ranks that do not
// write). Every prompt is checked first (check_prompts), so a bad sequence fails before anything is generated or
// added. `progress` (optional) is called after each sequence on every rank.
RegenerateStats regenerate_dataset(model::TargetModel& target, model::GreedyHead& head, const io::Dataset& prompts,
                                   io::DatasetWriter* out, const model::GenerateOptions& options, int64_t limit = 0,
                                   const std::function<void(const RegenerateStats&)>& progress = {});

}  // namespace dflash::data
