#include "lib/model/vocab_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "kernels/math/dpace.h"
#include "lib/core/error.h"

namespace dflash::model {

void VocabLossSums::add(const VocabLossSums& o) {
  loss += o.loss;
  ce += o.ce;
  kl += o.kl;
  cap += o.cap;
  tv += o.tv;
  lk += o.lk;
  nla += o.nla;
  weight += o.weight;
  dpace += o.dpace;
}

void VocabLossMetrics::add(const VocabLossMetrics& o) {
  if (correct.size() < o.correct.size()) correct.resize(o.correct.size(), 0);
  if (scored.size() < o.scored.size()) scored.resize(o.scored.size(), 0);
  for (size_t k = 0; k < o.correct.size(); ++k) correct[k] += o.correct[k];
  for (size_t k = 0; k < o.scored.size(); ++k) scored[k] += o.scored[k];
  topk_hits += o.topk_hits;
  accepted_sum += o.accepted_sum;
  blocks += o.blocks;
}

namespace {

// Accepted length of each block from its rows in order, across chunk boundaries: 1 + the leading run of
// scored, correct rows at k = 1, 2, … (exact greedy acceptance under teacher forcing).
struct BlockRuns {
  bool open = false;
  int32_t id = 0;
  int last_k = 0;
  int run = 0;
  bool alive = true;
  bool any_scored = false;
  std::unordered_set<int32_t> finished;

