#pragma once
// One optimizer step of the drafter on one DP rank: for each micro-batch, anchors → drafter forward → vocab loss
// → backward; then one all-reduce of the gradients and the step's sums across the drafter ranks, normalisation
// by the global Σw, global-norm clipping and AdamW. Every drafter rank ends the step with identical weights.
#include <cstdint>
#include <functional>
#include <vector>

#include "lib/comm/transport.h"
#include "lib/model/adamw.h"
#include "lib/model/drafter.h"
#include "lib/model/vocab_loss.h"
#include "lib/train/packet.h"
#include "lib/train/run_plan.h"

namespace dflash::train {

// Global (all drafter ranks, all micro-batches) results of one step.
struct StepResult {
  int64_t step = 0;
  VocabLossSums sums;          // unnormalised; loss = sums.loss / sums.weight
  VocabLossMetrics metrics;    // counts
  double grad_norm = 0;        // before clipping (of the normalised gradient)
  double lr = 0;
  int64_t tokens = 0;          // sequence tokens consumed
  int64_t positions = 0;       // scored rows (w > 0)
  bool skipped = false;        // Σw == 0: nothing was scored, weights unchanged
  bool stop_requested = false; // some drafter rank received SIGTERM / SIGUSR1 before the step's all-reduce
  double compute_seconds = 0;  // this rank: forward + loss + backward
  double wait_seconds = 0;     // this rank: waiting for feature packets
  double reduce_seconds = 0;   // this rank: gradient all-reduce
};

// One micro-batch's inputs as the drafter saw them (for --dump-step).
struct MicroBatchInputs {
  int64_t seq_index = -1;
  std::vector<int32_t> tokens;     // [S]
  std::vector<uint8_t> loss_mask;  // [S]
  std::vector<int> anchors;        // [N]
  std::vector<float> taps;         // [S, n_taps*H]
  std::vector<float> final_hidden; // [S, H]
};

// What --dump-step keeps of a step: this rank's inputs and the global gradient (normalised by Σw, before clipping).
struct StepCapture {
  std::vector<MicroBatchInputs> inputs;  // [micro_batches]
  std::vector<float> grads;              // [P], layout of DrafterParams
};

class DrafterStep {
 public:
  // embed, lm_head: [V, H] frozen target tensors (outlive this object). dp: the drafter DP group.
  DrafterStep(const TrainConfig& cfg, const RunPlan& plan, const float* embed, const float* lm_head, int dp_rank,
              comm::Transport& dp);

  // Runs step `step` on the micro-batches next_packet(0..M-1) returns. wait_seconds: filled by next_packet.
  // stop_signal: this rank received a stop signal (agreed on across ranks in the step's all-reduce).
  // capture: when given, filled for --dump-step.
  StepResult run(int64_t step, const std::function<FeaturePacket(int micro, double* wait_seconds)>& next_packet,
                 bool stop_signal = false, StepCapture* capture = nullptr);

  DrafterParams<float>& params() { return params_; }
  AdamWState& optimizer() { return adam_; }
  const DrafterConfig& config() const { return plan_.drafter; }
  // FNV-1a of the weight bytes: equal on every drafter rank after every step.
  uint64_t weights_hash() const;

 private:
  void micro_batch(int64_t step, int micro, const FeaturePacket& packet, StepResult& r, StepCapture* capture);

  const TrainConfig& cfg_;
  const RunPlan& plan_;
  const float* embed_;
  int dp_rank_;
  comm::Transport& dp_;
  DrafterParams<float> params_, grads_;
  AdamWState adam_;
  AdamWSettings adam_settings_;
  std::vector<uint8_t> decay_mask_;  // [P] 1 on matrices, 0 on norm weights
  VocabLoss<float> loss_;
  // reused across micro-batches
  DrafterActivations<float> acts_;
  VocabLossContext loss_ctx_;
  std::vector<float> x_rows_, y_rows_, dx_rows_, d_out_;
};

}  // namespace dflash::train
