#include "lib/state/checkpointing.h"

#include "lib/model/drafter_export.h"

namespace dflash::state {

CheckpointExpectation checkpoint_expectation(const TrainConfig& cfg, const train::RunPlan& plan,
                                             const RunIdentity& id) {
  CheckpointExpectation e;
  e.layout = {cfg.layout.target_tp, cfg.layout.target_groups, cfg.layout.drafter_dp, cfg.optim.micro_batches};
  e.drafter = plan.drafter;
  e.config_hash = config_hash_hex(cfg);
  e.dataset = id.dataset;
  e.target = id.target;
  e.steps_per_epoch = plan.steps_per_epoch;
  e.seed = uint64_t(cfg.run.seed);
  return e;
}

TrainingState training_state(const TrainConfig& cfg, const train::RunPlan& plan, int64_t next_step,
                             const RunIdentity& id) {
  TrainingState s;
  s.step = next_step;
  s.data.epoch = next_step / plan.steps_per_epoch;
  s.data.step_in_epoch = next_step % plan.steps_per_epoch;
  s.data.shuffle_seed = uint64_t(cfg.run.seed);
  s.layout = checkpoint_expectation(cfg, plan).layout;
  s.config_hash = config_hash_hex(cfg);
  s.dataset = id.dataset;
  s.target = id.target;
  if (!id.init.empty()) s.extra["init"] = id.init;
  for (int r = 0; r < cfg.layout.drafter_dp; ++r) s.rng.push_back({r, uint64_t(cfg.run.seed), uint64_t(r), uint64_t(next_step)});
  s.extra["export"] = model::export_info_json({plan.tap_ids, plan.target.layers, plan.target.max_position_embeddings});
  return s;
}

std::string resolve_resume_dir(const TrainConfig& cfg) {
  if (cfg.ckpt.resume == "none") return "";
  if (cfg.ckpt.resume == "auto") return find_latest_checkpoint(cfg.run.out_dir);
  return cfg.ckpt.resume;
}

}  // namespace dflash::state
