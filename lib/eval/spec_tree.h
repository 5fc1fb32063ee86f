#pragma once
// Tree verification (DDTree-style) on top of greedy speculative decoding (docs/eval.md, "Tree verification").
// Lossless like the chain: every kept token is the target's greedy pick given the kept tokens before it.
//
// One cycle, with the last kept token t_p at position p (not yet through the target):
//   propose  the drafter block at p as for the chain, but the top k tokens of each block row j = 1..B−1 with their
//            log-probabilities (a DFlash block predicts every position at once, so the candidates at depth j are
//            the same under every parent);
//   tree     root t_p, then the top-1 chain (depths 1..B−1: chain acceptance is a lower bound per cycle), then
//            best-first by path log-probability (the sum of the nodes' log-probabilities) until `budget` nodes
//            besides the root: a node at depth d can have the top-k candidates of depth d+1 as children;
//   verify   ONE target forward over the n nodes (TargetModel::forward_tree): node i at position p + depth(i),
//            attending to the cache and its ancestors only;
//   accept   walk from the root: g = the target's argmax at the current node, kept; move to the child whose token
//            is g, if there is one, else stop (m = the path's length in nodes = tokens kept, 1..B);
//   compact  the cache keeps the path's keys/values as positions p..p+m−1; the path's taps join the drafter context.
// Hybrid targets (Gated DeltaNet layers) are refused: their recurrent state cannot branch within one forward, and
// verifying each branch apart would cost a forward per branch, which is what the tree is meant to save.
#include <cstdint>
#include <vector>

#include "lib/comm/transport.h"
#include "lib/eval/spec_decode.h"
#include "lib/model/generate.h"
#include "lib/model/target.h"

namespace dflash::eval {

struct TreeOptions {
  int budget = 0;  // nodes besides the root (≥ 1); B − 1 with topk 1 is the chain
  int topk = 4;    // candidates per block position (≥ 1)
};

// Nodes in creation order: node 0 is the root; a parent always comes before its children.
struct DraftTree {
  std::vector<int32_t> tokens;  // [n]
  std::vector<int> parents;     // [n]; parents[0] = −1
  std::vector<int> depth;       // [n]; depth 0 = the root
};

// The tree over `positions` = B − 1 block positions from ids/logprobs [positions, k] (TopkProposer::propose_topk:
// best first per row): the root `root`, the top-1 chain (cut at `budget` nodes), then best-first by path
// log-probability (ties: the earlier-found candidate) until `budget` nodes besides the root.
DraftTree build_draft_tree(int32_t root, const int32_t* ids, const float* logprobs, int positions, int k, int budget);

// Collective over `tp`, as speculative_generate (which it equals token for token); `proposer` on rank 0 only. The
// target must be dense. result.tree_nodes counts the verified nodes.
SpecResult speculative_generate_tree(model::TargetModel& target, model::GreedyHead& head, comm::Transport& tp,
                                     TopkProposer* proposer, const std::vector<int32_t>& prompt,
                                     const SpecOptions& options, const TreeOptions& tree);

}  // namespace dflash::eval
