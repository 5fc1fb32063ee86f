#pragma once
// Everything a run derives from its config, the target's config.json and the dataset, computed identically on
// every rank before any work starts: the drafter shape, the tap layers, the loss settings, the step count.
#include <cstdint>
#include <vector>

#include "lib/config/config.h"
#include "lib/io/dataset.h"
#include "lib/model/drafter_config.h"
#include "lib/model/qwen_config.h"
#include "lib/model/vocab_loss.h"

namespace dflash::train {

struct RunPlan {
  model::QwenConfig target;      // the frozen target's shape
  model::DrafterConfig drafter;         // the drafter, with every "0 = the target's" filled in
  std::vector<int> tap_ids;      // target layers whose outputs form the context (0-based decoder layer ids)
  model::VocabLossSettings loss;
  double decay_gamma = 0;        // position weight exp(-(k-1)/gamma); +inf (no decay) under D-PACE
  int64_t num_sequences = 0;     // in the dataset
  int64_t steps_per_epoch = 0;   // floor(n / (drafter_dp * micro_batches))
  int64_t total_steps = 0;       // run.steps, or data.epochs * steps_per_epoch when run.steps is 0
};

// Throws dflash::Error naming the config key and the fix when the config does not fit the target or the data
// (hidden size differs from the target's, tap ids outside the target's layers, mask token outside the vocab...).
RunPlan make_run_plan(const TrainConfig& cfg, const model::QwenConfig& target, int64_t num_sequences);

// Length of sequence `index` as streamed: data.max_seq_len truncates (0 = no limit).
int streamed_length(const TrainConfig& cfg, const io::Dataset& data, int64_t index);

}  // namespace dflash::train
