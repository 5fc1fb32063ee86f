#pragma once
// The target model directory checked from its safetensors headers alone (no tensor data read, no MPI): every
// tensor the TP target and the drafter ranks will read exists with the shape config.json implies and a dtype
// the loader reads (BF16, F16, F32), and config.json agrees with the weights present:
//   - no decoder layer beyond num_hidden_layers (a config.json from another model size);
//   - tie_word_embeddings true with a separate lm_head.weight (a tied config on an untied model would silently
//     train against the wrong output projection).
// Every problem is listed in one error naming the directory, the tensor and both shapes.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lib/model/qwen_config.h"
#include "lib/report/check_item.h"

namespace dflash::preflight {

struct TargetWeightsSummary {
  int64_t tensors = 0;                 // expected tensors verified
  int64_t parameters = 0;              // their elements
  std::map<std::string, int64_t> dtypes;  // "BF16" -> tensors of that dtype
};

TargetWeightsSummary check_target_weights(const std::string& model_dir, const model::QwenConfig& config);

// --check's items of the target: its shape and taps, how the routed experts split over the TP ranks (MoE), and its
// weights (has_weights false: INCOMPLETE, the plan comes from config.json alone).
std::vector<report::CheckItem> target_items(const std::string& model_dir, const model::QwenConfig& target,
                                            const std::vector<int>& tap_ids, int target_tp, bool has_weights,
                                            const TargetWeightsSummary& weights);

}  // namespace dflash::preflight
