#pragma once
// The vocabulary loss of the drafter: lm_head + CE + KL + CAP (+ TV, LK-hybrid, NLA; D-PACE position weights),
// chunked over positions so that nothing of size [rows, V] is ever allocated. Math, gradients, schedule and memory
// formula: docs/loss.md.
//
// Per scored row r (label y, drafter logits z = X_r Wᵀ, target logits u = Y_r Wᵀ, p = softmax(z), q = softmax(u)):
//   CE  = −log p_y,   KL = τ² KL(softmax(u/τ) ‖ softmax(z/τ)),   CAP = [m ≠ y] (lse(z) − lse_{v≠m}(z)), m = argmax p
//   TV  = 1 − α,  NLA = −log α,  LK = λ KL + (1 − λ) TV (λ = exp(−η α) fixed),  α = Σ_v min(p_v, q_v)   (τ = 1)
//   forward returns UNNORMALISED sums Σ w d (λ_ce CE + λ_kl KL + λ_cap CAP + λ_tv TV + λ_lk LK + λ_nla NLA), with d
//   the row's D-PACE factor (1 under position_weight = decay); the caller divides by the global Σw through
//   `grad_scale` (= 1 / global Σw, or 0 when it is 0).
//
// The chunk passes (logits GEMMs, the row statistics, d(logits), dX GEMM) run on a kernels::Backend; this file
// only orchestrates them and reduces the per-row values in row order on the host.
//
// Use (same code for both modes and every backend):
//   VocabLoss<float> loss(settings, backend, W, V, H); // owns the O(chunk × V) scratch, reused across calls
//   VocabLossContext ctx;                              // per-row scalars kept from forward to backward
//   auto out = loss.forward(batch, ctx, grad_scale, dX);  // fused: dX (=) written here
//   loss.backward(batch, ctx, grad_scale, dX);            // recompute: dX (=) written here; fused: only rescales
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "lib/core/buffer.h"
#include "lib/model/vocab_loss_settings.h"

namespace dflash::model {

using kernels::VocabLossRow;

// One micro-batch of scored rows. Rows of one block are contiguous, with k increasing (the trainer's layout).
// hidden and target_hidden live in the backend's memory; the per-row bookkeeping arrays are host arrays.
template <typename T>
struct VocabLossBatch {
  int rows = 0;
  const T* hidden = nullptr;         // [rows, H] drafter final hidden X (backend memory)
  const T* target_hidden = nullptr;  // [rows, H] target final hidden at anchor+k-1 (Y); null when KL is unused
  const int32_t* labels = nullptr;   // [rows] the data token at anchor+k, in [0, V)
  const kernels::acc_t<T>* weights = nullptr;  // [rows] w ≥ 0 (decay × loss mask × in-sequence); 0 = not scored
  const int32_t* block_pos = nullptr;  // [rows] k in 1..B-1
  const int32_t* block_id = nullptr;   // [rows] block index (any ids; a block's rows must be contiguous)
};

// Unnormalised sums over the rows of one call; they add across chunks, micro-batches and ranks. The parts (ce ...
// nla) leave out the D-PACE factor d, so that they read the same under every position weight; loss includes it.
struct VocabLossSums {
  double loss = 0;    // Σ w d (λ_ce CE + λ_kl KL + λ_cap CAP + λ_tv TV + λ_lk LK + λ_nla NLA)
  double ce = 0;      // Σ w CE
  double kl = 0;      // Σ w KL (0 when no target_hidden is given)
  double cap = 0;     // Σ w CAP
  double weight = 0;  // Σ w
  double tv = 0;      // Σ w TV   (these three: 0 unless a TV / LK / NLA term is on)
  double lk = 0;      // Σ w LK
  double nla = 0;     // Σ w NLA
  double dpace = 0;   // Σ w d (= weight under position_weight decay)
  void add(const VocabLossSums& o);
};

// Counts from the same logits (no extra pass); "scored" means w > 0. All entries add across ranks.
struct VocabLossMetrics {
  std::vector<int64_t> correct;  // [B] correct[k]: scored rows at block position k whose argmax is the label
  std::vector<int64_t> scored;   // [B] scored[k]: scored rows at block position k (index 0 unused)
  int64_t topk_hits = 0;         // scored rows whose label is among the top_k drafter logits
  int64_t accepted_sum = 0;      // Σ over blocks of accepted length = 1 + leading run of scored, correct k = 1, 2, …
  int64_t blocks = 0;            // blocks with at least one scored row
  void add(const VocabLossMetrics& o);
};

struct VocabLossResult {
  VocabLossSums sums;
  VocabLossMetrics metrics;
};

// What forward keeps for backward: the per-row statistics (kernels/vocab_loss_rows.h), in the backend's memory.
struct VocabLossContext {
  Buffer rows;                     // [n_rows] VocabLossRow, written by forward (=)
  std::vector<double> row_weight;  // [n_rows] w · d, the weights backward uses (D-PACE only; empty under decay)
  int n_rows = 0;
  VocabLossMode mode = VocabLossMode::recompute;
  double fused_grad_scale = 0;  // the grad_scale dX was formed with (fused)
  bool has_forward = false;
};

template <typename T>
class VocabLoss {
 public:
  // head: the frozen lm_head W [vocab, hidden] row-major (PyTorch layout), in the backend's memory; the head and
  // the backend must outlive this object. ctx: where the chunk passes run.
  VocabLoss(const VocabLossSettings& settings, kernels::Backend<T>& backend, ExecContext& ctx, const T* head,
            int vocab, int hidden);
  // The same on the host CPU backend (tests, benchmarks, tools).
  VocabLoss(const VocabLossSettings& settings, const T* head, int vocab, int hidden);

