// The row loops (vocab_loss_row.h) must vectorise: GCC will not if-convert the selects inside loss_exp while FP
// operations may trap (its default), so this translation unit says they do not. No code here relies on FP traps.
#pragma GCC optimize("no-trapping-math")
#include "lib/model/vocab_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "kernels/cpu/gemm.h"
#include "lib/core/error.h"
#include "lib/model/vocab_loss_row.h"

namespace dflash {

void VocabLossSums::add(const VocabLossSums& o) {
  loss += o.loss;
  ce += o.ce;
  kl += o.kl;
  cap += o.cap;
  weight += o.weight;
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
VocabLoss<T>::VocabLoss(const VocabLossSettings& settings, const T* head, int vocab, int hidden)
    : settings_(settings), head_(head), vocab_(vocab), hidden_(hidden) {
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
}

template <typename T>
size_t VocabLoss<T>::scratch_bytes() const {
  return (z_.capacity() + u_.capacity()) * sizeof(T) + (ce_.capacity() + kl_.capacity() + cap_.capacity()) * 8 +
         correct_.capacity() + topk_.capacity();
}

template <typename T>
bool VocabLoss<T>::use_target(const VocabLossBatch<T>& batch) const {
  return batch.target_hidden != nullptr;
}

template <typename T>
void VocabLoss<T>::check_batch(const VocabLossBatch<T>& b) const {
  DFLASH_CHECK(b.rows >= 0, "vocab loss: rows must be ≥ 0 (got {})", b.rows);
  if (b.rows == 0) return;
  DFLASH_CHECK(b.hidden && b.labels && b.weights && b.block_pos && b.block_id,
               "vocab loss: hidden, labels, weights, block_pos and block_id must all be given for {} rows", b.rows);
  DFLASH_CHECK(settings_.kl_weight == 0 || b.target_hidden,
               "vocab loss: kl_weight = {} needs the target final hidden (target_hidden is null)", settings_.kl_weight);
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
void VocabLoss<T>::chunk_logits(const VocabLossBatch<T>& b, int r0, int n, bool with_target) {
  const size_t need = size_t(n) * vocab_;
  if (z_.size() < need) z_.resize(need);
  cpu::gemm<T>(false, true, n, vocab_, hidden_, T(1), b.hidden + size_t(r0) * hidden_, hidden_, head_, hidden_, T(0),
               z_.data(), vocab_);
  if (with_target) {
    if (u_.size() < need) u_.resize(need);
    cpu::gemm<T>(false, true, n, vocab_, hidden_, T(1), b.target_hidden + size_t(r0) * hidden_, hidden_, head_,
                 hidden_, T(0), u_.data(), vocab_);
  }
}

template <typename T>
void VocabLoss<T>::chunk_grad(const VocabLossBatch<T>& b, const VocabLossContext& ctx, int r0, int n,
                              double grad_scale, T* dX) {
  const bool kl = settings_.kl_weight != 0;
  const int V = vocab_;
  const RowGradCoeffs coeffs{settings_.ce_weight, settings_.kl_weight, settings_.cap_weight,
                             settings_.kl_temperature};
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) {
    const int r = r0 + i;
    T* z = z_.data() + size_t(i) * V;
    const T* u = kl ? u_.data() + size_t(i) * V : nullptr;
    row_grad<T>(z, u, V, b.labels[r], ctx.rows[r], grad_scale * double(b.weights[r]), coeffs);
  }
  // dX rows (=) dz W: [n, V] · [V, H]
  cpu::gemm<T>(false, false, n, hidden_, V, T(1), z_.data(), V, head_, hidden_, T(0), dX + size_t(r0) * hidden_,
               hidden_);
}

template <typename T>
VocabLossResult VocabLoss<T>::forward(const VocabLossBatch<T>& b, VocabLossContext& ctx, double grad_scale, T* dX) {
  check_batch(b);
  const bool fused = settings_.mode == VocabLossMode::fused;
  DFLASH_CHECK(!fused || b.rows == 0 || dX, "vocab loss: fused mode needs dX in forward (got null)");
  DFLASH_CHECK(std::isfinite(grad_scale), "vocab loss: grad_scale must be finite (got {})", grad_scale);
  const int V = vocab_, H = hidden_, B = settings_.block_size;
  const bool target = use_target(b);
  const double tau = settings_.kl_temperature;

  ctx.rows.assign(size_t(b.rows), VocabLossRow{});
  ctx.mode = settings_.mode;
  ctx.fused_grad_scale = grad_scale;
  ctx.has_forward = true;

  VocabLossResult out;
  out.metrics.correct.assign(size_t(B), 0);
  out.metrics.scored.assign(size_t(B), 0);
  BlockRuns runs;

  const int C = std::min(settings_.chunk_size, std::max(b.rows, 1));
  ce_.resize(size_t(C));
  kl_.resize(size_t(C));
  cap_.resize(size_t(C));
  correct_.resize(size_t(C));
  topk_.resize(size_t(C));

  for (int r0 = 0; r0 < b.rows; r0 += C) {
    const int n = std::min(C, b.rows - r0);
    bool any_weight = false;
    for (int i = 0; i < n; ++i) any_weight = any_weight || b.weights[r0 + i] > 0;
    std::fill(ce_.begin(), ce_.begin() + n, 0.0);
    std::fill(kl_.begin(), kl_.begin() + n, 0.0);
    std::fill(cap_.begin(), cap_.begin() + n, 0.0);
    std::fill(correct_.begin(), correct_.begin() + n, 0);
    std::fill(topk_.begin(), topk_.begin() + n, 0);
    if (any_weight) {  // a fully masked chunk costs nothing and contributes exactly 0
      chunk_logits(b, r0, n, target);
      std::vector<uint8_t> finite(size_t(n), 1);
#pragma omp parallel for schedule(static)
      for (int i = 0; i < n; ++i) {
        const int r = r0 + i;
        if (!(b.weights[r] > 0)) continue;
        RowValues v;
        row_stats<T>(z_.data() + size_t(i) * V, target ? u_.data() + size_t(i) * V : nullptr, V, b.labels[r], tau,
                     settings_.top_k, ctx.rows[r], v);
        ce_[i] = v.ce;
        kl_[i] = v.kl;
        cap_[i] = v.cap;
        correct_[i] = v.correct;
        topk_[i] = v.topk;
        finite[i] = v.finite;
      }
      for (int i = 0; i < n; ++i)
        DFLASH_CHECK(finite[i], "vocab loss: row {} has non-finite logits (NaN or Inf in the hidden state or lm_head)",
                     r0 + i);
      if (fused) {
        if (grad_scale != 0)
          chunk_grad(b, ctx, r0, n, grad_scale, dX);
        else
          std::fill(dX + size_t(r0) * H, dX + size_t(r0 + n) * H, T(0));
      }
    } else if (fused) {
      std::fill(dX + size_t(r0) * H, dX + size_t(r0 + n) * H, T(0));
    }
    // Sums and metrics in row order: deterministic whatever the thread count or chunk size.
    for (int i = 0; i < n; ++i) {
      const int r = r0 + i;
      const double w = double(b.weights[r]);
      const bool scored = w > 0;
      const int k = b.block_pos[r];
      if (scored) {
        out.sums.weight += w;
        out.sums.ce += w * ce_[i];
        out.sums.kl += w * kl_[i];
        out.sums.cap += w * cap_[i];
        out.sums.loss += w * (settings_.ce_weight * ce_[i] + settings_.kl_weight * kl_[i] +
                              settings_.cap_weight * cap_[i]);
        out.metrics.scored[size_t(k)] += 1;
        out.metrics.correct[size_t(k)] += correct_[i];
        out.metrics.topk_hits += topk_[i];
      }
      runs.add_row(r, b.block_id[r], k, scored, correct_[i], out.metrics);
    }
  }
  runs.finish(out.metrics);
  return out;
}

template <typename T>
void VocabLoss<T>::backward(const VocabLossBatch<T>& b, const VocabLossContext& ctx, double grad_scale, T* dX) {
  DFLASH_CHECK(ctx.has_forward && ctx.rows.size() == size_t(b.rows),
               "vocab loss: backward needs the context of a forward over the same {} rows (context has {})", b.rows,
               ctx.rows.size());
  DFLASH_CHECK(ctx.mode == settings_.mode, "vocab loss: the context was made in another mode");
  DFLASH_CHECK(std::isfinite(grad_scale), "vocab loss: grad_scale must be finite (got {})", grad_scale);
  if (b.rows == 0) return;
  DFLASH_CHECK(dX, "vocab loss: backward needs dX (got null)");
  const size_t n_all = size_t(b.rows) * hidden_;
  if (settings_.mode == VocabLossMode::fused) {
    // The upstream gradient of the scalar was known in forward; only a changed scale remains to apply.
    if (grad_scale == ctx.fused_grad_scale) return;
    if (grad_scale == 0) {
      std::fill(dX, dX + n_all, T(0));
      return;
    }
    DFLASH_CHECK(ctx.fused_grad_scale != 0,
                 "vocab loss: fused forward ran with grad_scale 0, so backward cannot rescale dX to {}; pass the "
                 "final grad_scale to forward",
                 grad_scale);
    const T ratio = T(grad_scale / ctx.fused_grad_scale);
    for (size_t i = 0; i < n_all; ++i) dX[i] *= ratio;
    return;
  }
  DFLASH_CHECK(settings_.kl_weight == 0 || b.target_hidden,
               "vocab loss: kl_weight = {} needs the target final hidden in backward too", settings_.kl_weight);
  const int C = std::min(settings_.chunk_size, b.rows);
  for (int r0 = 0; r0 < b.rows; r0 += C) {
    const int n = std::min(C, b.rows - r0);
    bool any_weight = false;
    for (int i = 0; i < n; ++i) any_weight = any_weight || b.weights[r0 + i] > 0;
    if (!any_weight || grad_scale == 0) {
      std::fill(dX + size_t(r0) * hidden_, dX + size_t(r0 + n) * hidden_, T(0));
      continue;
    }
    chunk_logits(b, r0, n, settings_.kl_weight != 0);
    chunk_grad(b, ctx, r0, n, grad_scale, dX);
  }
}

template class VocabLoss<float>;
template class VocabLoss<double>;

}  // namespace dflash
