#include "lib/train/drafter_step.h"

#include <algorithm>
#include <cstring>

#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/train/anchors.h"

namespace dflash::train {

namespace {

std::unique_ptr<kernels::Backend<float>> make_backend(const TrainConfig& cfg) {
  if (cfg.run.device == "cuda") return kernels::make_cuda_backend<float>();
  return kernels::make_cpu_backend<float>();
}

// Grows buf (in the backend's memory) to at least `bytes`; contents are not kept.
void ensure(Buffer& buf, MemoryKind kind, size_t bytes) {
  if (buf.bytes() < bytes) buf = Buffer(kind, bytes);
}

}  // namespace

void BackendArray::bind(kernels::Backend<float>& be, void* host, size_t bytes) {
  host_ = host;
  bytes_ = bytes;
  if (be.memory() == MemoryKind::host) {
    owned_ = Buffer();
    ptr_ = host;
  } else {
    owned_ = Buffer(be.memory(), bytes);
    ptr_ = owned_.data();
  }
}

void BackendArray::upload(kernels::Backend<float>& be, ExecContext& ec) const {
  if (ptr_ != host_ && bytes_) be.upload(ec, ptr_, host_, bytes_);
}

void BackendArray::download(kernels::Backend<float>& be, ExecContext& ec) const {
  if (ptr_ != host_ && bytes_) {
    be.download(ec, host_, ptr_, bytes_);
    be.synchronize(ec);
  }
}

DrafterStep::DrafterStep(const TrainConfig& cfg, const RunPlan& plan, const float* embed, const float* lm_head,
                         int dp_rank, comm::Transport& dp)
    : cfg_(cfg), plan_(plan), dp_rank_(dp_rank), dp_(dp), backend_(make_backend(cfg)),
      exec_(backend_->context()), params_(plan.drafter), grads_(plan.drafter) {
  const DrafterConfig& c = plan.drafter;
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
  adam_.m.assign(params_.flat.size(), 0.0f);
  adam_.v.assign(params_.flat.size(), 0.0f);

  kernels::Backend<float>& be = *backend_;
  const size_t P = params_.flat.size(), VH = size_t(c.vocab) * c.hidden;
  w_dev_.bind(be, params_.flat.data(), P * sizeof(float));
  g_dev_.bind(be, grads_.flat.data(), P * sizeof(float));
  m_dev_.bind(be, adam_.m.data(), P * sizeof(float));
  v_dev_.bind(be, adam_.v.data(), P * sizeof(float));
  decay_dev_.bind(be, decay_mask_.data(), P);
  embed_dev_.bind(be, const_cast<float*>(embed), VH * sizeof(float));  // read only: never downloaded
  head_dev_.bind(be, const_cast<float*>(lm_head), VH * sizeof(float));
  upload_state();
  decay_dev_.upload(be, exec_);
  embed_dev_.upload(be, exec_);
  head_dev_.upload(be, exec_);
  w_views_ = DrafterWeights<float>::bind(c, w_dev_.as<float>());
  g_views_ = DrafterWeights<float>::bind(c, g_dev_.as<float>());
  loss_ = std::make_unique<VocabLoss<float>>(plan.loss, be, exec_, head_dev_.as<float>(), c.vocab, c.hidden);
  // the activation arena, sized once for the longest sequence the config admits (without data.max_seq_len, the
  // first sequences grow it: the longest sequence of the data is not known here)
  if (cfg.data.max_seq_len > 0) acts_.reserve(be.memory(), c, cfg.data.max_seq_len, cfg.loss.anchors_per_seq);
}

DrafterParams<float>& DrafterStep::params() {
  w_dev_.download(*backend_, exec_);
  return params_;
}

AdamWState& DrafterStep::optimizer() {
  m_dev_.download(*backend_, exec_);
  v_dev_.download(*backend_, exec_);
  return adam_;
}

void DrafterStep::upload_state() {
  // resume may hand in an optimizer state without moments (a checkpoint of step 0): start them at zero
  if (adam_.m.size() != params_.flat.size()) adam_.m.assign(params_.flat.size(), 0.0f);
  if (adam_.v.size() != params_.flat.size()) adam_.v.assign(params_.flat.size(), 0.0f);
  kernels::Backend<float>& be = *backend_;
  // the host vectors may have been reassigned (resume): rebind the aliases to their current storage
  const size_t P = params_.flat.size() * sizeof(float);
  w_dev_.bind(be, params_.flat.data(), P);
  m_dev_.bind(be, adam_.m.data(), P);
  v_dev_.bind(be, adam_.v.data(), P);
  w_views_ = DrafterWeights<float>::bind(plan_.drafter, w_dev_.as<float>());
  w_dev_.upload(be, exec_);
  m_dev_.upload(be, exec_);
  v_dev_.upload(be, exec_);
}

void DrafterStep::micro_batch(int64_t step, int micro, const FeaturePacket& pk, StepResult& r,
                              StepCapture* capture) {
  kernels::Backend<float>& be = *backend_;
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
  const bool with_kl = plan_.loss.kl_weight != 0;
  const MemoryKind kind = be.memory();

  // the packet's float arrays in the backend's memory (the CPU reads the packet itself)
  const float* taps = pk.taps.data();
  const float* final_hidden = pk.final_hidden.data();
  if (kind != MemoryKind::host) {
    ensure(taps_, kind, pk.taps.size() * sizeof(float));
    be.upload(exec_, taps_.data(), pk.taps.data(), pk.taps.size() * sizeof(float));
    taps = taps_.as<float>();
    if (with_kl) {
      ensure(final_hidden_, kind, pk.final_hidden.size() * sizeof(float));
      be.upload(exec_, final_hidden_.data(), pk.final_hidden.data(), pk.final_hidden.size() * sizeof(float));
      final_hidden = final_hidden_.as<float>();
    }
  }

  DrafterInputs<float> in{taps, pk.tokens.data(), S, anchors.data(), int(anchors.size()), embed_dev_.as<float>()};
  const DrafterRuntime<float> rt{be, exec_};
  drafter_forward(c, w_views_, in, acts_, rt);

  // gather the scored rows: drafter output rows b·B + k, target final hidden at a_b + k − 1
  ensure(rows_idx_, kind, 2 * size_t(T) * sizeof(int32_t));
  int32_t* out_idx = rows_idx_.as<int32_t>();
  int32_t* target_idx = out_idx + T;
  be.upload(exec_, out_idx, rows.out_row.data(), size_t(T) * sizeof(int32_t));
  be.upload(exec_, target_idx, rows.target_pos.data(), size_t(T) * sizeof(int32_t));
  ensure(x_rows_, kind, size_t(T) * H * sizeof(float));
  be.gather_rows(exec_, x_rows_.as<float>(), acts_.out, out_idx, T, H);
  if (with_kl) {
    ensure(y_rows_, kind, size_t(T) * H * sizeof(float));
    be.gather_rows(exec_, y_rows_.as<float>(), final_hidden, target_idx, T, H);
  }
  VocabLossBatch<float> batch;
  batch.rows = T;
  batch.hidden = x_rows_.as<float>();
  batch.target_hidden = with_kl ? y_rows_.as<float>() : nullptr;
  batch.labels = rows.label.data();
  batch.weights = rows.weight.data();
  batch.block_pos = rows.block_pos.data();
  batch.block_id = rows.block_id.data();

  // grad_scale 1: gradients stay unnormalised until the global Σw is known after the all-reduce (they are linear
  // in it), so no extra round trip is needed before the first micro-batch.
  ensure(dx_rows_, kind, size_t(T) * H * sizeof(float));
  VocabLossResult res = loss_->forward(batch, loss_ctx_, 1.0, dx_rows_.as<float>());
  loss_->backward(batch, loss_ctx_, 1.0, dx_rows_.as<float>());
  r.sums.add(res.sums);
  r.metrics.add(res.metrics);
  for (float w : rows.weight) r.positions += w > 0;

  const size_t out_elems = anchors.size() * size_t(B) * H;
  ensure(d_out_, kind, out_elems * sizeof(float));
  be.zero(exec_, d_out_.data(), out_elems * sizeof(float));  // unscored rows (the anchors' own) get no gradient
  be.scatter_rows(exec_, d_out_.as<float>(), dx_rows_.as<float>(), out_idx, T, H);
  drafter_backward(c, w_views_, in, acts_, d_out_.as<float>(), g_views_, rt);
}

StepResult DrafterStep::run(int64_t step, const std::function<FeaturePacket(int, double*)>& next_packet,
                            bool stop_signal, StepCapture* capture) {
  kernels::Backend<float>& be = *backend_;
  StepResult r;
  r.step = step;
  r.metrics.correct.assign(plan_.drafter.block_size, 0);
  r.metrics.scored.assign(plan_.drafter.block_size, 0);
  const size_t P = grads_.flat.size();
  be.zero(exec_, g_dev_.as<float>(), P * sizeof(float));
  for (int m = 0; m < cfg_.optim.micro_batches; ++m) {
    FeaturePacket packet = next_packet(m, &r.wait_seconds);
    Timer t;
    micro_batch(step, m, packet, r, capture);
    be.synchronize(exec_);
    r.compute_seconds += t.seconds();
  }

  // one all-reduce for the gradients, one for the step's sums and counts (in double); host-staged until the
  // NCCL data plane exists
  Timer t;
  g_dev_.download(be, exec_);
  dp_.allreduce_sum(grads_.flat.data(), P);
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
  // normalise by the global Σw (identical on every rank: the same float multiply of the same reduced sums)
  const float inv_w = float(1.0 / r.sums.weight);
  for (float& g : grads_.flat) g *= inv_w;
  if (capture) capture->grads = grads_.flat;
  g_dev_.upload(be, exec_);
  r.grad_norm = clip_global_norm(be, exec_, g_dev_.as<float>(), P, cfg_.optim.grad_clip);
  adam_.step += 1;
  adamw_update(be, exec_, w_dev_.as<float>(), g_dev_.as<float>(), m_dev_.as<float>(), v_dev_.as<float>(),
               decay_dev_.as<uint8_t>(), P, adam_.step, adam_settings_, r.lr);
  be.synchronize(exec_);
  return r;
}

uint64_t DrafterStep::weights_hash() {
  const DrafterParams<float>& w = params();
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(w.flat.data());
  for (size_t i = 0; i < w.flat.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace dflash::train
