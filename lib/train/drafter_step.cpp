#include "lib/train/drafter_step.h"

#include <algorithm>
#include <cstring>

#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/train/anchors.h"

namespace dflash::train {

DrafterStep::DrafterStep(const TrainConfig& cfg, const RunPlan& plan, const float* embed, const float* lm_head,
                         int dp_rank, comm::Transport& dp)
    : cfg_(cfg), plan_(plan), embed_(embed), dp_rank_(dp_rank), dp_(dp), params_(plan.drafter),
      grads_(plan.drafter), loss_(plan.loss, lm_head, plan.drafter.vocab, plan.drafter.hidden) {
  // same seed on every rank: identical initial weights without a broadcast
  params_.init_random(uint64_t(cfg.run.seed), cfg.drafter.init_std);
  adam_settings_.lr = cfg.optim.lr;
  adam_settings_.beta1 = cfg.optim.beta1;
  adam_settings_.beta2 = cfg.optim.beta2;
  adam_settings_.eps = cfg.optim.eps;
  adam_settings_.weight_decay = cfg.optim.weight_decay;
  decay_mask_.assign(params_.flat.size(), 1);
  for (const ParamInfo& p : params_.layout)
    if (p.is_norm) std::fill(decay_mask_.begin() + p.offset, decay_mask_.begin() + p.offset + p.numel, 0);
}

void DrafterStep::micro_batch(int64_t step, int micro, const FeaturePacket& pk, StepResult& r,
                              StepCapture* capture) {
  const DrafterConfig& c = plan_.drafter;
  const int S = pk.header.seq_len, H = c.hidden, B = c.block_size;
  r.tokens += S;
  const AnchorKey key{uint64_t(cfg_.run.seed), step, int64_t(micro) * cfg_.layout.drafter_dp + dp_rank_};
  const std::vector<int> anchors = sample_anchors(pk.loss_mask.data(), S, cfg_.loss.anchors_per_seq, key);
  if (capture)
    capture->inputs.push_back({pk.header.seq_index, pk.tokens, pk.loss_mask, anchors, pk.taps, pk.final_hidden});
  if (anchors.empty()) return;  // nothing trainable in this sequence
  const ScoredRows rows = scored_rows(pk.tokens.data(), pk.loss_mask.data(), S, anchors, B, plan_.decay_gamma);
  const int T = rows.size();

  DrafterInputs<float> in{pk.taps.data(), pk.tokens.data(), S, anchors.data(), int(anchors.size()), embed_};
  drafter_forward(c, params_, in, acts_);

  // gather the scored rows: drafter output rows b·B + k, target final hidden at a_b + k − 1
  const bool with_kl = plan_.loss.kl_weight != 0;
  x_rows_.resize(size_t(T) * H);
  for (int i = 0; i < T; ++i)
    std::memcpy(&x_rows_[size_t(i) * H], &acts_.out[size_t(rows.out_row[i]) * H], sizeof(float) * H);
  if (with_kl) {
    y_rows_.resize(size_t(T) * H);
    for (int i = 0; i < T; ++i)
      std::memcpy(&y_rows_[size_t(i) * H], &pk.final_hidden[size_t(rows.target_pos[i]) * H], sizeof(float) * H);
  }
  VocabLossBatch<float> batch;
  batch.rows = T;
  batch.hidden = x_rows_.data();
  batch.target_hidden = with_kl ? y_rows_.data() : nullptr;
  batch.labels = rows.label.data();
  batch.weights = rows.weight.data();
  batch.block_pos = rows.block_pos.data();
  batch.block_id = rows.block_id.data();

  // grad_scale 1: gradients stay unnormalised until the global Σw is known after the all-reduce (they are linear
  // in it), so no extra round trip is needed before the first micro-batch.
  dx_rows_.resize(size_t(T) * H);
  VocabLossResult res = loss_.forward(batch, loss_ctx_, 1.0, dx_rows_.data());
  loss_.backward(batch, loss_ctx_, 1.0, dx_rows_.data());
  r.sums.add(res.sums);
  r.metrics.add(res.metrics);
  for (float w : rows.weight) r.positions += w > 0;

  d_out_.assign(size_t(anchors.size()) * B * H, 0.0f);  // unscored rows (the anchors' own) get no gradient
  for (int i = 0; i < T; ++i)
    std::memcpy(&d_out_[size_t(rows.out_row[i]) * H], &dx_rows_[size_t(i) * H], sizeof(float) * H);
  drafter_backward(c, params_, in, acts_, d_out_.data(), grads_);
}

StepResult DrafterStep::run(int64_t step, const std::function<FeaturePacket(int, double*)>& next_packet,
                            bool stop_signal, StepCapture* capture) {
  StepResult r;
  r.step = step;
  r.metrics.correct.assign(plan_.drafter.block_size, 0);
  r.metrics.scored.assign(plan_.drafter.block_size, 0);
  grads_.zero();
  for (int m = 0; m < cfg_.optim.micro_batches; ++m) {
    FeaturePacket packet = next_packet(m, &r.wait_seconds);
    Timer t;
    micro_batch(step, m, packet, r, capture);
    r.compute_seconds += t.seconds();
  }

  // one all-reduce for the gradients, one for the step's sums and counts (in double)
  Timer t;
  dp_.allreduce_sum(grads_.flat.data(), grads_.flat.size());
  const int B = plan_.drafter.block_size;
  std::vector<double> stats = {r.sums.loss, r.sums.ce, r.sums.kl, r.sums.cap, r.sums.weight, double(r.tokens),
                               double(r.positions), double(r.metrics.topk_hits), double(r.metrics.accepted_sum),
                               double(r.metrics.blocks)};
  for (int k = 0; k < B; ++k) stats.push_back(double(r.metrics.correct[k]));
  for (int k = 0; k < B; ++k) stats.push_back(double(r.metrics.scored[k]));
  stats.push_back(stop_signal ? 1.0 : 0.0);
  dp_.allreduce_sum(stats.data(), stats.size());
  r.stop_requested = stats.back() > 0;
  r.reduce_seconds = t.seconds();
  r.sums = {stats[0], stats[1], stats[2], stats[3], stats[4]};
  r.tokens = int64_t(stats[5]);
  r.positions = int64_t(stats[6]);
  r.metrics.topk_hits = int64_t(stats[7]);
  r.metrics.accepted_sum = int64_t(stats[8]);
  r.metrics.blocks = int64_t(stats[9]);
  for (int k = 0; k < B; ++k) {
    r.metrics.correct[k] = int64_t(stats[10 + k]);
    r.metrics.scored[k] = int64_t(stats[10 + B + k]);
  }

  r.lr = lr_at(step, plan_.total_steps, cfg_.optim.lr, cfg_.optim.warmup_ratio, cfg_.optim.min_lr_ratio);
  if (r.sums.weight <= 0) {  // Σw = 0: the loss is 0/0; change nothing rather than step on NaN
    r.skipped = true;
    if (capture) capture->grads = grads_.flat;  // all zero: every weight was 0
    return r;
  }
  const float inv_w = float(1.0 / r.sums.weight);
  for (float& g : grads_.flat) g *= inv_w;
  if (capture) capture->grads = grads_.flat;
  r.grad_norm = clip_global_norm(grads_.flat.data(), grads_.flat.size(), cfg_.optim.grad_clip);
  adamw_step(params_.flat.data(), grads_.flat.data(), params_.flat.size(), adam_, adam_settings_, r.lr, decay_mask_);
  return r;
}

uint64_t DrafterStep::weights_hash() const {
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(params_.flat.data());
  for (size_t i = 0; i < params_.flat.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace dflash::train
