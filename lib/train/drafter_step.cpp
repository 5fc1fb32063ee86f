#include "lib/train/drafter_step.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include <unistd.h>

#include "lib/core/error.h"
#include "lib/core/named_enum.h"
#include "lib/core/timer.h"
#include "lib/train/anchors.h"

namespace dflash::train {

namespace {

// Grows buf (in the backend's memory) to at least `bytes`; contents are not kept.
void ensure(Buffer& buf, MemoryKind kind, size_t bytes) {
  if (buf.bytes() < bytes) buf = Buffer(kind, bytes);
}

// An fp32 array the step's kernels read or write: in the backend's memory, or the host array itself when the
// backend is the CPU (no copy).
class BackendArray {
 public:
  template <typename B>
  void bind(B& be, void* host, size_t bytes) {  // device: allocates; host: aliases
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
  template <typename B>
  void upload(B& be, ExecContext& ec) const {  // host → backend (no-op when aliased)
    if (ptr_ != host_ && bytes_) be.upload(ec, ptr_, host_, bytes_);
  }
  bool on_device() const { return ptr_ != host_; }  // false when aliasing host memory (the CPU backend)
  template <typename B>
  void download(B& be, ExecContext& ec) const {  // backend → host (no-op when aliased)
    if (ptr_ != host_ && bytes_) {
      be.download(ec, host_, ptr_, bytes_);
      be.synchronize(ec);
    }
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* host_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Buffer owned_;  // device memory; empty when aliasing host memory
};

template <typename T>
std::unique_ptr<kernels::Backend<T>> make_backend(const TrainConfig& cfg) {
  return kernels::make_backend<T>(cfg.run.device);
}

}  // namespace

class DrafterStep::Engine {
 public:
  virtual ~Engine() = default;
  virtual StepResult run(int64_t step, const std::function<const FeaturePacket&(int, double*)>& next_packet,
                         bool stop_signal, StepCapture* capture) = 0;
  virtual void set_progress(std::function<void()> progress) = 0;
  virtual StepResult evaluate(const FeaturePacket& packet, const AnchorKey& key) = 0;
  virtual model::DrafterParams<float>& params() = 0;
  virtual model::AdamWState& optimizer() = 0;
  virtual void upload_state() = 0;
  virtual const model::DrafterConfig& config() const = 0;
  virtual std::string backend_name() const = 0;
};

namespace {

// The step in compute type T (float: the CPU or CUDA's fp32 path; bf16: CUDA). Master weights, gradients and
// AdamW state are fp32 whatever T is; with T = float the compute weights are the master weights themselves.
template <typename T>
class EngineT final : public DrafterStep::Engine {
 public:
  EngineT(const TrainConfig& cfg, const RunPlan& plan, const float* embed, const float* lm_head, int dp_rank,
          comm::Transport& dp);
  StepResult run(int64_t step, const std::function<const FeaturePacket&(int, double*)>& next_packet,
                 bool stop_signal, StepCapture* capture) override;
  void set_progress(std::function<void()> progress) override { progress_ = std::move(progress); }
  StepResult evaluate(const FeaturePacket& packet, const AnchorKey& key) override;
  model::DrafterParams<float>& params() override;
  model::AdamWState& optimizer() override;
  void upload_state() override;
  const model::DrafterConfig& config() const override { return plan_.drafter; }
  std::string backend_name() const override {
    return std::string(backend_->name()) + (std::is_same_v<T, float> ? " fp32" : " bf16");
  }

 private:
  static constexpr bool kMasterIsCompute = std::is_same_v<T, float>;
  // backward = false: forward and loss only (held-out eval)
  void micro_batch(const AnchorKey& key, const FeaturePacket& packet, StepResult& r, StepCapture* capture,
                   bool backward = true);
  // The compute weights from the master weights (bf16: a rounding copy; fp32: nothing to do).
  void refresh_compute_weights();
  // An fp32 array in `where` memory as T in the backend's memory: the array itself when it is already there as
  // float, else uploaded and/or converted into `out` (host bf16: through `staging`).
  const T* to_backend(const float* src, MemoryKind where, size_t n, Buffer& out);
  // Waits for the backend's queued work, running progress_ meanwhile (a GPU computes without the host).
  void wait_for_compute();

