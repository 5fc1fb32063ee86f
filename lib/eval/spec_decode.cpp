#include "lib/eval/spec_decode.h"

#include <algorithm>
#include <cmath>

#include "kernels/backend.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"

namespace dflash::eval {

DrafterProposer::DrafterProposer(const model::DrafterConfig& cfg, const model::DrafterParams<float>& params,
                                 const float* embedding, const float* lm_head, int vocab_limit)
    : cfg_(cfg),
      params_(params),
      embedding_(embedding),
      lm_head_(lm_head),
      vocab_limit_(vocab_limit > 0 ? vocab_limit : cfg.vocab) {
  DFLASH_CHECK(vocab_limit_ <= cfg.vocab, "vocab_limit {} exceeds the drafter's vocab {}", vocab_limit_, cfg.vocab);
  logits_.resize(size_t(cfg.block_size - 1) * size_t(vocab_limit_));
}

void DrafterProposer::block_logits(const std::vector<int32_t>& tokens, const float* taps) {
  const int S = int(tokens.size()), B = cfg_.block_size, H = cfg_.hidden;
  const int anchor = S - 1;  // the last token: its own context row is masked, so taps row S−1 is never read
  model::DrafterInputs<float> in;
  in.taps = taps;
  in.tokens = tokens.data();
  in.seq_len = S;
  in.anchors = &anchor;
  in.n_anchors = 1;
  in.embed = embedding_;
  if (S > reserved_len_) {  // the context grows by a few rows per cycle: grow the arena in doublings, not per call
    reserved_len_ = std::max(2 * reserved_len_, std::max(S, 256));
    acts_.reserve(MemoryKind::host, cfg_, reserved_len_, 1);
  }
  model::drafter_forward(cfg_, params_, in, acts_);
  // rows 1..B−1 of the block predict positions p+1..p+B−1
  kernels::cpu_backend<float>().linear_forward(kernels::host_exec_context(), logits_.data(), acts_.out + H, lm_head_,
                                               B - 1, H, vocab_limit_);
}

void DrafterProposer::propose(const std::vector<int32_t>& tokens, const float* taps, int32_t* draft) {
  Timer timer;
  block_logits(tokens, taps);
  for (int j = 0; j < cfg_.block_size - 1; ++j)
    draft[j] = int32_t(model::argmax_first(&logits_[size_t(j) * size_t(vocab_limit_)], vocab_limit_));
  seconds_ += timer.seconds();
}

void DrafterProposer::propose_topk(const std::vector<int32_t>& tokens, const float* taps, int k, int32_t* ids,
                                   float* logprobs) {
  Timer timer;
  DFLASH_CHECK(k >= 1 && k <= vocab_limit_, "propose_topk: k {} outside [1, {}]", k, vocab_limit_);
  block_logits(tokens, taps);
  std::vector<int32_t> order(static_cast<size_t>(vocab_limit_));
  for (int j = 0; j < cfg_.block_size - 1; ++j) {
    const float* row = &logits_[size_t(j) * size_t(vocab_limit_)];
    const float mx = row[model::argmax_first(row, vocab_limit_)];
    double sum = 0;
    for (int v = 0; v < vocab_limit_; ++v) sum += std::exp(double(row[v]) - double(mx));
    const double log_z = double(mx) + std::log(sum);
    for (int v = 0; v < vocab_limit_; ++v) order[size_t(v)] = v;
    // larger logit first, lower id on ties: the first is argmax_first's pick, the chain's draft
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (int r = 0; r < k; ++r) {
      ids[size_t(j) * size_t(k) + size_t(r)] = order[size_t(r)];
      logprobs[size_t(j) * size_t(k) + size_t(r)] = float(double(row[order[size_t(r)]]) - log_z);
    }
  }
  seconds_ += timer.seconds();
}

SpecContext spec_prefill(model::TargetModel& target, model::GreedyHead& head, const std::vector<int32_t>& prompt,
                         const SpecOptions& o, std::vector<float>& hidden, SpecResult& r) {
  const int S = int(prompt.size()), H = target.config().hidden, W = int(o.tap_layer_ids.size()) * H;
  SpecContext c;
  c.taps.resize(size_t(S) * W);
  target.forward_cached(prompt.data(), S, c.cache, o.tap_layer_ids, c.taps.data(), hidden.data());
  r.target_forwards = 1;
  c.seq = prompt;
  c.seq.push_back(head.next_token(&hidden[size_t(S - 1) * H], o.vocab_limit));
  r.tokens.push_back(c.seq.back());
  c.taps.resize(c.taps.size() + size_t(W), 0.f);
  return c;
}

SpecResult speculative_generate(model::TargetModel& target, model::GreedyHead& head, comm::Transport& tp,
                                BlockProposer* proposer, const std::vector<int32_t>& prompt, const SpecOptions& o) {
  const int H = target.config().hidden, B = o.block_size, W = int(o.tap_layer_ids.size()) * H;
  const bool root = tp.rank() == 0;
  DFLASH_CHECK(!prompt.empty(), "speculative_generate: the prompt is empty (the target needs at least one token)");
  DFLASH_CHECK(B >= 2, "speculative_generate: block size {} must be >= 2", B);
  DFLASH_CHECK(o.max_new_tokens >= 0, "max_new_tokens must be >= 0, got {}", o.max_new_tokens);
  DFLASH_CHECK(!root || proposer, "speculative_generate: TP rank 0 needs a proposer");
  Timer timer;
  SpecResult r;
  if (o.max_new_tokens == 0) return r;

  std::vector<float> hidden(size_t(std::max(int(prompt.size()), B)) * H);
  std::vector<float> block_taps(size_t(B) * W);
  SpecContext ctx = spec_prefill(target, head, prompt, o, hidden, r);
  auto& [cache, taps, seq] = ctx;

  std::vector<int32_t> input(static_cast<size_t>(B)), draft(static_cast<size_t>(B - 1));
  model::TargetRecurrentState
      before;  // hybrid targets: the DeltaNet part of the cache before a verify (backend memory)
  auto done = [&] { return int(r.tokens.size()) >= o.max_new_tokens || r.tokens.back() == o.eos_id; };
  while (!done()) {
    const int p = int(seq.size()) - 1;  // position of the last kept token, not yet through the target
    if (root) proposer->propose(seq, taps.data(), draft.data());
    tp.broadcast_bytes(draft.data(), draft.size() * sizeof(int32_t), 0);  // one drafter, the same drafts everywhere
    input[0] = seq[size_t(p)];
    std::copy(draft.begin(), draft.end(), input.begin() + 1);

    target.save_recurrent(cache, before);
    target.forward_cached(input.data(), B, cache, o.tap_layer_ids, block_taps.data(), hidden.data());
    r.target_forwards += 1;
    int m = 0;
    for (int j = 0; j < B; ++j) {
      const int32_t g = head.next_token(&hidden[size_t(j) * H], o.vocab_limit);
      seq.push_back(g);
      r.tokens.push_back(g);
      ++m;
      if (done() || j == B - 1 || g != draft[size_t(j)]) break;
    }
    r.accepted.push_back(m);

    // keep positions p..p+m−1 (their inputs were t_p and the m−1 confirmed drafts); a finished sequence's cache
    // is dropped, so the last verify needs no rollback
    if (m < B && !done()) {
      cache.truncate(p + m);
      if (target.config().hybrid) {
        cache.truncate(p);
        target.restore_recurrent(cache, before);
        target.forward_cached(input.data(), m, cache, hidden.data());
        r.rollback_forwards += 1;
      }
    }
    taps.resize(size_t(p) * W);  // drop the placeholder row of p
    taps.insert(taps.end(), block_taps.begin(), block_taps.begin() + long(size_t(m) * W));
    taps.resize(taps.size() + size_t(W), 0.f);  // the placeholder row of the new last token
  }
  r.seconds = timer.seconds();
  return r;
}

void teacher_forced_acceptance(model::TargetModel& target, comm::Transport& tp, BlockProposer* proposer,
                               const std::vector<int32_t>& sequence, int prompt_len,
                               const std::vector<int>& tap_layer_ids, int B, std::vector<int>& accepted,
                               std::vector<std::vector<int32_t>>* drafts) {
  const size_t n = sequence.size(), W = tap_layer_ids.size() * size_t(target.config().hidden);
  DFLASH_CHECK(prompt_len >= 1 && size_t(prompt_len) <= n, "teacher_forced_acceptance: prompt length {} outside "
               "[1, {}]", prompt_len, n);
  accepted.clear();
  if (drafts) drafts->clear();
  std::vector<float> taps(n * W);
  target.forward(sequence.data(), int(n), tap_layer_ids, taps.data(), nullptr);
  if (tp.rank() != 0) return;
  DFLASH_CHECK(proposer, "teacher_forced_acceptance: TP rank 0 needs a proposer");
  std::vector<int32_t> draft(static_cast<size_t>(B - 1));
  for (size_t p = size_t(prompt_len); p + 1 < n; ++p) {
    const std::vector<int32_t> context(sequence.begin(), sequence.begin() + long(p) + 1);
    std::vector<float> context_taps(taps.begin(), taps.begin() + long(p * W));
    context_taps.resize((p + 1) * W, 0.f);  // row p: never visible to the block anchored there
    proposer->propose(context, context_taps.data(), draft.data());
    int m = 1;
    while (m < B && p + size_t(m) < n && draft[size_t(m - 1)] == sequence[p + size_t(m)]) ++m;
    accepted.push_back(std::min(m, int(n - 1 - p)));  // kept tokens sit at p+1..p+m, inside the sequence
    if (drafts) drafts->push_back(draft);
  }
}

void SpecSummary::add(const SpecResult& r) {
  prompts += 1;
  generated += int64_t(r.tokens.size());
  verifies += int64_t(r.accepted.size());
  for (int m : r.accepted) {
    kept_in_verifies += m;
    kept_histogram[size_t(m)] += 1;
  }
  kept_per_prompt.push_back(r.accepted);
  tokens_per_prompt.push_back(r.tokens);
  target_forwards += r.target_forwards;
  rollback_forwards += r.rollback_forwards;
  tree_nodes += r.tree_nodes;
  seconds += r.seconds;
}

double SpecSummary::tau() const { return verifies > 0 ? double(kept_in_verifies) / double(verifies) : 0.0; }

std::vector<double> SpecSummary::acceptance_by_position() const {
  // the draft at position j was accepted exactly when the verify kept more than j tokens
  std::vector<double> a(size_t(block_size - 1), 0.0);
  for (int j = 1; j < block_size; ++j) {
    int64_t n = 0;
    for (int m = j + 1; m <= block_size; ++m) n += kept_histogram[size_t(m)];
    a[size_t(j - 1)] = verifies > 0 ? double(n) / double(verifies) : 0.0;
  }
  return a;
}

nlohmann::ordered_json SpecSummary::to_json() const {
  nlohmann::ordered_json j;
  j["prompts"] = prompts;
  j["block_size"] = block_size;
  // τ is kept tokens per verify forward: undefined (null, never 0, which is outside 1..B) without one
  if (verifies > 0) {
    j["tau"] = tau();
  } else {
    j["tau"] = nullptr;
    j["tau_undefined"] = "no verify forward ran: every prompt ended (eos, or max_new_tokens reached by the first "
                         "token) before a draft was verified";
  }
  j["generated_tokens"] = generated;
  j["verify_forwards"] = verifies;
  j["target_forwards"] = target_forwards;
  j["rollback_forwards"] = rollback_forwards;
  j["target_forwards_per_token"] = generated > 0 ? double(target_forwards + rollback_forwards) / double(generated) : 0.0;
  j["tokens_per_second"] = seconds > 0 ? double(generated) / seconds : 0.0;
  j["seconds"] = seconds;
  j["kept_histogram"] = kept_histogram;  // index k: verifies that kept k tokens
  j["acceptance_by_position"] = acceptance_by_position();  // index j−1: draft position j accepted
  if (tree_nodes > 0) j["tree_nodes_per_verify"] = verifies > 0 ? double(tree_nodes) / double(verifies) : 0.0;
  nlohmann::ordered_json per_prompt = nlohmann::ordered_json::array();
  for (size_t i = 0; i < kept_per_prompt.size(); ++i)
    per_prompt.push_back({{"kept", kept_per_prompt[i]}, {"tokens", tokens_per_prompt[i]}});
  j["per_prompt"] = std::move(per_prompt);  // index i: prompt i's kept tokens per verify, and its output
  return j;
}

}  // namespace dflash::eval
