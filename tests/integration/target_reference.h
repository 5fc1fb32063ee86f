#pragma once
// The plain single-process Qwen3 forward in double: no TP, no BLAS, straight loops over the full weights read
// from the checkpoint. What the TP forward is checked against.
#include <cstdint>
#include <string>
#include <vector>

namespace dflash::test {

// taps[S, n_taps*H] and final_hidden[S, H] (=), same layout as TargetModel::forward.
void reference_target_forward(const std::string& model_dir, const int32_t* tokens, int S,
                              const std::vector<int>& tap_layer_ids, std::vector<double>& taps,
                              std::vector<double>& final_hidden);

}  // namespace dflash::test