  const TrainConfig& cfg_;
  const RunPlan& plan_;
  int dp_rank_;
  comm::Transport& dp_;
  std::unique_ptr<kernels::Backend<T>> backend_;
  ExecContext& exec_;
  model::DrafterParams<float> params_, grads_;  // host: master weights; gradients (the all-reduce runs on the host)
  model::AdamWState adam_;
  std::vector<uint8_t> decay_mask_;  // [P] 1 on matrices, 0 on norm weights
  // the same in the backend's memory (fp32), the compute weights (T) and the frozen target tensors (T)
  BackendArray w_dev_, g_dev_, m_dev_, v_dev_, decay_dev_;
  Buffer w_compute_;                       // [P] T: bf16 only (fp32 computes on w_dev_)
  Buffer embed_, head_, staging_;          // [V, H] T (device); staging: fp32 uploads before a conversion
  const T* embed_dev_ = nullptr;           // [V, H]
  const T* head_dev_ = nullptr;            // [V, H]
  model::DrafterWeights<T> w_views_;              // compute weights
  model::DrafterWeights<float> g_views_;          // fp32 gradients
  std::unique_ptr<model::VocabLoss<T>> loss_;
  // reused across micro-batches (backend memory)
  model::DrafterActivations<T> acts_;
  model::VocabLossContext loss_ctx_;
  Buffer taps_, final_hidden_, rows_idx_, x_rows_, y_rows_, dx_rows_, d_out_;
  std::function<void()> progress_;  // set_progress
};

template <typename T>
EngineT<T>::EngineT(const TrainConfig& cfg, const RunPlan& plan, const float* embed, const float* lm_head,
                    int dp_rank, comm::Transport& dp)
    : cfg_(cfg), plan_(plan), dp_rank_(dp_rank), dp_(dp), backend_(make_backend<T>(cfg)),
      exec_(backend_->context()), params_(plan.drafter), grads_(plan.drafter) {
  const model::DrafterConfig& c = plan.drafter;
  // same seed on every rank: identical initial weights without a broadcast
  params_.init_random(uint64_t(cfg.run.seed), cfg.drafter.init_std);
  decay_mask_.assign(params_.flat.size(), 1);
  for (const model::ParamInfo& p : params_.layout)
    if (p.is_norm) std::fill(decay_mask_.begin() + p.offset, decay_mask_.begin() + p.offset + p.numel, 0);
  adam_.m.assign(params_.flat.size(), 0.0f);
  adam_.v.assign(params_.flat.size(), 0.0f);

  kernels::Backend<T>& be = *backend_;
  const size_t P = params_.flat.size(), VH = size_t(c.vocab) * c.hidden;
  g_dev_.bind(be, grads_.flat.data(), P * sizeof(float));
  decay_dev_.bind(be, decay_mask_.data(), P);
  decay_dev_.upload(be, exec_);
  if (!kMasterIsCompute) w_compute_ = Buffer(be.memory(), P * sizeof(T));
  upload_state();
  embed_dev_ = to_backend(embed, MemoryKind::host, VH, embed_);
  head_dev_ = to_backend(lm_head, MemoryKind::host, VH, head_);
  staging_ = Buffer();  // only needed again for packets
  g_views_ = model::DrafterWeights<float>::bind(c, g_dev_.as<float>());
  loss_ = std::make_unique<model::VocabLoss<T>>(plan.loss, be, exec_, head_dev_, c.vocab, c.hidden);
  // the activation arena, sized once for the longest sequence the config admits (without data.max_seq_len, the
  // first sequences grow it: the longest sequence of the data is not known here)
  if (cfg.data.max_seq_len > 0) {
    acts_.reserve(be.memory(), c, cfg.data.max_seq_len, cfg.loss.anchors_per_seq);
    // and micro_batch()'s per-sequence arrays at their largest (anchors_per_seq blocks of B rows, max_seq_len
    // positions): nothing is allocated per step (on a GPU: no cudaMalloc in steady state)
    const size_t S = size_t(cfg.data.max_seq_len), rows = size_t(cfg.loss.anchors_per_seq) * c.block_size;
    const size_t H = size_t(c.hidden);
    const bool with_kl = plan.loss.uses_target();  // KL, TV, LK, NLA read the target's logits
    const MemoryKind kind = be.memory();
    ensure(rows_idx_, kind, 2 * rows * sizeof(int32_t));
    ensure(x_rows_, kind, rows * H * sizeof(T));
    if (with_kl) ensure(y_rows_, kind, rows * H * sizeof(T));
    ensure(dx_rows_, kind, rows * H * sizeof(T));
    ensure(d_out_, kind, rows * H * sizeof(T));
    if constexpr (!std::is_same_v<T, float>) {  // the packet's fp32 arrays converted to T
      ensure(taps_, kind, S * size_t(c.n_taps) * H * sizeof(T));
      if (with_kl) ensure(final_hidden_, kind, S * H * sizeof(T));
    }
  }
}

template <typename T>
const T* EngineT<T>::to_backend(const float* src, MemoryKind where, size_t n, Buffer& out) {
  kernels::Backend<T>& be = *backend_;
  const MemoryKind kind = be.memory();
  DFLASH_CHECK(where == MemoryKind::host || where == kind, "drafter step: an array in {} memory for the {} backend",
               memory_kind_name(where), be.name());
  if constexpr (std::is_same_v<T, float>) {
    if (where == kind) return src;
    ensure(out, kind, n * sizeof(float));
    be.upload(exec_, out.data(), src, n * sizeof(float));
    return out.as<float>();
  } else {
    const float* on_device = src;
    if (where != kind) {
      ensure(staging_, kind, n * sizeof(float));
      be.upload(exec_, staging_.data(), src, n * sizeof(float));
      on_device = staging_.as<float>();
    }
    ensure(out, kind, n * sizeof(T));
    be.convert_from_float(exec_, out.as<T>(), on_device, n);
    return out.as<T>();
  }
}

template <typename T>
void EngineT<T>::wait_for_compute() {
  if (progress_) {
    while (!backend_->idle(exec_)) {
      progress_();
      usleep(50);
    }
  }
  backend_->synchronize(exec_);
}

template <typename T>
void EngineT<T>::refresh_compute_weights() {
  if constexpr (!kMasterIsCompute)
    backend_->convert_from_float(exec_, w_compute_.as<T>(), w_dev_.as<float>(), params_.flat.size());
}

template <typename T>
model::DrafterParams<float>& EngineT<T>::params() {
  w_dev_.download(*backend_, exec_);
  return params_;
}

template <typename T>
model::AdamWState& EngineT<T>::optimizer() {
  m_dev_.download(*backend_, exec_);
  v_dev_.download(*backend_, exec_);
  return adam_;
}

template <typename T>
void EngineT<T>::upload_state() {
  // resume may hand in an optimizer state without moments (a checkpoint of step 0): start them at zero
  if (adam_.m.size() != params_.flat.size()) adam_.m.assign(params_.flat.size(), 0.0f);
  if (adam_.v.size() != params_.flat.size()) adam_.v.assign(params_.flat.size(), 0.0f);
  kernels::Backend<T>& be = *backend_;
  // the host vectors may have been reassigned (resume): rebind the aliases to their current storage
  const size_t P = params_.flat.size() * sizeof(float);
  w_dev_.bind(be, params_.flat.data(), P);
  m_dev_.bind(be, adam_.m.data(), P);
  v_dev_.bind(be, adam_.v.data(), P);
  w_dev_.upload(be, exec_);
  m_dev_.upload(be, exec_);
  v_dev_.upload(be, exec_);
  if constexpr (kMasterIsCompute) {
    w_views_ = model::DrafterWeights<T>::bind(plan_.drafter, w_dev_.as<float>());
  } else {
    w_views_ = model::DrafterWeights<T>::bind(plan_.drafter, w_compute_.as<T>());
    refresh_compute_weights();
  }
}

template <typename T>
void EngineT<T>::micro_batch(const AnchorKey& key, const FeaturePacket& pk, StepResult& r, StepCapture* capture,
                             bool backward) {
  kernels::Backend<T>& be = *backend_;
  const model::DrafterConfig& c = plan_.drafter;
  const int S = pk.header.seq_len, H = c.hidden, B = c.block_size;
  r.tokens += S;
  const std::vector<int> anchors = sample_anchors(pk.loss_mask.data(), S, cfg_.loss.anchors_per_seq, key);
  if (capture)
    capture->inputs.push_back(
        {pk.header.seq_index, pk.tokens, pk.loss_mask, anchors, pk.taps.to_host(), pk.final_hidden.to_host()});
  if (anchors.empty()) return;  // nothing trainable in this sequence
  const ScoredRows rows = scored_rows(pk.tokens.data(), pk.loss_mask.data(), S, anchors, B, plan_.decay_gamma);
  const int T_rows = rows.size();
  const bool with_kl = plan_.loss.uses_target();  // KL, TV, LK, NLA read the target's logits
  const MemoryKind kind = be.memory();

  // the packet's float arrays as T in the backend's memory (the CPU reads the packet itself)
  const T* taps = to_backend(pk.taps.data(), pk.taps.memory(), pk.taps.size(), taps_);
  const T* final_hidden =
      with_kl ? to_backend(pk.final_hidden.data(), pk.final_hidden.memory(), pk.final_hidden.size(), final_hidden_)
              : nullptr;

  model::DrafterInputs<T> in{taps, pk.tokens.data(), S, anchors.data(), int(anchors.size()), embed_dev_};
  const model::DrafterRuntime<T> rt{be, exec_};
  model::drafter_forward(c, w_views_, in, acts_, rt);
  if (progress_) progress_();  // the CPU computed for a while (a GPU: only queued)

  // gather the scored rows: drafter output rows b·B + k, target final hidden at a_b + k − 1
  ensure(rows_idx_, kind, 2 * size_t(T_rows) * sizeof(int32_t));
  int32_t* out_idx = rows_idx_.as<int32_t>();
  int32_t* target_idx = out_idx + T_rows;
  be.upload(exec_, out_idx, rows.out_row.data(), size_t(T_rows) * sizeof(int32_t));
  be.upload(exec_, target_idx, rows.target_pos.data(), size_t(T_rows) * sizeof(int32_t));
  ensure(x_rows_, kind, size_t(T_rows) * H * sizeof(T));
  be.gather_rows(exec_, x_rows_.as<T>(), acts_.out, out_idx, T_rows, H);
  if (with_kl) {
    ensure(y_rows_, kind, size_t(T_rows) * H * sizeof(T));
    be.gather_rows(exec_, y_rows_.as<T>(), final_hidden, target_idx, T_rows, H);
  }
  model::VocabLossBatch<T> batch;
  batch.rows = T_rows;
  batch.hidden = x_rows_.as<T>();
  batch.target_hidden = with_kl ? y_rows_.as<T>() : nullptr;
  batch.labels = rows.label.data();
  batch.weights = rows.weight.data();
  batch.block_pos = rows.block_pos.data();
  batch.block_id = rows.block_id.data();

  // grad_scale 1: gradients stay unnormalised until the global Σw is known after the all-reduce (they are linear
  // in it), so no extra round trip is needed before the first micro-batch.
  ensure(dx_rows_, kind, size_t(T_rows) * H * sizeof(T));
  model::VocabLossResult res = loss_->forward(batch, loss_ctx_, 1.0, dx_rows_.as<T>());
  r.sums.add(res.sums);
  r.metrics.add(res.metrics);
  for (float w : rows.weight) r.positions += w > 0;
  if (progress_) progress_();
  if (!backward) return;
  loss_->backward(batch, loss_ctx_, 1.0, dx_rows_.as<T>());
  if (progress_) progress_();

  const size_t out_elems = anchors.size() * size_t(B) * H;
  ensure(d_out_, kind, out_elems * sizeof(T));
  be.zero(exec_, d_out_.data(), out_elems * sizeof(T));  // unscored rows (the anchors' own) get no gradient
  be.scatter_rows(exec_, d_out_.as<T>(), dx_rows_.as<T>(), out_idx, T_rows, H);
  model::drafter_backward(c, w_views_, in, acts_, d_out_.as<T>(), g_views_, rt);
}

template <typename T>
StepResult EngineT<T>::run(int64_t step, const std::function<const FeaturePacket&(int, double*)>& next_packet,
                           bool stop_signal, StepCapture* capture) {
  kernels::Backend<T>& be = *backend_;
  StepResult r;
  r.step = step;
  r.metrics.correct.assign(plan_.drafter.block_size, 0);
  r.metrics.scored.assign(plan_.drafter.block_size, 0);
  const size_t P = grads_.flat.size();
  be.zero(exec_, g_dev_.as<float>(), P * sizeof(float));
  for (int m = 0; m < cfg_.optim.micro_batches; ++m) {
    const FeaturePacket& packet = next_packet(m, &r.wait_seconds);
    Timer t;
    const AnchorKey key{uint64_t(cfg_.run.seed), step, int64_t(m) * cfg_.layout.drafter_dp + dp_rank_};
    micro_batch(key, packet, r, capture);
    wait_for_compute();  // before the next packet reuses this one's arrays
    r.compute_seconds += t.seconds();
  }

  // one all-reduce for the gradients, one for the step's sums and counts (in double). Gradients in device memory
  // go to a data plane that takes device pointers (NCCL) as they are; otherwise through the host (MPI). The
  // all-reduce runs on the transport's own stream: the backward must be complete first.
  Timer t;
  be.synchronize(exec_);
  if (g_dev_.on_device() && dp_.takes_device_pointers()) {
    dp_.allreduce_sum(g_dev_.as<float>(), P);
  } else {
    g_dev_.download(be, exec_);
    dp_.allreduce_sum(grads_.flat.data(), P);
    g_dev_.upload(be, exec_);
  }
  r.stop_requested = allreduce_step_sums(dp_, r, plan_.drafter.block_size, {stop_signal ? 1.0 : 0.0})[0] > 0;
  r.reduce_seconds = t.seconds();

  r.lr = model::lr_at(step, plan_.total_steps, cfg_.optim.lr, cfg_.optim.warmup_ratio, cfg_.optim.min_lr_ratio);
  auto capture_grads = [&] {
    g_dev_.download(be, exec_);  // waits for the copy
    capture->grads = grads_.flat;
  };
  if (r.sums.weight <= 0) {  // Σw = 0: the loss is 0/0; change nothing rather than step on NaN
    r.skipped = true;
    if (capture) capture_grads();  // all zero: every weight was 0
    return r;
  }
  // normalise by the global Σw (identical on every rank: the same float multiply of the same reduced sums)
  be.scale_master(exec_, g_dev_.as<float>(), double(float(1.0 / r.sums.weight)), P);
  if (capture) capture_grads();
  r.grad_norm = model::clip_global_norm(be, exec_, g_dev_.as<float>(), P, cfg_.optim.grad_clip);
  adam_.step += 1;
  model::adamw_update(be, exec_, w_dev_.as<float>(), g_dev_.as<float>(), m_dev_.as<float>(), v_dev_.as<float>(),
               decay_dev_.as<uint8_t>(), P, adam_.step, cfg_.optim, r.lr);  // optim IS model::AdamWSettings
  refresh_compute_weights();
  be.synchronize(exec_);
  return r;
}

template <typename T>
StepResult EngineT<T>::evaluate(const FeaturePacket& packet, const AnchorKey& key) {
  StepResult r;
  r.step = key.step;
  r.metrics.correct.assign(plan_.drafter.block_size, 0);
  r.metrics.scored.assign(plan_.drafter.block_size, 0);
  Timer t;
  micro_batch(key, packet, r, nullptr, /*backward=*/false);
  wait_for_compute();
  r.compute_seconds = t.seconds();
  return r;
}

std::unique_ptr<DrafterStep::Engine> make_engine(const TrainConfig& cfg, const RunPlan& plan, const float* embed,
                                                 const float* lm_head, int dp_rank, comm::Transport& dp) {
  switch (cfg.run.compute_precision()) {
    case kernels::Precision::bf16:
      return std::make_unique<EngineT<kernels::bf16>>(cfg, plan, embed, lm_head, dp_rank, dp);
    case kernels::Precision::fp32:
      return std::make_unique<EngineT<float>>(cfg, plan, embed, lm_head, dp_rank, dp);
    case kernels::Precision::fp64: break;  // the config never asks for it (a CPU reference for tests)
  }
  DFLASH_FAIL("drafter step: precision {} (run.precision {})", name_of(cfg.run.compute_precision()),
              name_of(cfg.run.precision));
}

}  // namespace

std::vector<double> allreduce_step_sums(comm::Transport& dp, StepResult& r, int B, std::vector<double> extra) {
  std::vector<double> stats = {r.sums.loss, r.sums.ce, r.sums.kl, r.sums.cap, r.sums.weight, double(r.tokens),
                               double(r.positions), double(r.metrics.topk_hits), double(r.metrics.accepted_sum),
                               double(r.metrics.blocks)};
  for (int k = 0; k < B; ++k) stats.push_back(double(r.metrics.correct[k]));
  for (int k = 0; k < B; ++k) stats.push_back(double(r.metrics.scored[k]));
  stats.insert(stats.end(), {r.sums.tv, r.sums.lk, r.sums.nla, r.sums.dpace});
  stats.insert(stats.end(), extra.begin(), extra.end());
  dp.allreduce_sum(stats.data(), stats.size());
  const size_t more = size_t(10 + 2 * B);  // the acceptance-aware sums after the per-position counts
  r.sums = {stats[0], stats[1], stats[2], stats[3], stats[4], stats[more], stats[more + 1], stats[more + 2],
            stats[more + 3]};
  r.tokens = int64_t(stats[5]);
  r.positions = int64_t(stats[6]);
  r.metrics.topk_hits = int64_t(stats[7]);
  r.metrics.accepted_sum = int64_t(stats[8]);
  r.metrics.blocks = int64_t(stats[9]);
  for (int k = 0; k < B; ++k) {
    r.metrics.correct[k] = int64_t(stats[10 + k]);
    r.metrics.scored[k] = int64_t(stats[10 + B + k]);
  }
  return std::vector<double>(stats.end() - std::ptrdiff_t(extra.size()), stats.end());
}

DrafterStep::DrafterStep(const TrainConfig& cfg, const RunPlan& plan, const float* embed, const float* lm_head,
                         int dp_rank, comm::Transport& dp)
    : engine_(make_engine(cfg, plan, embed, lm_head, dp_rank, dp)) {}
DrafterStep::~DrafterStep() = default;

StepResult DrafterStep::run(int64_t step, const std::function<const FeaturePacket&(int, double*)>& next_packet,
                            bool stop_signal, StepCapture* capture) {
  return engine_->run(step, next_packet, stop_signal, capture);
}
void DrafterStep::set_progress(std::function<void()> progress) { engine_->set_progress(std::move(progress)); }
StepResult DrafterStep::evaluate(const FeaturePacket& packet, const AnchorKey& key) {
  return engine_->evaluate(packet, key);
}
model::DrafterParams<float>& DrafterStep::params() { return engine_->params(); }
model::AdamWState& DrafterStep::optimizer() { return engine_->optimizer(); }
void DrafterStep::upload_state() { engine_->upload_state(); }
const model::DrafterConfig& DrafterStep::config() const { return engine_->config(); }
std::string DrafterStep::backend_name() const { return engine_->backend_name(); }



uint64_t DrafterStep::weights_hash() {
  const model::DrafterParams<float>& w = params();
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(w.flat.data());
  for (size_t i = 0; i < w.flat.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace dflash::train
