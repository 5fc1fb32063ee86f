#pragma once
// The held-out eval while training (docs/eval.md "During training"): after every eval.every steps, each target
// group streams the first eval.max_sequences sequences of eval.data as packets of kind kEvalPacket right after
// the packets of that step (so the stop protocol treats them as packets of the step); the drafter ranks run
// forward + loss on them with the current weights and no gradients, the sums are reduced over the drafter DP
// group, and the first drafter rank writes one {"kind": "eval"} metrics record and a progress line.
//
// Held-out sequence i goes to drafter rank i % drafter_dp; its anchors are drawn with the key (seed, N, slot i) of
// the eval after N steps — the key training step N (0-based) uses for global-batch slot i. So the eval after N
// steps of sequences s_0, s_1, ... equals, to the bit, the loss training step N+1 reports when its global batch
// holds the same sequences in the same slots (tests/integration/train_eval.sh checks this). The anchors change
// from eval to eval like training's; the mean over the held-out set is what to compare.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/comm/transport.h"
#include "lib/config/config.h"
#include "lib/eval/evaluator.h"
#include "lib/io/dataset.h"
#include "lib/train/drafter_step.h"
#include "lib/train/run_plan.h"
#include "lib/train/packet.h"
#include "lib/train/stream_plan.h"

namespace dflash::eval {

// True when the held-out eval runs after `next_step` steps (a count, 1-based).
bool heldout_due(const TrainConfig& cfg, int64_t next_step);
// Sequences evaluated: the first eval.max_sequences of `eval` (0 = all).
int64_t heldout_count(const TrainConfig& cfg, const io::Dataset& eval);
// The held-out sequences drafter rank d evaluates, in the order they are streamed: d, d + dp, d + 2 dp, ...
std::vector<int64_t> heldout_sequences(int64_t count, int drafter_dp, int d);
// The plan of the packet of held-out sequence i, sent after the packets of step `step` (0-based).
train::PacketPlan heldout_plan(const TrainConfig& cfg, const io::Dataset& eval, int64_t step, int64_t i);

// The reduced result of one held-out eval (every drafter rank holds the same).
struct HeldoutResult {
  int64_t step = 0;       // steps trained before it (the weights of ckpt/step_<step>)
  train::StepResult sums;  // global sums and counts (sums.step unused)
  int64_t sequences = 0;  // global
  double seconds = 0;     // this rank: receive + forward + reduce
};

// Collective over the drafter DP group `dp`: evaluates this rank's held-out packets (next_packet gives them in
// order) and reduces the sums. `sequences`: this rank's count (heldout_sequences(...).size()).
HeldoutResult run_heldout_eval(train::DrafterStep& drafter, comm::Transport& dp, const TrainConfig& cfg,
                               int64_t next_step, int64_t sequences, int block_size,
                               const std::function<const train::FeaturePacket&(double* wait_seconds)>& next_packet);

// {"step": N, "kind": "eval", "eval_loss": ..., "eval_tau": ...}: keys prefixed so that readers of the training
// records (which look for "loss", "tau") never mistake it for one.
nlohmann::ordered_json heldout_record(const HeldoutResult& r, int block_size);
// "eval step N | loss ... | acc ... | tau ... | K sequences in S s"
std::string heldout_line(const HeldoutResult& r, int block_size, int top_k);
// The held-out tau of a result (mean tokens kept per block, teacher-forced).
double heldout_tau(const HeldoutResult& r);

// The held-out packets in the stream plan: after each step the eval is due at, drafter rank d's share of them.
class HeldoutPackets : public train::ExtraPackets {
 public:
  HeldoutPackets(const TrainConfig& cfg, const io::Dataset& eval)
      : cfg_(cfg), eval_(eval), count_(heldout_count(cfg, eval)) {}
  int32_t kind() const override { return train::kEvalPacket; }
  std::vector<train::PacketPlan> after_step(int64_t step, int d) const override;
  io::Sequence read(const train::PacketPlan& p) const override {
    return eval_.read(p.seq_index, cfg_.data.max_seq_len);
  }

 private:
  const TrainConfig& cfg_;
  const io::Dataset& eval_;
  int64_t count_;
};

// The drafter side as a component: due after every eval.every steps unless the run stops after this step (its
// packets are then dropped with the step's); every drafter rank runs it (the reduction is collective, also for a
// rank with no held-out sequence of its own). Its τ is eval_tau.
class HeldoutEval : public Evaluator {
 public:
  // dp_rank: this drafter rank (its share of the sequences).
  HeldoutEval(const TrainConfig& cfg, const io::Dataset& eval, int block_size, int dp_rank);
  std::string name() const override { return "held-out eval"; }
  bool due(int64_t next_step, bool stop) const override { return heldout_due(cfg_, next_step) && !stop; }
  EvalOutcome run(EvalContext& ctx) override;

 private:
  const TrainConfig& cfg_;
  int block_size_;
  int64_t sequences_;  // this rank's
};

// The held-out eval as the job builds it (lib/eval/evals.cpp, when eval.every > 0): eval.data opened on every
// rank (every token id checked when scan_tokens: the target ranks, which stream it, and --check), its packets, its
// drafter side on every drafter rank.
class HeldoutTrainingEval : public TrainingEval {
 public:
  HeldoutTrainingEval(const TrainConfig& cfg, const train::RunPlan& plan, bool scan_tokens);
  std::string name() const override { return "held-out eval"; }
  // What would score nothing is refused as for data.path (train::check_data_facts).
  void check_on_start() const override;
  report::CheckItem check_item() const override;  // "eval data      PATH: N of M sequences every K steps (...)"
  std::unique_ptr<train::ExtraPackets> packets() const override;
  std::unique_ptr<Evaluator> drafter_side(const comm::RankLayout& layout) const override;
  std::optional<state::TauMetric> metric() const override { return state::TauMetric::eval_tau; }

 private:
  const TrainConfig& cfg_;
  const train::RunPlan& plan_;
  io::Dataset data_;
};

}  // namespace dflash::eval
