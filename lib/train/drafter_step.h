#pragma once
// One optimizer step of the drafter on one DP rank: for each micro-batch, anchors → drafter forward → vocab loss
// → backward; then one all-reduce of the gradients and the step's sums across the drafter ranks, normalisation
// by the global Σw, global-norm clipping and AdamW. Every drafter rank ends the step with identical weights.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/comm/transport.h"
#include "lib/model/adamw.h"
#include "lib/model/drafter.h"
#include "lib/model/vocab_loss.h"
#include "lib/train/anchors.h"
#include "lib/train/packet.h"
#include "lib/train/run_plan.h"

namespace dflash::train {

// Global (all drafter ranks, all micro-batches) results of one step.
struct StepResult {
  int64_t step = 0;
  model::VocabLossSums sums;          // unnormalised; loss = sums.loss / sums.weight
  model::VocabLossMetrics metrics;    // counts
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

// Sums r's loss sums and counts (tokens, positions, top-k hits, accepted, blocks, correct[B], scored[B]) over the
// drafter DP group `dp`, in place, in one all-reduce of doubles; the `extra` values ride along, summed, and are
// returned. The one reduction of a training step and of a held-out eval, so that the two agree field by field.
std::vector<double> allreduce_step_sums(comm::Transport& dp, StepResult& r, int block_size,
                                        std::vector<double> extra = {});

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

// One drafter rank's optimizer steps. The kernels run on the backend run.device names, in the compute type
// run.precision names: the CPU in fp32, CUDA in fp32 or bf16 (bf16 activations and compute weights, fp32 master
// weights, gradients and AdamW state). Weights, gradients and optimizer state live in the backend's memory,
// mirrored on the host for checkpoints (params(), optimizer()); the gradient all-reduce takes the device
// gradients on a data plane that accepts device pointers (NCCL) and goes through the host otherwise (MPI).
// Packets whose tensors are in the backend's memory (NCCL on GPUs) are read in place (bf16: one conversion on the
// device); host packets are uploaded.
class DrafterStep {
 public:
  // embed, lm_head: [V, H] frozen target tensors on the host (outlive this object). dp: the drafter DP group.
  DrafterStep(const TrainConfig& cfg, const RunPlan& plan, const float* embed, const float* lm_head, int dp_rank,
              comm::Transport& dp);
  ~DrafterStep();

  // Runs step `step` on the micro-batches next_packet(0..M-1) returns (each valid until the next call: a
  // micro-batch is complete, device work included, before the next packet is asked for). wait_seconds: filled by
  // next_packet. stop_signal: this rank received a stop signal (agreed on across ranks in the step's all-reduce).
  // capture: when given, filled for --dump-step.
  StepResult run(int64_t step,
                 const std::function<const FeaturePacket&(int micro, double* wait_seconds)>& next_packet,
                 bool stop_signal = false, StepCapture* capture = nullptr);
  // Work for the host while the step waits for its compute (between the phases of a micro-batch, and while a GPU
  // runs it): the drafter worker moves the packet stream along (PacketReceiver::poll). Must not throw on a healthy
  // stream and must not touch the step.
  void set_progress(std::function<void()> progress);

  // Held-out eval of one packet: forward + loss with the current weights, no gradients, nothing changed. Anchors
  // drawn as a training step draws them for `key`. This rank's unreduced sums and counts (the caller reduces).
  StepResult evaluate(const FeaturePacket& packet, const AnchorKey& key);

  // Host copies of the weights and optimizer state (downloaded from the backend on each call). A caller that
  // changes them (resume) calls upload_state() afterwards.
  model::DrafterParams<float>& params();
  model::AdamWState& optimizer();
  void upload_state();
  const model::DrafterConfig& config() const;
  std::string backend_name() const;  // "cpu fp32", "cuda bf16"
  // FNV-1a of the weight bytes: equal on every drafter rank after every step.
  uint64_t weights_hash();

  class Engine;  // the step in one compute type (drafter_step.cpp)

 private:
  std::unique_ptr<Engine> engine_;
};

}  // namespace dflash::train
