#pragma once
// Greedy speculative decoding with the frozen target and a DFlash drafter (docs/eval.md), one prompt at a time.
// Lossless by construction: every token kept is the target's own greedy pick; the drafter only decides how many
// the target confirms per forward.
//
// Positions: after the prefill of prompt[S] the first token t_S (target argmax at S−1) sits at position p = S and
// has not been through the target yet. One cycle:
//   propose  the drafter block [t_p, MASK × (B−1)] at positions p..p+B−1, context = the taps of positions < p
//            (the DFlash mask never shows the anchor its own row) → drafts d_1..d_{B−1} for positions p+1..p+B−1;
//   verify   the target runs [t_p, d_1..d_{B−1}] in ONE cached forward; row j's argmax g_j is its token for
//            position p+j+1. Kept: g_0, g_1, … up to and including the first g_j ≠ d_{j+1} (or g_{B−1}, the bonus):
//            m ∈ [1, B] tokens, every one the target's greedy choice given the kept tokens before it;
//   rollback the cache keeps positions ..p+m−1 (inputs t_p, d_1..d_{m−1} = g_0..g_{m−2}); p += m.
// The KV cache truncates. A Gated DeltaNet layer's conv tail and recurrent state cannot be truncated: the cycle
// keeps a copy from before the verify and, when m < B, restores it and re-runs the m kept inputs (one extra target
// forward, counted apart). Storing the state per position instead would need the DeltaNet kernel to emit it.
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/comm/transport.h"
#include "lib/model/drafter.h"
#include "lib/model/drafter_config.h"
#include "lib/model/drafter_params.h"
#include "lib/model/generate.h"
#include "lib/model/target.h"

namespace dflash::eval {

// What proposes a block. Called on TP rank 0 only; its drafts are broadcast to the other target ranks.
class BlockProposer {
 public:
  virtual ~BlockProposer() = default;
  // tokens[p+1]: the sequence so far (prompt, generated), the last one t_p at position p;
  // taps[p+1, n_taps·H]: target taps of positions 0..p−1 (row p is zeros: t_p has not run through the target).
  // draft[B−1] (=): the proposed tokens for positions p+1..p+B−1.
  virtual void propose(const std::vector<int32_t>& tokens, const float* taps, int32_t* draft) = 0;
};

// What proposes the candidates of a verification tree (lib/eval/spec_tree.h). Called on TP rank 0 only.
class TopkProposer {
 public:
  virtual ~TopkProposer() = default;
  // tokens, taps: as BlockProposer::propose. ids[B−1, k] (=): the k likeliest tokens for positions p+1..p+B−1, most
  // likely first (lowest id on ties, so ids[j, 0] is the chain's draft); logprobs[B−1, k] (=) their log-probabilities
  // under the drafter.
  virtual void propose_topk(const std::vector<int32_t>& tokens, const float* taps, int k, int32_t* ids,
                            float* logprobs) = 0;
};

// The DFlash drafter on the host CPU backend: one block anchored at p; the drafts are the argmax of the target's
// lm_head over its final hidden rows 1..B−1 (lowest id on ties, ids < vocab_limit); propose_topk gives the top k of
// each row with their log-softmax over ids < vocab_limit.
class DrafterProposer : public BlockProposer, public TopkProposer {
 public:
  // embedding, lm_head: the target's [V, H] (TargetVocab); they must outlive the proposer.
  DrafterProposer(const model::DrafterConfig& cfg, const model::DrafterParams<float>& params, const float* embedding,
                  const float* lm_head, int vocab_limit);
  void propose(const std::vector<int32_t>& tokens, const float* taps, int32_t* draft) override;
  void propose_topk(const std::vector<int32_t>& tokens, const float* taps, int k, int32_t* ids,
                    float* logprobs) override;
  double seconds() const { return seconds_; }  // wall time inside propose and propose_topk

