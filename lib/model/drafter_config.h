#pragma once
// Shape of the DFlash drafter: a stack of Qwen3 decoder layers fed by the target's tapped hidden states.
#include <string>
#include <vector>

namespace dflash {

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
  double rms_eps = 1e-6;
  std::vector<int> window;  // [L]: 0 = full attention; w > 0 = sliding window of w positions (causal in block)

  // Throws dflash::Error naming the first inconsistent field.
  void validate() const;
};

}  // namespace dflash
