#pragma once
// --dump-step DIR: one step's inputs, loss and gradients in one safetensors file, so the step can be checked
// against any other implementation (e.g. the PyTorch reference):
//   inputs.slot{k}.tokens [S], .loss_mask [S], .anchors [N], .taps [S, n_taps*H], .final_hidden [S, H]
//       slot k = micro_batch · drafter_dp + drafter_rank: the sequence's place in the global batch. Ids and masks
//       are stored as F32 (exact below 2^24, i.e. for every vocabulary in use).
//   loss, loss.ce, loss.kl, loss.cap, loss.weight_sum [1]  (normalised by the global Σw, as trained)
//   <export name> of every trainable tensor: its gradient, normalised by Σw, before clipping.
//   weights.<export name>: the weights the step started from (before its AdamW update).
// Metadata: step, config hash, the loss values in full double precision, the tap layer ids, and what the loss
// needs besides the tensors: λ_ce, λ_kl, λ_cap, τ (KL temperature), γ (position decay), block size, mask token
// id, anchors per sequence, seed, and the drafter's layer types (full | sliding:<window>). A dump alone can so be
// checked by any other implementation.
#include <string>

#include "lib/comm/transport.h"
#include "lib/train/drafter_step.h"

namespace dflash::state {

// Collective over the drafter DP group: ranks > 0 send their inputs to rank 0, which writes
// DIR/step_XXXXXXXX.safetensors (via a temporary name) and returns its path ("" on other ranks).
std::string write_step_dump(const std::string& dir, comm::Transport& dp, const train::RunPlan& plan,
                            const TrainConfig& cfg, const train::StepResult& r, const train::StepCapture& capture,
                            const model::DrafterParams<float>& layout_of, const std::vector<float>& start_weights);

// The trainer's --dump-step component: inactive when `dir` is empty. before(step) keeps the weights the step starts
// from, capture() is what the step fills, after(r) writes the dump (collective over dp) and returns its path on
// drafter rank 0 ("" elsewhere and when inactive). An active dumper stops the run after its one step.
class StepDumper {
 public:
  StepDumper(std::string dir, comm::Transport& dp, const train::RunPlan& plan, const TrainConfig& cfg,
             train::DrafterStep& drafter)
      : dir_(std::move(dir)), dp_(dp), plan_(plan), cfg_(cfg), drafter_(drafter) {}
  bool active() const { return !dir_.empty(); }
  void before(int64_t step);
  train::StepCapture* capture() { return active() ? &capture_ : nullptr; }
  std::string after(const train::StepResult& r);

 private:
  std::string dir_;
  comm::Transport& dp_;
  const train::RunPlan& plan_;
  const TrainConfig& cfg_;
  train::DrafterStep& drafter_;
  train::StepCapture capture_;
  std::vector<float> start_weights_;  // the weights the step starts from
};

}  // namespace dflash::state