  // Returns the unnormalised sums and metrics; fills ctx. Fused mode: dX [rows, H] (=) grad_scale · ∂(Σ w ℓ)/∂X.
  // Recompute mode: dX is not touched (may be null).
  VocabLossResult forward(const VocabLossBatch<T>& batch, VocabLossContext& ctx, double grad_scale, T* dX);

  // dX [rows, H] (=) grad_scale · ∂(Σ w ℓ)/∂X. Recompute: recomputes each chunk's logits (same batch as forward).
  // Fused: dX already holds the gradient from forward; it is rescaled when grad_scale differs.
  void backward(const VocabLossBatch<T>& batch, const VocabLossContext& ctx, double grad_scale, T* dX);

  const VocabLossSettings& settings() const { return settings_; }
  // Bytes of scratch currently held (the loss's memory beyond its inputs, outputs and the per-row context).
  size_t scratch_bytes() const;

 private:
  using A = kernels::acc_t<T>;
  void check_batch(const VocabLossBatch<T>& batch) const;
  kernels::VocabLossCoeffs coeffs() const;
  // Rows of the chunk that starts at r0: min(C, rows left), or under D-PACE the whole blocks that fit in C (at
  // least one block: a chunk then holds up to max(C, B − 1) rows).
  int chunk_rows(const VocabLossBatch<T>& batch, int r0, int C) const;
  // Sizes the scratch for chunks of n rows (grows once, to the largest chunk of the largest batch).
  void reserve(int n, bool with_target);
  // Uploads the chunk's labels and weights w [n] (host); logits z_ (=) X Wᵀ and, when used, u_ (=) Y Wᵀ.
  void chunk_logits(const VocabLossBatch<T>& batch, int r0, int n, bool with_target, const A* w);
  // D-PACE: factor_[i] (=) the factor d of each row of a chunk of whole blocks, from its row values; ctx.row_weight
  // and the device weights of the chunk (=) w · d.
  void dpace_chunk(const VocabLossBatch<T>& batch, int r0, int n, VocabLossContext& ctx);
  // dz (=) grad_scale · w · ∂ℓ/∂z for each row of the chunk, in place over z_, then dX rows (=) dz W.
  void chunk_grad(const VocabLossBatch<T>& batch, const VocabLossContext& ctx, int r0, int n, double grad_scale,
                  T* dX);

  VocabLossSettings settings_;
  kernels::Backend<T>& be_;
  ExecContext& ec_;
  const T* head_;  // [V, H]
  int vocab_, hidden_;
  int capacity_rows_ = 0;  // rows the scratch below holds
  Buffer z_;           // [chunk, V] drafter logits, then d(logits) of the same chunk (backend memory)
  Buffer u_;           // [chunk, V] target logits (only when KL is computed)
  Buffer labels_;      // [chunk] int32 labels of the current chunk (backend memory)
  Buffer weights_;     // [chunk] A weights of the current chunk
  Buffer values_;      // [chunk] VocabLossRowValues of the current chunk (backend memory)
  std::vector<kernels::VocabLossRowValues> values_host_;  // [chunk] the same, summed in row order on the host
  std::vector<double> factor_;  // [chunk] D-PACE factors d of the current chunk (1 under decay)
  std::vector<A> w_host_;       // [chunk] the chunk's weights w · d, staged for upload (D-PACE)
};

// Plain reference: materialises all [rows, V] logits in long double, no chunking, no care for speed, host memory.
// Same contract as forward + backward with grad_scale (dX (=), may be null). For tests only.
VocabLossResult vocab_loss_reference(const VocabLossSettings& settings, const VocabLossBatch<double>& batch,
                                     const double* head, int vocab, int hidden, double grad_scale, double* dX);

}  // namespace dflash::model
