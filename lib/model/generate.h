#pragma once
// Greedy generation with the frozen target, and target-regenerated training data (DFlash recipe: the responses
// are what the target itself would say, data/README.md "Making training data").
//
// The next token is argmax_v final_hidden[S-1] · lm_head[v] (lowest id on ties). The prompt runs once, then each
// new token one position (TargetModel::forward_cached: attention keys/values and Gated DeltaNet conv + recurrent
// states carried), so a continuation costs one forward over prompt + generated tokens. Offline data making, not a
// serving path (one sequence at a time). Every call here is collective over the target's TP group.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/comm/shard.h"
#include "lib/comm/transport.h"
#include "lib/io/dataset.h"
#include "lib/model/target.h"

namespace dflash::model {

// Lowest index of the largest value of x[n] (NaN is never the largest); -1 when n == 0.
int64_t argmax_first(const float* x, int64_t n);

// This TP rank's rows of the target's lm_head (vocab ids shard_range(V, 1, tp, rank); the embedding when tied)
// and the greedy pick over the whole vocabulary, the same on every rank.
class GreedyHead {
 public:
  GreedyHead(const std::string& model_dir, comm::Transport& tp);

  comm::Range rows() const { return rows_; }
  int vocab() const { return vocab_; }

  // Collective. hidden[H] → the id v < vocab_limit (0: the whole vocabulary) with the largest logit
  // hidden · lm_head[v], lowest id on ties. Throws when a logit is NaN (a broken checkpoint or input).
  int32_t next_token(const float* hidden, int vocab_limit = 0);

 private:
  comm::Transport& tp_;
  int vocab_ = 0, hidden_ = 0;
  comm::Range rows_;
  std::vector<float> head_;    // [rows_.size(), H]
  std::vector<float> logits_;  // [rows_.size()] scratch
};

struct GenerateOptions {
  int max_new_tokens = 256;
  int32_t eos_id = -1;   // >= 0: stop after generating this id (it is kept in the output)
  int vocab_limit = 0;   // > 0: generate only ids < vocab_limit (keeps reserved ids, e.g. the mask token, out)
};

// Collective. The greedy continuation of prompt[S] (S >= 1): at most max_new_tokens ids, ending at eos if that
// is generated. Every rank returns the same ids.
std::vector<int32_t> greedy_generate(TargetModel& target, GreedyHead& head, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& options);

// The prompt of a training sequence: its tokens before the first token with loss_mask = 1 (the whole sequence when
// no token has loss_mask = 1); the old response after it is dropped. A sequence whose first token has
// loss_mask = 1 has no prompt: a dflash::Error naming `source` and the sequence.
std::vector<int32_t> prompt_of(const io::Sequence& sequence, const std::string& source);

// The number of sequences a regeneration would use (the first `limit`; 0: all) after checking that each has a
// prompt (prompt_of); throws on the first that has none, naming it.
int64_t check_prompts(const io::Dataset& prompts, int64_t limit = 0);

// Refuses a generation that cannot fit the target's positions: the longest of the first n prompts + max_new_tokens
// + extra (the drafter block a speculative verify appends; 0 for plain greedy) beyond max_position_embeddings, naming
// `what` (the key or option), the prompt and the largest value that fits. No bound when config.json has none.
void check_generation_fits(const QwenConfig& target, const std::string& target_dir, const io::Dataset& prompts,
                           int64_t n, int64_t max_new_tokens, int extra, const std::string& what);

}  // namespace dflash::model
