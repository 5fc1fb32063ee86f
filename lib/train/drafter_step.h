#pragma once
// One optimizer step of the drafter on one DP rank: for each micro-batch, anchors → drafter forward → vocab loss
// → backward; then one all-reduce of the gradients and the step's sums across the drafter ranks, normalisation
// by the global Σw, global-norm clipping and AdamW. Every drafter rank ends the step with identical weights.
#include <cstdint>
#include <functional>
#include <memory>
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

// An array the step's kernels read or write: in the backend's memory, or the host array itself when the backend
// is the CPU (no copy).
class BackendArray {
 public:
  void bind(kernels::Backend<float>& be, void* host, size_t bytes);  // device: allocates; host: aliases
  void upload(kernels::Backend<float>& be, ExecContext& ec) const;    // host → backend (no-op when aliased)
  void download(kernels::Backend<float>& be, ExecContext& ec) const;  // backend → host (no-op when aliased)
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* host_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Buffer owned_;  // device memory; empty when aliasing host memory
};

class DrafterStep {
 public:
  // embed, lm_head: [V, H] frozen target tensors on the host (outlive this object). dp: the drafter DP group.
  // The kernels run on the backend run.device names (cpu, or cuda with the fp32 path); weights, gradients and
  // optimizer state live in its memory, mirrored on the host for checkpoints (params(), optimizer()).
  DrafterStep(const TrainConfig& cfg, const RunPlan& plan, const float* embed, const float* lm_head, int dp_rank,
              comm::Transport& dp);

  // Runs step `step` on the micro-batches next_packet(0..M-1) returns. wait_seconds: filled by next_packet.
  // stop_signal: this rank received a stop signal (agreed on across ranks in the step's all-reduce).
  // capture: when given, filled for --dump-step.
  StepResult run(int64_t step, const std::function<FeaturePacket(int micro, double* wait_seconds)>& next_packet,
                 bool stop_signal = false, StepCapture* capture = nullptr);

  // Host copies of the weights and optimizer state (downloaded from the backend on each call). A caller that
  // changes them (resume) calls upload_state() afterwards.
  DrafterParams<float>& params();
  AdamWState& optimizer();
  void upload_state();
  const DrafterConfig& config() const { return plan_.drafter; }
  const char* backend_name() const { return backend_->name(); }
  // FNV-1a of the weight bytes: equal on every drafter rank after every step.
  uint64_t weights_hash();

 private:
  void micro_batch(int64_t step, int micro, const FeaturePacket& packet, StepResult& r, StepCapture* capture);

  // Device arrays of one micro-batch's packet and rows (host memory on the CPU backend).
  void upload_packet(const FeaturePacket& packet, const std::vector<int32_t>& out_rows,
                     const std::vector<int32_t>& target_rows, bool with_kl);

  const TrainConfig& cfg_;
  const RunPlan& plan_;
  int dp_rank_;
  comm::Transport& dp_;
  std::unique_ptr<kernels::Backend<float>> backend_;
  ExecContext& exec_;
  DrafterParams<float> params_, grads_;  // host: master weights; gradients (the all-reduce runs on the host)
  AdamWState adam_;
  AdamWSettings adam_settings_;
  std::vector<uint8_t> decay_mask_;  // [P] 1 on matrices, 0 on norm weights
  // the same in the backend's memory, and the frozen target tensors
  BackendArray w_dev_, g_dev_, m_dev_, v_dev_, decay_dev_, embed_dev_, head_dev_;
  DrafterWeights<float> w_views_, g_views_;  // views of w_dev_ / g_dev_
  std::unique_ptr<VocabLoss<float>> loss_;
  // reused across micro-batches (backend memory)
  DrafterActivations<float> acts_;
  VocabLossContext loss_ctx_;
  Buffer taps_, final_hidden_, rows_idx_, x_rows_, y_rows_, dx_rows_, d_out_;
};

}  // namespace dflash::train
