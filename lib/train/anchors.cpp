#include "lib/train/anchors.h"

#include <algorithm>
#include <cmath>

#include "lib/core/error.h"
#include "lib/core/rng.h"

namespace dflash::train {

std::vector<int> sample_anchors(const uint8_t* loss_mask, int seq_len, int max_anchors, const AnchorKey& key) {
  std::vector<int> candidates;
  for (int i = 0; i + 1 < seq_len; ++i)
    if (loss_mask[i] && loss_mask[i + 1]) candidates.push_back(i);
  const int n = std::min<int>(max_anchors, int(candidates.size()));
  // one stream per (step, slot): a resumed run redraws exactly the same anchors
  Rng rng(key.seed, mix64(uint64_t(key.step) * 0x100000001b3ULL ^ mix64(uint64_t(key.slot) + 0x51ed27ULL)));
  for (int i = 0; i < n; ++i) std::swap(candidates[i], candidates[i + rng.below(candidates.size() - i)]);
  candidates.resize(n);
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

double default_decay_gamma(int block_size) {
  if (block_size == 16) return 7.0;
  if (block_size == 8) return 4.0;
  return 7.0 * block_size / 16.0;
}

double ScoredRows::weight_sum() const {
  double s = 0;
  for (float w : weight) s += w;
  return s;
}

ScoredRows scored_rows(const int32_t* tokens, const uint8_t* loss_mask, int seq_len, const std::vector<int>& anchors,
                       int block_size, double gamma) {
  DFLASH_CHECK(gamma > 0, "loss decay gamma must be positive, got {}", gamma);
  ScoredRows r;
  const size_t T = anchors.size() * size_t(block_size - 1);
  r.out_row.reserve(T);
  r.target_pos.reserve(T);
  r.label.reserve(T);
  r.weight.reserve(T);
  r.block_pos.reserve(T);
  r.block_id.reserve(T);
  for (size_t b = 0; b < anchors.size(); ++b) {
    const int a = anchors[b];
    for (int k = 1; k < block_size; ++k) {
      const int pos = a + k;
      const bool inside = pos < seq_len;
      r.out_row.push_back(int(b) * block_size + k);
      r.target_pos.push_back(std::min(pos - 1, seq_len - 1));
      r.label.push_back(inside ? tokens[pos] : 0);
      r.weight.push_back(inside && loss_mask[pos] ? float(std::exp(-(k - 1) / gamma)) : 0.0f);
      r.block_pos.push_back(k);
      r.block_id.push_back(int(b));
    }
  }
  return r;
}

}  // namespace dflash::train