 private:
  void block_logits(const std::vector<int32_t>& tokens, const float* taps);  // fills logits_
  model::DrafterConfig cfg_;
  const model::DrafterParams<float>& params_;
  const float* embedding_;
  const float* lm_head_;
  int vocab_limit_;
  model::DrafterActivations<float> acts_;
  std::vector<float> logits_;  // [B−1, vocab_limit]
  int reserved_len_ = 0;       // context length the arena is sized for
  double seconds_ = 0;
};

struct SpecOptions {
  int block_size = 0;            // B ≥ 2 (the drafter's)
  std::vector<int> tap_layer_ids;  // the drafter's target_layer_ids
  int max_new_tokens = 256;
  int32_t eos_id = -1;           // >= 0: stop after this id (kept)
  int vocab_limit = 0;           // > 0: the target picks only ids < vocab_limit (as greedy_generate)
};

struct SpecResult {
  std::vector<int32_t> tokens;  // the generated ids (== greedy_generate's with the same options)
  std::vector<int> accepted;    // per verify forward: tokens kept (1..B; fewer only where generation ends)
  int target_forwards = 0;      // prefill + verifies (rollback re-runs not included)
  int rollback_forwards = 0;    // hybrid targets: re-runs of kept inputs after a partial acceptance (not the last)
  int64_t tree_nodes = 0;       // tree verification: nodes verified over all verify forwards (root included)
  double seconds = 0;           // wall time of the whole generation
};

// What chain and tree decoding carry from cycle to cycle, and the prefill that starts it (collective over the TP
// group): the prompt through the target with taps, the first token from its last row, appended to seq and to
// r.tokens (r.target_forwards = 1). hidden: scratch of at least [prompt length, H].
struct SpecContext {
  model::TargetCache cache;
  std::vector<float> taps;   // [p+1, W]: taps of positions < p, then a zero row for p
  std::vector<int32_t> seq;  // prompt + kept tokens; the last, at position p, has not been through the target yet
};
SpecContext spec_prefill(model::TargetModel& target, model::GreedyHead& head, const std::vector<int32_t>& prompt,
                         const SpecOptions& options, std::vector<float>& hidden, SpecResult& r);

// Collective over the target's TP group `tp` (the target's and the head's): every rank passes the same prompt and
// options; `proposer` is used on rank 0 only (may be null elsewhere). Every rank returns the same result.
SpecResult speculative_generate(model::TargetModel& target, model::GreedyHead& head, comm::Transport& tp,
                                BlockProposer* proposer, const std::vector<int32_t>& prompt,
                                const SpecOptions& options);

// Teacher forcing on a finished sequence (prompt + continuation): the drafter sees the true context, as in training.
// Collective over `tp` (one full target forward with taps); the proposer runs on rank 0. For every anchor p in
// [prompt_len, n−1): the tokens the block at p would keep, 1 + the leading drafts that equal sequence[p+1..]
// (at most n − 1 − p: the tokens after p), into accepted[p − prompt_len], and its drafts into drafts (optional) — on
// rank 0; empty elsewhere. When sequence is a speculative decoding's prompt + output, that decoding visited the
// anchors prompt_len, prompt_len + m_1, …, and its drafts and kept counts there are exactly these.
void teacher_forced_acceptance(model::TargetModel& target, comm::Transport& tp, BlockProposer* proposer,
                               const std::vector<int32_t>& sequence, int prompt_len,
                               const std::vector<int>& tap_layer_ids, int block_size, std::vector<int>& accepted,
                               std::vector<std::vector<int32_t>>* drafts = nullptr);

// Totals over a prompt set (docs/eval.md defines each output).
struct SpecSummary {
  explicit SpecSummary(int block_size) : block_size(block_size), kept_histogram(size_t(block_size) + 1, 0) {}
  int block_size;
  int64_t prompts = 0, generated = 0, verifies = 0, kept_in_verifies = 0, target_forwards = 0, rollback_forwards = 0;
  int64_t tree_nodes = 0;  // tree verification: nodes verified (root included); 0 for chains
  std::vector<int64_t> kept_histogram;  // [B+1]: verify forwards that kept k tokens (k = 1..B)
  double seconds = 0;
  // Per prompt, in the order added: the tokens kept by each verify, and the generated tokens (to_json's
  // "per_prompt"; what `dflash-prep serve-check` compares a serving engine with, verify by verify).
  std::vector<std::vector<int>> kept_per_prompt;
  std::vector<std::vector<int32_t>> tokens_per_prompt;

  void add(const SpecResult& r);
  double tau() const;  // mean tokens kept per verify forward (kept_in_verifies / verifies)
  // Fraction of verifies whose draft at block position j (1..B−1) was accepted: [B−1].
  std::vector<double> acceptance_by_position() const;
  nlohmann::ordered_json to_json() const;
};

}  // namespace dflash::eval