  void finish(VocabLossMetrics& m) {
    if (open && any_scored) {
      m.blocks += 1;
      m.accepted_sum += 1 + run;
    }
    if (open) finished.insert(id);
    open = false;
  }
  void add_row(int r, int32_t block, int k, bool scored, bool correct, VocabLossMetrics& m) {
    if (!open || block != id) {
      finish(m);
      DFLASH_CHECK(!finished.count(block),
                   "vocab loss: row {} belongs to block {} whose rows were not contiguous (block {} appeared "
                   "earlier); put each block's rows together, ordered by block position k",
                   r, block, block);
      open = true;
      id = block;
      last_k = 0;
      run = 0;
      alive = true;
      any_scored = false;
    } else {
      DFLASH_CHECK(k > last_k,
                   "vocab loss: row {} has block position k={} after k={} in block {}; a block's rows must be "
                   "ordered by increasing k",
                   r, k, last_k, block);
    }
    if (alive && k == run + 1 && scored && correct)
      ++run;
    else
      alive = false;
    last_k = k;
    any_scored = any_scored || scored;
  }
};

}  // namespace

template <typename T>
VocabLoss<T>::VocabLoss(const VocabLossSettings& settings, kernels::Backend<T>& backend, ExecContext& ctx,
                        const T* head, int vocab, int hidden)
    : settings_(settings), be_(backend), ec_(ctx), head_(head), vocab_(vocab), hidden_(hidden) {
  DFLASH_CHECK(vocab >= 1 && hidden >= 1, "vocab loss: vocab ({}) and hidden ({}) must be positive", vocab, hidden);
  DFLASH_CHECK(head != nullptr, "vocab loss: lm_head weight is null");
  DFLASH_CHECK(settings.chunk_size >= 1, "vocab loss: chunk_size must be ≥ 1 (got {})", settings.chunk_size);
  DFLASH_CHECK(settings.kl_temperature > 0 && std::isfinite(settings.kl_temperature),
               "vocab loss: kl_temperature must be > 0 (got {})", settings.kl_temperature);
  DFLASH_CHECK(settings.top_k >= 0, "vocab loss: top_k must be ≥ 0 (got {})", settings.top_k);
  DFLASH_CHECK(settings.block_size >= 2, "vocab loss: block_size must be ≥ 2 (got {})", settings.block_size);
  DFLASH_CHECK(std::isfinite(settings.ce_weight) && std::isfinite(settings.kl_weight) &&
                   std::isfinite(settings.cap_weight),
               "vocab loss: ce_weight, kl_weight and cap_weight must be finite (got {}, {}, {})",
               settings.ce_weight, settings.kl_weight, settings.cap_weight);
  DFLASH_CHECK(std::isfinite(settings.tv_weight) && std::isfinite(settings.lk_weight) &&
                   std::isfinite(settings.nla_weight),
               "vocab loss: tv_weight, lk_weight and nla_weight must be finite (got {}, {}, {})", settings.tv_weight,
               settings.lk_weight, settings.nla_weight);
  DFLASH_CHECK(std::isfinite(settings.lk_eta) && settings.lk_eta >= 0, "vocab loss: lk_eta must be ≥ 0 (got {})",
               settings.lk_eta);
  DFLASH_CHECK(!settings.uses_overlap() || settings.kl_temperature == 1.0,
               "vocab loss: tv_weight, lk_weight and nla_weight are defined on the untempered distributions, but "
               "kl_temperature is {}; set kl_temperature to 1 or turn those terms off",
               settings.kl_temperature);
  DFLASH_CHECK(settings.dpace_alpha > 0 && settings.dpace_alpha <= 1,
               "vocab loss: dpace_alpha must be in (0, 1] (got {}); 0 lets the cumulative confidence collapse",
               settings.dpace_alpha);
}

template <typename T>
kernels::VocabLossCoeffs VocabLoss<T>::coeffs() const {
  kernels::VocabLossCoeffs k;
  k.ce = settings_.ce_weight;
  k.kl = settings_.kl_weight;
  k.cap = settings_.cap_weight;
  k.tau = settings_.kl_temperature;
  k.tv = settings_.tv_weight;
  k.lk = settings_.lk_weight;
  k.lk_eta = settings_.lk_eta;
  k.nla = settings_.nla_weight;
  return k;
}

template <typename T>
int VocabLoss<T>::chunk_rows(const VocabLossBatch<T>& b, int r0, int C) const {
  if (settings_.position_weight == PositionWeight::decay) return std::min(C, b.rows - r0);
  // D-PACE: a row's factor needs every row of its block, so chunks end at block ends.
  const int max_block = settings_.block_size - 1;
  int end = r0;
  while (end < b.rows) {
    int e = end + 1;
    while (e < b.rows && b.block_id[e] == b.block_id[end]) ++e;
    DFLASH_CHECK(e - end <= max_block,
                 "vocab loss: rows {}..{} all belong to block {}: more than B − 1 = {} rows; a block holds each "
                 "position k = 1..B−1 at most once",
                 end, e - 1, b.block_id[end], max_block);
    if (end > r0 && e - r0 > C) break;
    end = e;
    if (end - r0 >= C) break;
  }
  return end - r0;
}

template <typename T>
VocabLoss<T>::VocabLoss(const VocabLossSettings& settings, const T* head, int vocab, int hidden)
    : VocabLoss(settings, kernels::cpu_backend<T>(), kernels::host_exec_context(), head, vocab, hidden) {}

template <typename T>
size_t VocabLoss<T>::scratch_bytes() const {
  return z_.bytes() + u_.bytes() + labels_.bytes() + weights_.bytes() + values_.bytes() +
         values_host_.capacity() * sizeof(kernels::VocabLossRowValues) + factor_.capacity() * sizeof(double) +
         w_host_.capacity() * sizeof(A);
}

template <typename T>
void VocabLoss<T>::reserve(int n, bool with_target) {
  const MemoryKind kind = be_.memory();
  if (n > capacity_rows_) {
    z_ = Buffer(kind, size_t(n) * vocab_ * sizeof(T));
    labels_ = Buffer(kind, size_t(n) * sizeof(int32_t));
    weights_ = Buffer(kind, size_t(n) * sizeof(A));
    values_ = Buffer(kind, size_t(n) * sizeof(kernels::VocabLossRowValues));
    values_host_.resize(size_t(n));
    factor_.assign(size_t(n), 1.0);
    if (settings_.position_weight != PositionWeight::decay) w_host_.resize(size_t(n));
    if (u_.bytes()) u_ = Buffer(kind, size_t(n) * vocab_ * sizeof(T));
    capacity_rows_ = n;
  }
  if (with_target && !u_.bytes()) u_ = Buffer(kind, size_t(capacity_rows_) * vocab_ * sizeof(T));
}

template <typename T>
void VocabLoss<T>::check_batch(const VocabLossBatch<T>& b) const {
  DFLASH_CHECK(b.rows >= 0, "vocab loss: rows must be ≥ 0 (got {})", b.rows);
  if (b.rows == 0) return;
  DFLASH_CHECK(b.hidden && b.labels && b.weights && b.block_pos && b.block_id,
               "vocab loss: hidden, labels, weights, block_pos and block_id must all be given for {} rows", b.rows);
  DFLASH_CHECK(!settings_.uses_target() || b.target_hidden,
               "vocab loss: kl_weight = {}, tv_weight = {}, lk_weight = {}, nla_weight = {}: these need the target "
               "final hidden (target_hidden is null)",
               settings_.kl_weight, settings_.tv_weight, settings_.lk_weight, settings_.nla_weight);
  for (int r = 0; r < b.rows; ++r) {
    DFLASH_CHECK(b.labels[r] >= 0 && b.labels[r] < vocab_,
                 "vocab loss: row {} has label {} outside the vocabulary [0, {}); check the dataset's tokens against "
                 "the target's vocab_size",
                 r, b.labels[r], vocab_);
    DFLASH_CHECK(b.block_pos[r] >= 1 && b.block_pos[r] < settings_.block_size,
                 "vocab loss: row {} has block position k={} outside 1..{} (block_size {})", r, b.block_pos[r],
                 settings_.block_size - 1, settings_.block_size);
    const double w = double(b.weights[r]);
    DFLASH_CHECK(std::isfinite(w) && w >= 0, "vocab loss: row {} has weight {}; weights must be finite and ≥ 0", r,
                 w);
  }
}

template <typename T>
void VocabLoss<T>::chunk_logits(const VocabLossBatch<T>& b, int r0, int n, bool with_target, const A* w) {
  be_.upload(ec_, labels_.data(), b.labels + r0, sizeof(int32_t) * n);
  be_.upload(ec_, weights_.data(), w, sizeof(A) * n);
  be_.gemm(ec_, false, true, n, vocab_, hidden_, 1.0, b.hidden + size_t(r0) * hidden_, hidden_, head_, hidden_, 0.0,
           z_.as<T>(), vocab_);
  if (with_target)
    be_.gemm(ec_, false, true, n, vocab_, hidden_, 1.0, b.target_hidden + size_t(r0) * hidden_, hidden_, head_,
             hidden_, 0.0, u_.as<T>(), vocab_);
}

template <typename T>
void VocabLoss<T>::chunk_grad(const VocabLossBatch<T>& b, const VocabLossContext& ctx, int r0, int n,
                              double grad_scale, T* dX) {
  const T* u = settings_.uses_target() ? u_.as<T>() : nullptr;
  be_.vocab_loss_row_grad(ec_, z_.as<T>(), u, n, vocab_, labels_.as<int32_t>(), weights_.as<A>(),
                          ctx.rows.as<VocabLossRow>() + r0, grad_scale, coeffs());
  // dX rows (=) dz W: [n, V] · [V, H]
  be_.gemm(ec_, false, false, n, hidden_, vocab_, 1.0, z_.as<T>(), vocab_, head_, hidden_, 0.0,
           dX + size_t(r0) * hidden_, hidden_);
}

template <typename T>
void VocabLoss<T>::dpace_chunk(const VocabLossBatch<T>& b, int r0, int n, VocabLossContext& ctx) {
  const PositionWeight pw = settings_.position_weight;
  const kernels::math::DpaceFactor which =
      pw == PositionWeight::dpace                         ? kernels::math::DpaceFactor::dpace
      : pw == PositionWeight::dpace_cumulative_confidence ? kernels::math::DpaceFactor::cumulative_confidence
                                                          : kernels::math::DpaceFactor::continuation_value;
  std::vector<double> q(static_cast<size_t>(n));
  std::vector<uint8_t> valid(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    valid[size_t(i)] = b.weights[r0 + i] > 0;
    // the confidence p_y = exp(−CE), formed as the sources form it, from the row's CE in double
    q[size_t(i)] = valid[size_t(i)] ? std::exp(-values_host_[size_t(i)].ce) : 0.0;
  }
  for (int i0 = 0; i0 < n;) {  // one block at a time (chunk_rows cut the chunk at block ends)
    int i1 = i0 + 1;
    while (i1 < n && b.block_id[r0 + i1] == b.block_id[r0 + i0]) ++i1;
    kernels::math::dpace_block_factors(q.data() + i0, valid.data() + i0, i1 - i0, settings_.dpace_alpha, which,
                                       factor_.data() + i0);
    i0 = i1;
  }
  for (int i = 0; i < n; ++i) {
    const double w = double(b.weights[r0 + i]) * factor_[size_t(i)];
    ctx.row_weight[size_t(r0 + i)] = w;
    w_host_[size_t(i)] = A(w);
  }
  be_.upload(ec_, weights_.data(), w_host_.data(), sizeof(A) * n);
}

template <typename T>
VocabLossResult VocabLoss<T>::forward(const VocabLossBatch<T>& b, VocabLossContext& ctx, double grad_scale, T* dX) {
  check_batch(b);
  const bool fused = settings_.mode == VocabLossMode::fused;
  DFLASH_CHECK(!fused || b.rows == 0 || dX, "vocab loss: fused mode needs dX in forward (got null)");
  DFLASH_CHECK(std::isfinite(grad_scale), "vocab loss: grad_scale must be finite (got {})", grad_scale);
  const int H = hidden_, B = settings_.block_size;
  const bool target = b.target_hidden != nullptr;
  const bool pace = settings_.position_weight != PositionWeight::decay;
  const kernels::VocabLossCoeffs kc = coeffs();

  const size_t rows_bytes = size_t(b.rows) * sizeof(VocabLossRow);
  if (ctx.rows.bytes() < rows_bytes || ctx.rows.kind() != be_.memory()) ctx.rows = Buffer(be_.memory(), rows_bytes);
  ctx.n_rows = b.rows;
  ctx.mode = settings_.mode;
  ctx.fused_grad_scale = grad_scale;
  ctx.has_forward = true;
  ctx.row_weight.assign(pace ? size_t(b.rows) : 0, 0.0);

  VocabLossResult out;
  out.metrics.correct.assign(size_t(B), 0);
  out.metrics.scored.assign(size_t(B), 0);
  BlockRuns runs;

  const int C = std::min(settings_.chunk_size, std::max(b.rows, 1));
  // under D-PACE a chunk is whole blocks: up to max(C, B − 1) rows
  reserve(pace ? std::min(std::max(C, B - 1), std::max(b.rows, 1)) : C, target);
  for (int r0 = 0, n = 0; r0 < b.rows; r0 += n) {
    n = chunk_rows(b, r0, C);
    bool any_weight = false;
    for (int i = 0; i < n; ++i) any_weight = any_weight || b.weights[r0 + i] > 0;
    std::fill(values_host_.begin(), values_host_.begin() + n, kernels::VocabLossRowValues{});
    std::fill(factor_.begin(), factor_.begin() + n, 1.0);
    if (any_weight) {  // a fully masked chunk costs nothing and contributes exactly 0
      chunk_logits(b, r0, n, target, b.weights + r0);
      be_.vocab_loss_row_stats(ec_, z_.as<T>(), target ? u_.as<T>() : nullptr, n, vocab_, labels_.as<int32_t>(),
                               weights_.as<A>(), kc, settings_.top_k, ctx.rows.as<VocabLossRow>() + r0,
                               values_.as<kernels::VocabLossRowValues>());
      be_.download(ec_, values_host_.data(), values_.data(), sizeof(kernels::VocabLossRowValues) * n);
      be_.synchronize(ec_);
      for (int i = 0; i < n; ++i)
        DFLASH_CHECK(values_host_[i].finite,
                     "vocab loss: row {} has non-finite logits (NaN or Inf in the hidden state or lm_head)", r0 + i);
      // D-PACE: the chunk holds whole blocks, so every factor is known now, before any gradient is formed
      if (pace) dpace_chunk(b, r0, n, ctx);
      if (fused) {
        if (grad_scale != 0)
          chunk_grad(b, ctx, r0, n, grad_scale, dX);
        else
          be_.zero(ec_, dX + size_t(r0) * H, sizeof(T) * size_t(n) * H);
      }
    } else if (fused) {
      be_.zero(ec_, dX + size_t(r0) * H, sizeof(T) * size_t(n) * H);
    }
    // Sums and metrics in row order: deterministic whatever the thread count or chunk size.
    for (int i = 0; i < n; ++i) {
      const int r = r0 + i;
      const double w = double(b.weights[r]);
      const bool scored = w > 0;
      const int k = b.block_pos[r];
      const kernels::VocabLossRowValues& v = values_host_[i];
      if (scored) {
        const double wd = w * factor_[size_t(i)];
        out.sums.weight += w;
        out.sums.dpace += wd;
        out.sums.ce += w * v.ce;
        out.sums.kl += w * v.kl;
        out.sums.cap += w * v.cap;
        out.sums.tv += w * v.tv;
        out.sums.lk += w * v.lk;
        out.sums.nla += w * v.nla;
        out.sums.loss +=
            wd * (kc.ce * v.ce + kc.kl * v.kl + kc.cap * v.cap + kc.tv * v.tv + kc.lk * v.lk + kc.nla * v.nla);
        out.metrics.scored[size_t(k)] += 1;
        out.metrics.correct[size_t(k)] += v.correct;
        out.metrics.topk_hits += v.topk;
      }
      runs.add_row(r, b.block_id[r], k, scored, v.correct, out.metrics);
    }
  }
  runs.finish(out.metrics);
  return out;
}

template <typename T>
void VocabLoss<T>::backward(const VocabLossBatch<T>& b, const VocabLossContext& ctx, double grad_scale, T* dX) {
  DFLASH_CHECK(ctx.has_forward && ctx.n_rows == b.rows,
               "vocab loss: backward needs the context of a forward over the same {} rows (context has {})", b.rows,
               ctx.n_rows);
  DFLASH_CHECK(ctx.mode == settings_.mode, "vocab loss: the context was made in another mode");
  DFLASH_CHECK(std::isfinite(grad_scale), "vocab loss: grad_scale must be finite (got {})", grad_scale);
  if (b.rows == 0) return;
  DFLASH_CHECK(dX, "vocab loss: backward needs dX (got null)");
  const size_t n_all = size_t(b.rows) * hidden_;
  if (settings_.mode == VocabLossMode::fused) {
    // The upstream gradient of the scalar was known in forward; only a changed scale remains to apply.
    if (grad_scale == ctx.fused_grad_scale) return;
    if (grad_scale == 0) {
      be_.zero(ec_, dX, sizeof(T) * n_all);
      return;
    }
    DFLASH_CHECK(ctx.fused_grad_scale != 0,
                 "vocab loss: fused forward ran with grad_scale 0, so backward cannot rescale dX to {}; pass the "
                 "final grad_scale to forward",
                 grad_scale);
    be_.scale(ec_, dX, grad_scale / ctx.fused_grad_scale, n_all);
    return;
  }
  const bool target = settings_.uses_target();
  DFLASH_CHECK(!target || b.target_hidden,
               "vocab loss: kl_weight = {}, tv_weight = {}, lk_weight = {}, nla_weight = {}: these need the target "
               "final hidden in backward too",
               settings_.kl_weight, settings_.tv_weight, settings_.lk_weight, settings_.nla_weight);
  const bool pace = settings_.position_weight != PositionWeight::decay;
  DFLASH_CHECK(!pace || ctx.row_weight.size() == size_t(b.rows),
               "vocab loss: the context holds {} D-PACE row weights for {} rows (made with another position_weight?)",
               ctx.row_weight.size(), b.rows);
  // the D-PACE weights w · d are in the context: backward needs no block alignment
  const int C = std::min(settings_.chunk_size, b.rows);
  reserve(C, target);
  if (pace && w_host_.size() < size_t(C)) w_host_.resize(size_t(C));
  for (int r0 = 0; r0 < b.rows; r0 += C) {
    const int n = std::min(C, b.rows - r0);
    bool any_weight = false;
    for (int i = 0; i < n; ++i) any_weight = any_weight || b.weights[r0 + i] > 0;
    if (!any_weight || grad_scale == 0) {
      be_.zero(ec_, dX + size_t(r0) * hidden_, sizeof(T) * size_t(n) * hidden_);
      continue;
    }
    const A* w = b.weights + r0;
    if (pace) {
      for (int i = 0; i < n; ++i) w_host_[size_t(i)] = A(ctx.row_weight[size_t(r0 + i)]);
      w = w_host_.data();
    }
    chunk_logits(b, r0, n, target, w);
    chunk_grad(b, ctx, r0, n, grad_scale, dX);
  }
}

template class VocabLoss<float>;
template class VocabLoss<double>;

// bf16 activations on the CUDA backend: every member but the host-CPU convenience constructor
template VocabLoss<kernels::bf16>::VocabLoss(const VocabLossSettings&, kernels::Backend<kernels::bf16>&, ExecContext&,
                                             const kernels::bf16*, int, int);
template VocabLossResult VocabLoss<kernels::bf16>::forward(const VocabLossBatch<kernels::bf16>&, VocabLossContext&,
                                                           double, kernels::bf16*);
template void VocabLoss<kernels::bf16>::backward(const VocabLossBatch<kernels::bf16>&, const VocabLossContext&, double,
                                                 kernels::bf16*);
template size_t VocabLoss<kernels::bf16>::scratch_bytes() const;

}  // namespace dflash::model
