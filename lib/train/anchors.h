#pragma once
// Anchor sampling and the scored rows of one sequence (docs/drafter.md).
//
// Anchors: positions i with loss_mask[i] and loss_mask[i+1], drawn uniformly without replacement, sorted,
// resampled every step; deterministic in (seed, step, slot), where slot = micro_batch · drafter_dp + drafter_rank is
// the sequence's place in the global batch — so the same sequences get the same anchors whatever the split of the
// global batch into ranks and micro-batches.
// Scored rows: block positions k = 1..B-1 of every block; row k of block b predicts token[a_b + k] from the
// drafter's output row b·B + k, and the target's logits at position a_b + k − 1 (what the target predicted there).
#include <cstdint>
#include <vector>

namespace dflash::train {

struct AnchorKey {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t slot = 0;  // micro_batch · drafter_dp + drafter_rank
};

// Sorted distinct anchors, at most `max_anchors` (fewer when the sequence has fewer candidates; none when it has
// none). loss_mask: [S] of 0/1.
std::vector<int> sample_anchors(const uint8_t* loss_mask, int seq_len, int max_anchors, const AnchorKey& key);

// Loss decay γ of w = exp(-(k-1)/γ): 7 for B = 16 and 4 for B = 8 (the published recipes), otherwise 7·B/16.
double default_decay_gamma(int block_size);

// The scored rows of one sequence, T = N·(B−1), in block order then k = 1..B-1 (rows of a block contiguous).
struct ScoredRows {
  std::vector<int> out_row;       // [T] drafter output row b·B + k
  std::vector<int> target_pos;    // [T] sequence position whose target final hidden scores this row (a_b + k − 1)
  std::vector<int32_t> label;     // [T] token[a_b + k] (0 where a_b + k ≥ S; its weight is 0)
  std::vector<float> weight;      // [T] exp(−(k−1)/γ) · loss_mask[a_b + k] · [a_b + k < S]
  std::vector<int> block_pos;     // [T] k
  std::vector<int> block_id;      // [T] b
  double weight_sum() const;
  int size() const { return int(label.size()); }
};

ScoredRows scored_rows(const int32_t* tokens, const uint8_t* loss_mask, int seq_len, const std::vector<int>& anchors,
                       int block_size, double gamma);

}  // namespace dflash::train
