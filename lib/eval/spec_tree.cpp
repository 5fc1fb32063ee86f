#include "lib/eval/spec_tree.h"

#include <algorithm>
#include <queue>

#include "lib/core/error.h"
#include "lib/core/timer.h"

namespace dflash::eval {

DraftTree build_draft_tree(int32_t root, const int32_t* ids, const float* logprobs, int positions, int k,
                           int budget) {
  DFLASH_CHECK(positions >= 1 && k >= 1 && budget >= 1, "build_draft_tree: positions {}, k {}, budget {} must be "
               ">= 1", positions, k, budget);
  DraftTree t;
  std::vector<int> rank;       // [n] the node's rank among its depth's candidates
  std::vector<double> score;   // [n] path log-probability
  auto add = [&](int parent, int r) {
    const int d = parent < 0 ? 0 : t.depth[size_t(parent)] + 1;
    t.tokens.push_back(parent < 0 ? root : ids[size_t(d - 1) * size_t(k) + size_t(r)]);
    t.parents.push_back(parent);
    t.depth.push_back(d);
    rank.push_back(r);
    score.push_back(parent < 0 ? 0.0 : score[size_t(parent)] + double(logprobs[size_t(d - 1) * size_t(k) + size_t(r)]));
    return int(t.tokens.size()) - 1;
  };
  add(-1, 0);
  for (int d = 1; d <= std::min(positions, budget); ++d) add(d - 1, 0);  // the top-1 chain
  const int chain_end = int(t.tokens.size()) - 1;

  // candidates (parent, rank); each is pushed once: rank 0 when its parent joins, rank r+1 when rank r joins
  struct Candidate {
    double score;
    long order;  // push order: ties go to the earlier candidate
    int parent, rank;
    bool operator<(const Candidate& o) const { return score < o.score || (score == o.score && order > o.order); }
  };
  std::priority_queue<Candidate> frontier;
  long pushed = 0;
  auto push = [&](int parent, int r) {
    const int d = t.depth[size_t(parent)] + 1;
    if (d > positions || r >= k) return;
    frontier.push({score[size_t(parent)] + double(logprobs[size_t(d - 1) * size_t(k) + size_t(r)]), pushed++, parent,
                   r});
  };
  for (int i = 0; i <= chain_end; ++i) {
    if (i > 0) push(t.parents[size_t(i)], 1);  // the chain node's next sibling
    if (i == chain_end) push(i, 0);            // the chain's end has no child yet
  }
  while (int(t.tokens.size()) - 1 < budget && !frontier.empty()) {
    const Candidate c = frontier.top();
    frontier.pop();
    const int node = add(c.parent, c.rank);
    push(node, 0);
    push(c.parent, c.rank + 1);
  }
  return t;
}

SpecResult speculative_generate_tree(model::TargetModel& target, model::GreedyHead& head, comm::Transport& tp,
                                     TopkProposer* proposer, const std::vector<int32_t>& prompt, const SpecOptions& o,
                                     const TreeOptions& tree) {
  const int H = target.config().hidden, B = o.block_size, W = int(o.tap_layer_ids.size()) * H;
  const int N = tree.budget + 1, K = tree.topk;  // N: most nodes of a tree, root included
  const bool root = tp.rank() == 0;
  DFLASH_CHECK(!prompt.empty(), "speculative_generate_tree: the prompt is empty");
  DFLASH_CHECK(B >= 2, "speculative_generate_tree: block size {} must be >= 2", B);
  DFLASH_CHECK(tree.budget >= 1 && K >= 1, "tree budget {} and top-k {} must be >= 1", tree.budget, K);
  DFLASH_CHECK(!target.config().hybrid, "tree verification needs a dense target: the Gated DeltaNet layers' "
               "recurrent state cannot branch within one forward (use chain decoding)");
  DFLASH_CHECK(!root || proposer, "speculative_generate_tree: TP rank 0 needs a proposer");
  Timer timer;
  SpecResult r;
  if (o.max_new_tokens == 0) return r;

  std::vector<float> hidden(size_t(std::max(int(prompt.size()), N)) * H);
  std::vector<float> tree_taps(size_t(N) * W);
  SpecContext ctx = spec_prefill(target, head, prompt, o, hidden, r);
  auto& [cache, taps, seq] = ctx;

  std::vector<int32_t> ids(size_t(B - 1) * K);
  std::vector<float> logprobs(ids.size());
  std::vector<int32_t> packed(size_t(1 + 2 * N));  // n, tokens[N], parents[N]: what rank 0 broadcasts
  auto done = [&] { return int(r.tokens.size()) >= o.max_new_tokens || r.tokens.back() == o.eos_id; };
  while (!done()) {
    const int p = int(seq.size()) - 1;
    if (root) {
      proposer->propose_topk(seq, taps.data(), K, ids.data(), logprobs.data());
      const DraftTree t = build_draft_tree(seq[size_t(p)], ids.data(), logprobs.data(), B - 1, K, tree.budget);
      packed[0] = int32_t(t.tokens.size());
      std::copy(t.tokens.begin(), t.tokens.end(), packed.begin() + 1);
      std::copy(t.parents.begin(), t.parents.end(), packed.begin() + 1 + N);
    }
    tp.broadcast_bytes(packed.data(), packed.size() * sizeof(int32_t), 0);
    const int n = packed[0];
    const int32_t* tokens = &packed[1];
    const std::vector<int> parents(packed.begin() + 1 + N, packed.begin() + 1 + N + n);
    target.forward_tree(tokens, parents.data(), n, cache, o.tap_layer_ids, tree_taps.data(), hidden.data());
    r.target_forwards += 1;
    r.tree_nodes += n;

    std::vector<int> path = {0};  // accepted nodes from the root
    while (true) {
      const int32_t g = head.next_token(&hidden[size_t(path.back()) * H], o.vocab_limit);
      seq.push_back(g);
      r.tokens.push_back(g);
      if (done()) break;
      int child = -1;
      for (int i = path.back() + 1; i < n && child < 0; ++i)
        if (parents[size_t(i)] == path.back() && tokens[i] == g) child = i;
      if (child < 0) break;
      path.push_back(child);
    }
    const int m = int(path.size());
    r.accepted.push_back(m);
    target.keep_cache_path(cache, p, path);
    taps.resize(size_t(p) * W);  // drop the placeholder row of p
    for (int node : path)
      taps.insert(taps.end(), tree_taps.begin() + long(size_t(node) * W), tree_taps.begin() + long(size_t(node + 1) * W));
    taps.resize(taps.size() + size_t(W), 0.f);
  }
  r.seconds = timer.seconds();
  return r;
}

}  // namespace dflash::eval
