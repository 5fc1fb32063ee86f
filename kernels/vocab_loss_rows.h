#pragma once
// The per-row state of the vocab loss, shared by the CPU and CUDA row passes (plain structs, host and device).
// The math is in docs/loss.md: for a row with drafter logits z, target logits u, label y, p = softmax(z):
//   CE = −log p_y,  KL = τ² KL(softmax(u/τ) ‖ softmax(z/τ)),  CAP = [m ≠ y] (lse(z) − lse_{v≠m}(z)), m = argmax z,
//   and, from the overlap α = Σ_v min(p_v, q_v) of p and q = softmax(u) (τ = 1): TV = 1 − α, NLA = −log α,
//   LK = λ KL + (1 − λ) TV with λ = exp(−η α) held fixed.
#include <cstdint>

namespace dflash::kernels {

// What the forward row pass keeps for backward: the softmax statistics of z, z/τ and u/τ, the argmax, 1 − p_y.
// Maxima and log-sums are kept apart (not as one lse) so that z − lse loses no digits when |z| is large.
struct VocabLossRow {
  double z_max = 0;         // max_v z_v
  double z_logsum = 0;      // log Σ_v exp(z_v − z_max)   (= log1p(Σ_{v≠m} …), formed without cancellation)
  double excl_max = 0;      // max_{v≠m} z_v, or z_max when the shortcut below was exact enough
  double excl_logsum = 0;   // log Σ_{v≠m} exp(z_v − excl_max)
  double zt_logsum = 0;     // log Σ_v exp((z_v − z_max)/τ)
  double u_max = 0;         // max_v u_v
  double ut_logsum = 0;     // log Σ_v exp((u_v − u_max)/τ)
  double one_minus_py = 0;  // 1 − p_y without cancellation (the CE gradient at the label is −this)
  double overlap = 0;       // α = Σ_v min(p_v, q_v) (only with the TV / LK / NLA terms)
  double overlap_below = 0;  // Σ_{v: p_v < q_v} p_v, the p-mass where the drafter is below the target (ditto)
  int32_t argmax = 0;       // m (lowest index on ties)
  int32_t cap_active = 0;   // 1 when m ≠ y (the row was scored)
};

// What the forward row pass reports of each row, for the sums and metrics (the caller reduces them in row order).
struct VocabLossRowValues {
  double ce = 0, kl = 0, cap = 0;
  double tv = 0, lk = 0, nla = 0;  // only with the TV / LK / NLA terms (0 otherwise)
  uint8_t correct = 0;  // argmax == label
  uint8_t topk = 0;     // label ranks < top_k
  uint8_t finite = 1;   // 0: NaN/Inf among the logits
  uint8_t scored = 0;   // w > 0 (rows with w = 0 are skipped and keep zeros)
};

// Coefficients of the loss terms: λ_ce, λ_kl, λ_cap, τ, then λ_tv, λ_lk, η (LK's blend), λ_nla.
struct VocabLossCoeffs {
  double ce = 1, kl = 0, cap = 0, tau = 1;
  double tv = 0, lk = 0, lk_eta = 3, nla = 0;
};

// NLA = −log max(α, kNlaFloor): α below the floor gives the floor's value and no gradient (speculators' clamp).
constexpr double kNlaFloor = 1e-5;

// Beyond this gap between the largest and second-largest logit, Σ_{v≠m} exp(z_v − z_max) may have lost its
// leading terms to underflow, so lse_{v≠m} gets its own pass around the second maximum.
constexpr double kExclShortcutGap = 40.0;

}  // namespace dflash::kernels
