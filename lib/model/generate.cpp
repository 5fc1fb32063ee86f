#include "lib/model/generate.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "kernels/backend.h"
#include "lib/core/error.h"
#include "lib/io/safetensors.h"
#include "lib/model/qwen_config.h"

namespace dflash::model {

int64_t argmax_first(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;  // strict: the first of equals stays
  return best;
}

GreedyHead::GreedyHead(const std::string& model_dir, comm::Transport& tp) : tp_(tp) {
  const QwenConfig c = load_qwen_config(model_dir);
  vocab_ = c.vocab;
  hidden_ = c.hidden;
  rows_ = comm::shard_range(c.vocab, 1, tp.size(), tp.rank());
  io::Checkpoint ckpt(model_dir);
  std::string name = "lm_head.weight";
  if (c.tie_word_embeddings) {
    name = c.weight_prefix + "embed_tokens.weight";
  } else {
    DFLASH_CHECK(ckpt.has(name), "checkpoint {}: tie_word_embeddings is false but lm_head.weight is missing",
                 model_dir);
  }
  ckpt.expect(name, {c.vocab, c.hidden});
  head_.resize(size_t(rows_.size()) * size_t(hidden_));
  if (rows_.size() > 0) ckpt.read_rows(name, rows_.begin, rows_.end, head_.data());
  logits_.resize(size_t(rows_.size()));
}

int32_t GreedyHead::next_token(const float* hidden, int vocab_limit) {
  DFLASH_CHECK(vocab_limit >= 0 && vocab_limit <= vocab_, "vocab_limit {} outside [0, vocab {}]", vocab_limit,
               vocab_);
  const int64_t limit = vocab_limit > 0 ? vocab_limit : vocab_;
  const int64_t n = std::max<int64_t>(0, std::min(rows_.end, limit) - rows_.begin);  // candidate rows here
  int64_t nan = 0;
  if (n > 0) {
    kernels::cpu_backend<float>().linear_forward(kernels::host_exec_context(), logits_.data(), hidden, head_.data(), 1,
                                                 hidden_, int(n));
    for (int64_t i = 0; i < n; ++i) nan += std::isnan(logits_[size_t(i)]);
  }
  const int64_t local = argmax_first(logits_.data(), n);
  // every rank fills its own slot (value, id, NaN count) and the sum gathers them: same answer on every rank
  const int tp = tp_.size();
  std::vector<double> slots(size_t(3 * tp), 0.0);
  double* mine = &slots[size_t(3 * tp_.rank())];
  mine[0] = local >= 0 ? double(logits_[size_t(local)]) : -std::numeric_limits<double>::infinity();
  mine[1] = local >= 0 ? double(rows_.begin + local) : -1.0;
  mine[2] = double(nan);
  tp_.allreduce_sum(slots.data(), slots.size());
  double best_value = -std::numeric_limits<double>::infinity(), nans = 0;
  int64_t best = -1;
  for (int r = 0; r < tp; ++r) {  // ranks hold increasing id ranges: strict > keeps the lowest id on ties
    nans += slots[size_t(3 * r + 2)];
    const int64_t id = int64_t(slots[size_t(3 * r + 1)]);
    if (id >= 0 && (best < 0 || slots[size_t(3 * r)] > best_value)) {
      best = id;
      best_value = slots[size_t(3 * r)];
    }
  }
  DFLASH_CHECK(nans == 0, "{} of the target's logits are NaN: the checkpoint or the hidden state is broken",
               int64_t(nans));
  DFLASH_CHECK(best >= 0, "no token to pick (vocab {}, vocab_limit {})", vocab_, vocab_limit);
  return int32_t(best);
}

std::vector<int32_t> greedy_generate(TargetModel& target, GreedyHead& head, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& options) {
  const int H = target.config().hidden;
  DFLASH_CHECK(!prompt.empty(), "greedy_generate: the prompt is empty (the target needs at least one token)");
  DFLASH_CHECK(options.max_new_tokens >= 0, "max_new_tokens must be >= 0, got {}", options.max_new_tokens);
  DFLASH_CHECK(options.eos_id < target.config().vocab, "eos id {} is not in the target's vocab ({} ids)",
               options.eos_id, target.config().vocab);
  std::vector<int32_t> generated;
  if (options.max_new_tokens == 0) return generated;
  // the prompt once, then one position per new token: attention keys/values and DeltaNet states stay in the cache
  TargetCache cache;
  std::vector<float> final_hidden(prompt.size() * size_t(H));  // [S, H]; only the last row is used
  target.forward_cached(prompt.data(), int(prompt.size()), cache, final_hidden.data());
  const float* last = &final_hidden[(prompt.size() - 1) * size_t(H)];
  for (int k = 0; k < options.max_new_tokens; ++k) {
    const int32_t next = head.next_token(last, options.vocab_limit);
    generated.push_back(next);
    if (next == options.eos_id || k + 1 == options.max_new_tokens) break;
    target.forward_cached(&next, 1, cache, final_hidden.data());
    last = final_hidden.data();
  }
  return generated;
}

std::vector<int32_t> prompt_of(const io::Sequence& sequence, const std::string& source) {
  if (sequence.tokens.empty())
    throw Error(fmt::format("{}: sequence {} has no tokens (length 0), so it has no prompt; drop empty rows when "
                            "making the prompts file", source, sequence.index));
  size_t n = 0;
  while (n < sequence.tokens.size() && sequence.loss_mask[n] == 0) ++n;
  if (n == 0)
    throw Error(fmt::format(
        "{}: sequence {} has loss_mask = 1 on its first token, so it has no prompt; a prompt is the tokens before "
        "the first loss_mask = 1 (give prompt tokens loss_mask 0, e.g. \"loss_mask\" in import-jsonl)",
        source, sequence.index));
  return {sequence.tokens.begin(), sequence.tokens.begin() + int64_t(n)};
}

int64_t check_prompts(const io::Dataset& prompts, int64_t limit) {
  const int64_t n = limit > 0 ? std::min(limit, prompts.size()) : prompts.size();
  for (int64_t i = 0; i < n; ++i) prompt_of(prompts.read(i), prompts.path());
  return n;
}

void check_generation_fits(const QwenConfig& target, const std::string& target_dir, const io::Dataset& prompts,
                           int64_t n, int64_t max_new_tokens, int extra, const std::string& what) {
  if (target.max_position_embeddings <= 0) return;  // the config does not say; nothing to hold it to
  int64_t longest = 0, which = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = int64_t(prompt_of(prompts.read(i), prompts.path()).size());
    if (len > longest) longest = len, which = i;
  }
  const int64_t need = longest + max_new_tokens + extra;
  DFLASH_USER_CHECK(need <= target.max_position_embeddings,
                    "{} = {}: prompt {} of {} has {} tokens, so decoding reaches position {} (+ {} for the last "
                    "verify), past the target's max_position_embeddings {} ({}/config.json); give at most {} new tokens",
                    what, max_new_tokens, which, prompts.path(), longest, longest + max_new_tokens, extra,
                    target.max_position_embeddings, target_dir,
                    std::max<int64_t>(0, target.max_position_embeddings - longest - extra));
}

}  // namespace dflash::model
