#pragma once
// The settings of the drafter's vocabulary loss (lib/model/vocab_loss.h). The config's `loss` section IS this
// struct (lib/config/config.h: LossSection derives from it), so each default below is the one docs/config.md shows
// and is written nowhere else.
#include <array>

namespace dflash::model {

enum class VocabLossMode {
  recompute,  // forward keeps per-row scalars; backward recomputes the chunk logits and writes dX (3F + 2F target)
  fused,      // forward forms dX while the chunk is in memory; backward only scales (2F + 1F target)
};

// The names the config file uses (loss.mode), in enum order (lib/core/named_enum.h).
constexpr std::array<const char*, 2> names_of(VocabLossMode) { return {"recompute", "fused"}; }

// How a row's loss is weighted across its block (docs/loss.md, "Position weights"): the caller's weight alone
// (it carries the decay exp(−(k−1)/γ)), or times a D-PACE factor formed per block from the drafter's own p_y.
enum class PositionWeight {
  decay,                        // w as given
  dpace,                        // w · Σ_{m ≥ k} C_m, C_m = Π_{i ≤ m} (α + (1 − α) p_y,i)   (D-PACE)
  dpace_cumulative_confidence,  // w · C_k                                                     (its first factor)
  dpace_continuation_value,     // w · Σ_{m ≥ k} C_m / C_k                                     (its second factor)
};
// The names the config file uses (loss.position_weight), in enum order (lib/core/named_enum.h).
constexpr std::array<const char*, 4> names_of(PositionWeight) {
  return {"decay", "dpace", "dpace_cumulative_confidence", "dpace_continuation_value"};
}

struct VocabLossSettings {
  int chunk_size = 1024;  // loss.chunk_size: rows per chunk; scratch is chunk × V per logits buffer
  VocabLossMode mode = VocabLossMode::recompute;  // loss.mode (docs/loss.md, "Chunking and the two schedules")
  double ce_weight = 1.0;       // λ_ce
  double kl_weight = 0.0;       // λ_kl (needs target_hidden)
  double kl_temperature = 1.0;  // τ
  double cap_weight = 0.0;      // λ_cap
  // The acceptance-aware terms (docs/loss.md): total variation 1 − α, LK-hybrid λ·KL + (1 − λ)·TV with
  // λ = exp(−η α), negative log-acceptance −log α; α = Σ_v min(p_v, q_v) at τ = 1 (they need target_hidden).
  double tv_weight = 0.0;   // λ_tv
  double lk_weight = 0.0;   // λ_lk
  double lk_eta = 3.0;      // η of LK's blend
  double nla_weight = 0.0;  // λ_nla
  PositionWeight position_weight = PositionWeight::decay;  // loss.position_weight (docs/loss.md, "Position weights")
  double dpace_alpha = 0.5;  // α of D-PACE's smoothed confidence α + (1 − α) p_y, in (0, 1]
  int top_k = 4;                // a row is a top-k hit when its label ranks < top_k in the drafter logits
  // B: block positions k are 1..B-1. Not a loss key: the run plan copies drafter.block_size here.
  int block_size = 16;

  // True when a term reads the target's logits u = W y (the caller must give target_hidden).
  bool uses_target() const { return kl_weight != 0 || tv_weight != 0 || lk_weight != 0 || nla_weight != 0; }
  // True when a TV / LK / NLA term is on (they are defined at τ = 1).
  bool uses_overlap() const { return tv_weight != 0 || lk_weight != 0 || nla_weight != 0; }
};

}  // namespace dflash::model
