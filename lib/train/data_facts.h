#pragma once
// What the trainer must know of its data before it trusts it, from one pass over every token (Dataset::scan):
// the dataset's identity (recorded in every checkpoint, compared on resume) and the inputs that would train
// nothing or the wrong thing, which check_data_facts turns into errors naming the file, the key and the fix:
//   - no anchor candidate (no trained position followed by a trained position): nothing would be trained;
//   - the mask token id at trained positions: the drafter would learn to predict its own placeholder;
//   - drafter.block_size longer than every (streamed) sequence: no block is ever whole.
#include <cstdint>
#include <string>

#include "lib/config/config.h"
#include "lib/io/dataset.h"

namespace dflash::train {

struct DataFacts {
  int64_t sequences = 0, tokens = 0;
  uint64_t content_hash = 0;        // of offsets, tokens and loss mask (FNV-1a, element by element)
  int64_t longest = 0;              // longest sequence as streamed (data.max_seq_len applied)
  int64_t trained_tokens = 0;       // loss_mask 1, within the streamed length
  int64_t anchor_candidates = 0;    // positions i with loss_mask[i] = loss_mask[i+1] = 1 (streamed)
  int64_t mask_token_trained = 0;   // trained positions holding the mask token id
  int32_t max_token = -1;           // the largest token id (-1 when empty)
  int64_t first_mask_seq = -1, first_mask_pos = -1;  // where the first of them is
  // "64 sequences, 4980 tokens, content 0x0123456789abcdef": what a checkpoint records of its data
  std::string identity() const;
};

// One pass over `data` (every token read once); max_seq_len as data.max_seq_len (0 = no limit).
DataFacts scan_data_facts(const io::Dataset& data, int mask_token_id, int64_t max_seq_len);

// Throws a dflash::Error naming data.path and the key to change for each problem listed above.
void check_data_facts(const DataFacts& facts, const TrainConfig& cfg);

}  // namespace dflash::train
