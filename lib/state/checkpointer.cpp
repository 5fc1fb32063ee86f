#include "lib/state/checkpointer.h"

#include <cstdio>

#include <fmt/format.h>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/core/named_enum.h"
#include "lib/core/timer.h"
#include "lib/io/safetensors.h"
#include "lib/state/checkpointing.h"

namespace dflash::state {

Checkpointer::Checkpointer(const TrainConfig& cfg, const train::RunPlan& plan, CheckpointerSettings s)
    : cfg_(cfg), plan_(plan), s_(std::move(s)) {
  if (s_.writer && s_.best_metric) best_.emplace(cfg.run.out_dir, *s_.best_metric);
}

bool Checkpointer::due(int every, int64_t next_step, bool last, bool stop, bool save_on_stop) {
  const bool periodic = every > 0 && (next_step % every == 0 || last);
  return periodic || (stop && save_on_stop);
}

bool Checkpointer::due(int64_t next_step, bool last, bool stop) const {
  return s_.writer && due(cfg_.ckpt.every, next_step, last, stop, s_.save_on_stop);
}

std::string Checkpointer::save(int64_t next_step, train::DrafterStep& drafter) {
  Timer t;
  const std::string dir = save_checkpoint(cfg_.run.out_dir, plan_.drafter, drafter.params(), drafter.optimizer(),
                                          training_state(cfg_, plan_, next_step, s_.identity));
  const auto removed = prune_checkpoints(cfg_.run.out_dir, cfg_.ckpt.keep);
  return fmt::format("checkpoint: {} ({:.2f} s){}", dir, t.seconds(),
                     removed.empty() ? "" : fmt::format("; removed {} older", removed.size()));
}

std::string Checkpointer::best_notice() const {
  return best_ && !best_->notice().empty() ? fmt::format("best checkpoint: {}", best_->notice()) : std::string();
}

std::string Checkpointer::offer_best(int64_t next_step, std::optional<TauMetric> metric, double tau,
                                     train::DrafterStep& drafter) {
  if (!best_ || metric != best_->metric()) return "";
  Timer t;
  if (!best_->offer(tau, plan_.drafter, drafter.params(), training_state(cfg_, plan_, next_step, s_.identity)))
    return "";
  return fmt::format("best checkpoint: {} = step {} ({} {:.4f}, {:.2f} s)", best_checkpoint_dir(cfg_.run.out_dir),
                     next_step, name_of(best_->metric()), tau, t.seconds());
}

void init_drafter(comm::Transport& dp, train::DrafterStep& drafter, const model::DrafterParams<float>* init) {
  model::DrafterParams<float>& w = drafter.params();
  if (dp.rank() == 0) {
    DFLASH_CHECK(init && init->flat.size() == w.flat.size(), "internal: drafter rank 0 warm-starts without weights");
    w.flat = init->flat;
  }
  dp.broadcast(w.flat.data(), w.flat.size(), 0);
  drafter.upload_state();
}

void restore_drafter(comm::Transport& dp, train::DrafterStep& drafter, const LoadedCheckpoint* ckpt) {
  model::DrafterParams<float>& w = drafter.params();
  model::AdamWState& adam = drafter.optimizer();
  if (dp.rank() == 0) {
    DFLASH_CHECK(ckpt, "internal: drafter rank 0 resumes without a loaded checkpoint");
    w.flat = ckpt->params.flat;
    adam = ckpt->optimizer;
  }
  int64_t adam_step = adam.step, has_moments = adam.m.empty() ? 0 : 1;
  dp.broadcast(&adam_step, 1, 0);
  dp.broadcast(&has_moments, 1, 0);
  dp.broadcast(w.flat.data(), w.flat.size(), 0);
  adam.step = adam_step;
  if (has_moments) {
    adam.m.resize(w.flat.size());
    adam.v.resize(w.flat.size());
    dp.broadcast(adam.m.data(), adam.m.size(), 0);
    dp.broadcast(adam.v.data(), adam.v.size(), 0);
  }
  drafter.upload_state();  // the backend's copies follow the restored host state
}

std::string write_final_weights(const std::string& out_dir, const model::DrafterParams<float>& params) {
  const std::string path = out_dir + "/drafter_final.safetensors";
  std::vector<io::TensorToWrite> tensors;
  for (const model::ParamInfo& p : params.layout)
    tensors.push_back(io::tensor_from(p.name, io::DType::F32, p.shape, params.data(p)));
  AtomicOutput file(path);  // the old file or the complete new one under this name, never a torn one
  io::write_safetensors(file.partial(), tensors, {{"format", "pt"}});
  file.commit();
  return path;
}

}  // namespace dflash::state
