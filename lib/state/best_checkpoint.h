#pragma once
// `out_dir/ckpt/best/`: the weights of the step with the highest eval τ so far (docs/checkpoints.md "The best
// checkpoint"). The metric is the speculative τ when eval.spec_every is on, else the held-out teacher-forced τ
// (TauMetric's order);
// a later step replaces it only with a strictly higher τ (a tie keeps the earlier step).
//
// Its layout is a checkpoint's (model.safetensors, state.json with the step, DONE), written the same durable way,
// with no optimizer moments (it is for dflash_eval --drafter and export, not for resuming: the trainer refuses to
// resume from it) and state.json extra.best = {metric, value, step}. It is written to ckpt/best.partial/ and then
// swapped in with one atomic exchange of the two names (renameat2 RENAME_EXCHANGE; two renames where the file
// system lacks it), so `best` is always a complete checkpoint or absent. Its name is not step_<digits>:
// find_latest_checkpoint (resume) and prune_checkpoints (ckpt.keep) never see it.
#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include "lib/model/drafter_config.h"
#include "lib/model/drafter_params.h"
#include "lib/state/checkpoint.h"

namespace dflash::state {

// out_dir/ckpt/best
std::string best_checkpoint_dir(const std::string& out_dir);

// Which τ chooses the best checkpoint, in the order of preference when several evals measure one: the held-out
// teacher-forced τ (eval_tau), then the speculative τ (spec_tau: measured by decoding, the number users serve by).
// The names are what state.json extra.best.metric and the log write (lib/core/named_enum.h).
enum class TauMetric { eval_tau, spec_tau };
constexpr std::array<const char*, 2> names_of(TauMetric) { return {"eval_tau", "spec_tau"}; }

class BestCheckpoint {
 public:
  // metric: the τ that chooses. The best it finds (a resumed run's, or one a requeued attempt left before its
  // first step checkpoint) is kept; chosen by the same metric, its value is the one to beat. Never deleted here: a
  // fresh start over an earlier run's best is refused or moves it aside first (lib/state/out_dir_guard.h).
  BestCheckpoint(const std::string& out_dir, TauMetric metric);
  // When value > the best so far: writes the weights as the new best and returns true.
  bool offer(double value, const model::DrafterConfig& drafter, const model::DrafterParams<float>& params, TrainingState state);
  TauMetric metric() const { return metric_; }
  double value() const { return value_; }
  const std::string& notice() const { return notice_; }  // what the constructor found (for the log)

 private:
  std::string out_dir_, notice_;
  TauMetric metric_;
  double value_ = -std::numeric_limits<double>::infinity();
};

}  // namespace dflash::state
