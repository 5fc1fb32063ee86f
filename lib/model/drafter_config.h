#pragma once
// Shape of the DFlash drafter: a stack of Qwen3 decoder layers fed by the target's tapped hidden states.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash::model {

struct DrafterConfig {
  int hidden = 0;         // H: drafter and target hidden size (the context comes from the target)
  int layers = 0;         // L: decoder layers
  int heads = 0;          // NH: query heads
  int kv_heads = 0;       // KVH: key/value heads (NH % KVH == 0)
  int head_dim = 0;       // D
  int intermediate = 0;   // I: SwiGLU width
  int block_size = 0;     // B: tokens per block (anchor + B-1 masked positions)
  int n_taps = 0;         // target layers concatenated into the context features
  int vocab = 0;          // V: rows of the frozen target embedding / lm_head
  int mask_token_id = 0;  // reserved vocabulary row fed at block positions 1..B-1
  double rope_theta = 1e6;
  double rms_norm_eps = 1e-6;  // as config.json spells it (the target's QwenConfig too)
  std::vector<int> window;  // [L]: 0 = full attention; w > 0 = sliding window of w positions (causal in block)

  // Throws dflash::Error naming the first inconsistent field.
  void validate() const;
};

// Every field once: f(name, member) with the name checkpoints (state.json) use. The one list every serialisation
// and comparison of a DrafterConfig goes through (the exported config.json maps these names,
// lib/model/drafter_export.cpp).
template <class Config, class F>
void for_each_drafter_field(Config& c, F&& f) {
  f("hidden", c.hidden);
  f("layers", c.layers);
  f("heads", c.heads);
  f("kv_heads", c.kv_heads);
  f("head_dim", c.head_dim);
  f("intermediate", c.intermediate);
  f("block_size", c.block_size);
  f("n_taps", c.n_taps);
  f("vocab", c.vocab);
  f("mask_token_id", c.mask_token_id);
  f("rope_theta", c.rope_theta);
  f("rms_eps", c.rms_norm_eps);  // the checkpoint key keeps its name: existing state.json files load as before
  f("window", c.window);
}

// {"hidden": …, …} in the order above.
nlohmann::ordered_json drafter_config_to_json(const DrafterConfig& c);
// Reads and validates; `source` names the file in errors ("checkpoint X/state.json: missing key 'heads'").
DrafterConfig drafter_config_from_json(const nlohmann::json& j, const std::string& source);

struct DrafterConfigDifference {
  std::string field, a, b;  // the first differing field and both values, printed
};
// The first field where a and b differ, or an empty field name when they are equal.
DrafterConfigDifference first_difference(const DrafterConfig& a, const DrafterConfig& b);

}  // namespace dflash::model
