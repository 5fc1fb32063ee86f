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

struct VocabLossSettings {
  int chunk_size = 1024;  // loss.chunk_size: rows per chunk; scratch is chunk × V per logits buffer
  VocabLossMode mode = VocabLossMode::recompute;  // loss.mode (docs/loss.md, "Chunking and the two schedules")
  double ce_weight = 1.0;       // λ_ce
  double kl_weight = 0.0;       // λ_kl (needs target_hidden)
  double kl_temperature = 1.0;  // τ
  double cap_weight = 0.0;      // λ_cap
  int top_k = 4;                // a row is a top-k hit when its label ranks < top_k in the drafter logits
  // B: block positions k are 1..B-1. Not a loss key: the run plan copies drafter.block_size here.
  int block_size = 16;
};

}  // namespace dflash::model
