#pragma once
// `dflash_mpi CONFIG --check` predicts the pipeline's balance on a named GPU before any GPU is spent: how long the
// target group needs to produce one sequence's features (the heaviest TP rank's forward: its GEMMs, attention,
// Gated DeltaNet delta rule, elementwise passes and TP all-reduces) and how long one drafter rank needs for one
// micro-step (its forward and backward, the vocab loss, its share of the step's gradient all-reduce and AdamW),
// from the FLOP and byte counts the project computes (model::shard_cost, model::drafter_flops) and the GPU's data
// sheet (lib/preflight/gpu_specs.h) at stated efficiencies. A group feeds its drafter ranks one sequence each per
// micro-step, so the drafters wait for the group when drafters_per_group × target time > drafter time. Every figure
// is a prediction: unverified on GPU until gpu_check has measured it (docs/benchmarks.md).
#include <string>
#include <utility>
#include <vector>

#include "lib/config/config.h"
#include "lib/preflight/gpu_specs.h"
#include "lib/report/check_item.h"
#include "lib/train/run_plan.h"

namespace dflash::preflight {

// What the prediction depends on, from the config, the run plan and the data.
struct BalanceInputs {
  model::QwenConfig target;
  model::DrafterConfig drafter;
  int target_tp = 1, target_groups = 1, drafter_dp = 1, micro_batches = 1;
  int seq_len = 0;           // S: the sequence length predicted for (the data's mean, capped by data.max_seq_len)
  int anchors_per_seq = 0;   // N (fewer when a sequence has fewer anchor candidates: min(N, S/2))
  bool fused_loss = true;
  bool kl = false;           // the KL term: the target's logits too
  bool bf16_allreduce = true;  // layout.tp_allreduce
};
BalanceInputs balance_inputs(const TrainConfig& cfg, const train::RunPlan& plan, int seq_len);

// Seconds of one part of a role's time ("GEMMs", "delta rule", ...).
using TimePart = std::pair<std::string, double>;

struct BalancePrediction {
  std::string gpu;                  // GpuSpec::key
  std::vector<TimePart> target;     // one sequence's forward on the heaviest TP rank
  std::vector<TimePart> drafter;    // one micro-step of one drafter rank (one sequence)
  std::string delta_kernel;         // which delta-rule kernel that GPU runs ("" for a dense target)
  int drafters_per_group = 1;       // the most drafter ranks one group feeds
  double target_seq = 0;            // Σ target
  double drafter_step = 0;          // Σ drafter
  double group_period = 0;          // drafters_per_group × target_seq: the group's time per micro-step
  double drafter_idle = 0;          // share of the drafters' time spent waiting for features
  double target_idle = 0;           // share of the target group's time spent waiting for drafters
  int balanced_groups = 0;          // layout.target_groups that would keep the drafters busy (0: none would)
  int balanced_anchors = 0;         // loss.anchors_per_seq that would fill the drafters' wait (0: not needed)
  // the same target GPUs regrouped (target_tp × target_groups unchanged) with the least drafter idle, where the
  // shard's bf16 weights take at most 80 % of the GPU: 0 when no split gets the drafters under kIdleWarning
  int regrouped_tp = 0, regrouped_groups = 0;
  double regrouped_idle = 0;
  // sequences a second the job trains (each drafter rank one per micro-step) and the split of the same world
  // (target_tp × target_groups + drafter_dp ranks) that trains the most by the model
  double rate = 0;
  int best_tp = 0, best_groups = 0, best_dp = 0;
  double best_rate = 0;
};

BalancePrediction predict_balance(const BalanceInputs& in, const GpuSpec& gpu);

// The --check section after its name ("pipeline balance"): what it predicts from, one table row per GPU and, with
// warnings and above 20 % predicted drafter idle, a warning with what would balance it.
std::string format_balance(const BalanceInputs& in, const std::vector<BalancePrediction>& rows, bool warnings = true);

// --check's item: the table for `gpus` (empty: the H200, the RTX PRO 6000 and this machine's GPU when it is another
// of the table's) at mean_seq_len tokens a sequence (capped by data.max_seq_len). The warnings are for a GPU run: a
// CPU run's config (run.device cpu, no --gpu) shows the table alone, as what its GPUs would do.
report::CheckItem balance_item(const TrainConfig& cfg, const train::RunPlan& plan, int64_t mean_seq_len,
                               const std::vector<std::string>& gpus);

// Drafter idle above which --check warns.
inline constexpr double kIdleWarning = 0.20;

}  // namespace dflash::preflight
