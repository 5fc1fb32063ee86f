#pragma once
// The target's tokenizer against the target and the data, for `dflash_mpi --check`: data made with another
// model's tokenizer trains a drafter on token ids the target reads as different words, and nothing else notices.
// Reads the Hugging Face `tokenizer.json` of the target folder (when there is one) with the JSON library only.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "lib/report/check_item.h"

namespace dflash::preflight {

struct TokenizerFacts {
  std::string path;                // DIR/tokenizer.json ("" when the folder has none)
  int64_t tokens = 0;              // 1 + the largest id of model.vocab and added_tokens
  std::set<int64_t> special_ids;   // added_tokens marked "special": true
};

// Reads DIR/tokenizer.json; a folder without one gives facts with an empty path. A file that is not a tokenizer
// (no model.vocab, unreadable JSON) is a user error naming it.
TokenizerFacts read_tokenizer_facts(const std::string& model_dir);

// The mismatches, one line each (empty: none): a tokenizer larger than the target's vocab_size, an eos/bos id of
// config.json or generation_config.json that is not a special token of the tokenizer, data ids the tokenizer cannot
// have produced, a mask token id the tokenizer produces (a reserved row beyond the tokenizer is safer).
// Returns (errors, notes).
struct TokenizerCheck {
  std::vector<std::string> errors, notes;
};
TokenizerCheck check_tokenizer(const TokenizerFacts& t, const std::string& model_dir, int vocab_size,
                               int32_t data_max_token, int mask_token_id);

// --check's items of the tokenizer (its facts, or that the folder has none) and one per note of the check.
std::vector<report::CheckItem> tokenizer_items(const TokenizerFacts& t, const TokenizerCheck& check,
                                               const std::string& model_dir, int vocab_size);

}  // namespace dflash::preflight
