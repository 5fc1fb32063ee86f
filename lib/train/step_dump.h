#pragma once
// --dump-step DIR: one step's inputs, loss and gradients in one safetensors file, so the step can be checked
// against any other implementation (e.g. the PyTorch reference):
//   inputs.slot{k}.tokens [S], .loss_mask [S], .anchors [N], .taps [S, n_taps*H], .final_hidden [S, H]
//       slot k = micro_batch · drafter_dp + drafter_rank: the sequence's place in the global batch. Ids and masks
//       are stored as F32 (exact below 2^24, i.e. for every vocabulary in use).
//   loss, loss.ce, loss.kl, loss.cap, loss.weight_sum [1]  (normalised by the global Σw, as trained)
//   <export name> of every trainable tensor: its gradient, normalised by Σw, before clipping.
// Metadata: step, config hash, the loss values in full double precision, the tap layer ids.
#include <string>

#include "lib/comm/transport.h"
#include "lib/train/drafter_step.h"

namespace dflash::train {

// Collective over the drafter DP group: ranks > 0 send their inputs to rank 0, which writes
// DIR/step_XXXXXXXX.safetensors (via a temporary name) and returns its path ("" on other ranks).
std::string write_step_dump(const std::string& dir, comm::Transport& dp, const RunPlan& plan,
                            const TrainConfig& cfg, const StepResult& r, const StepCapture& capture,
                            const DrafterParams<float>& layout_of);

}  // namespace dflash::train
