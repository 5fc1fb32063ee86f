// Tree verification (lib/eval/spec_tree.h, kernels/cpu/attention_tree.h): the tree attention kernel against its
// plain reference and, on a chain, bit for bit against the decode kernel; TargetModel::forward_tree against
// forward_cached along each root-to-node path; TargetModel::keep_cache_path leaves the cache of the
// accepted path; the draft tree
// holds the top-1 chain and then the best nodes by path log-probability.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/attention_tree.h"
#include "lib/comm/transport.h"
#include "lib/core/rng.h"
#include "lib/model/random_target.h"
#include "lib/eval/spec_tree.h"
#include "lib/model/target.h"
#include "tests/unit/test_util.h"

using namespace dflash;

namespace {

template <typename T>
std::vector<T> randn(size_t n, Rng& rng) {
  std::vector<T> x(n);
  for (auto& v : x) v = T(rng.normal());
  return x;
}

// node i's parent: a random earlier node (a bushy tree: several children per node, several depths)
std::vector<int> random_tree(int n, Rng& rng) {
  std::vector<int> parents(static_cast<size_t>(n), -1);
  for (int i = 1; i < n; ++i) parents[size_t(i)] = int(rng.below(uint64_t(i)));
  return parents;
}

std::vector<int> path_to(const std::vector<int>& parents, int node) {
  std::vector<int> path;
  for (int a = node; a >= 0; a = parents[size_t(a)]) path.push_back(a);
  std::reverse(path.begin(), path.end());
  return path;
}

model::RandomTargetSpec small_target(bool hybrid) { return test::small_random_target(hybrid, 3, 9); }

}  // namespace

TEST_CASE("attention_tree: matches the dense-mask reference on random trees, and a chain is the decode kernel") {
  Rng rng(21);
  const int qh = 6, kvh = 2, hd = 8;
  for (int past : {0, 1, 13}) {
    for (int n : {1, 2, 9, 17}) {
      CAPTURE(past);
      CAPTURE(n);
      const auto parents = random_tree(n, rng);
      auto q = randn<double>(size_t(n) * qh * hd, rng), k = randn<double>(size_t(past + n) * kvh * hd, rng),
           v = randn<double>(k.size(), rng);
      std::vector<double> out(q.size()), ref(q.size());
      cpu::attention_tree_forward<double>(out.data(), q.data(), k.data(), v.data(), parents.data(), n, past, qh, kvh,
                                          hd);
      cpu::attention_tree_reference<double>(ref.data(), q.data(), k.data(), v.data(), parents.data(), n, past, qh,
                                            kvh, hd);
      CHECK(test::max_rel_diff(out, ref) < 1e-13);
      // the root sees only the cache and itself; a node with another node's path sees the same keys: equal rows
      // when their queries are equal
      if (n >= 3 && parents[2] == parents[1]) {
        std::vector<double> q2 = q;
        std::copy_n(&q[1 * qh * hd], qh * hd, &q2[2 * qh * hd]);
        std::copy_n(&k[size_t(past + 1) * kvh * hd], kvh * hd, &k[size_t(past + 2) * kvh * hd]);
        std::copy_n(&v[size_t(past + 1) * kvh * hd], kvh * hd, &v[size_t(past + 2) * kvh * hd]);
        cpu::attention_tree_forward<double>(out.data(), q2.data(), k.data(), v.data(), parents.data(), n, past, qh,
                                            kvh, hd);
        for (int i = 0; i < qh * hd; ++i) CHECK(out[size_t(qh * hd + i)] == out[size_t(2 * qh * hd + i)]);
      }
      // a chain: every node's parent the one before it = causal attention after the cache, bit for bit
      std::vector<int> chain(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) chain[size_t(i)] = i - 1;
      auto qf = randn<float>(size_t(n) * qh * hd, rng), kf = randn<float>(size_t(past + n) * kvh * hd, rng),
           vf = randn<float>(kf.size(), rng);
      std::vector<float> tree_out(qf.size()), decode_out(qf.size());
      cpu::attention_tree_forward<float>(tree_out.data(), qf.data(), kf.data(), vf.data(), chain.data(), n, past, qh,
                                         kvh, hd);
      cpu::attention_decode_forward<float>(decode_out.data(), qf.data(), kf.data(), vf.data(), n, past, qh, kvh, hd);
      CHECK(tree_out == decode_out);
    }
  }
}

TEST_CASE("forward_tree: each node's state is forward_cached's along its path, and keep_cache_path keeps that path") {
  const auto spec = small_target(false);
  const auto dir = test::scratch_dir("tree_target");
  model::write_random_target(dir.string(), spec);
  comm::SelfTransport self;
  model::TargetModel target(dir.string(), self);
  const int H = spec.hidden, past = 11, n = 12;
  const std::vector<int> taps_ids = {0, 2};
  const int W = int(taps_ids.size()) * H;
  Rng rng(5);
  std::vector<int32_t> prefix(static_cast<size_t>(past)), nodes(static_cast<size_t>(n));
  for (auto& t : prefix) t = int32_t(rng.below(uint64_t(spec.vocab)));
  for (auto& t : nodes) t = int32_t(rng.below(uint64_t(spec.vocab)));
  const auto parents = random_tree(n, rng);
  model::TargetCache base;
  std::vector<float> h(size_t(past + n) * H), taps(size_t(past + n) * W);
  target.forward_cached(prefix.data(), past, base, h.data());

  model::TargetCache tree_cache = target.copy_cache(base);
  std::vector<float> tree_h(size_t(n) * H), tree_taps(size_t(n) * W);
  target.forward_tree(nodes.data(), parents.data(), n, tree_cache, taps_ids, tree_taps.data(), tree_h.data());
  CHECK(tree_cache.length == past + n);
  for (int node = 0; node < n; ++node) {
    CAPTURE(node);
    const auto path = path_to(parents, node);
    std::vector<int32_t> tokens;
    for (int a : path) tokens.push_back(nodes[size_t(a)]);
    model::TargetCache c = target.copy_cache(base);
    target.forward_cached(tokens.data(), int(tokens.size()), c, taps_ids, taps.data(), h.data());
    const size_t last = tokens.size() - 1;
    const std::vector<float> want_h(h.begin() + long(last * H), h.begin() + long((last + 1) * H));
    const std::vector<float> got_h(tree_h.begin() + long(size_t(node) * H), tree_h.begin() + long(size_t(node + 1) * H));
    CHECK(test::max_rel_diff(got_h, want_h) < 1e-5);
    const std::vector<float> want_t(taps.begin() + long(last * W), taps.begin() + long((last + 1) * W));
    const std::vector<float> got_t(tree_taps.begin() + long(size_t(node) * W),
                                   tree_taps.begin() + long(size_t(node + 1) * W));
    CHECK(test::max_rel_diff(got_t, want_t) < 1e-5);
  }

  // keep the path to the deepest node, then continue: the same as a cache that only ever saw that path
  int deepest = 0;
  for (int i = 0; i < n; ++i)
    if (path_to(parents, i).size() > path_to(parents, deepest).size()) deepest = i;
  const auto path = path_to(parents, deepest);
  target.keep_cache_path(tree_cache, past, path);
  CHECK(tree_cache.length == past + int(path.size()));
  model::TargetCache straight = target.copy_cache(base);
  std::vector<int32_t> tokens;
  for (int a : path) tokens.push_back(nodes[size_t(a)]);
  target.forward_cached(tokens.data(), int(tokens.size()), straight, h.data());
  for (int l = 0; l < spec.layers; ++l) {
    const auto keys = target.read_cache(straight, l, model::TargetCachePart::keys);
    REQUIRE(keys.size() == size_t(past + int(path.size())) * size_t(spec.kv_heads * spec.head_dim));
    CHECK(test::max_rel_diff(target.read_cache(tree_cache, l, model::TargetCachePart::keys), keys) < 1e-5);
    CHECK(test::max_rel_diff(target.read_cache(tree_cache, l, model::TargetCachePart::values),
                  target.read_cache(straight, l, model::TargetCachePart::values)) < 1e-5);
  }
  const int32_t next[2] = {3, 7};
  std::vector<float> a(2 * size_t(H)), b(2 * size_t(H));
  target.forward_cached(next, 2, tree_cache, a.data());
  target.forward_cached(next, 2, straight, b.data());
  CHECK(test::max_rel_diff(a, b) < 1e-5);

  // a chain through forward_tree is forward_cached, bit for bit
  std::vector<int> chain(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) chain[size_t(i)] = i - 1;
  model::TargetCache c1 = target.copy_cache(base), c2 = target.copy_cache(base);
  std::vector<float> h1(size_t(n) * H), h2(size_t(n) * H), t1(size_t(n) * W), t2(size_t(n) * W);
  target.forward_tree(nodes.data(), chain.data(), n, c1, taps_ids, t1.data(), h1.data());
  target.forward_cached(nodes.data(), n, c2, taps_ids, t2.data(), h2.data());
  CHECK(h1 == h2);
  CHECK(t1 == t2);

  // bad trees are programming errors
  std::vector<int> bad = parents;
  bad[3] = 5;
  model::TargetCache c3 = target.copy_cache(base);
  CHECK_THROWS(target.forward_tree(nodes.data(), bad.data(), n, c3, {}, nullptr, h1.data()));
}

TEST_CASE("forward_tree: a hybrid target is refused (the DeltaNet state cannot branch)") {
  const auto spec = small_target(true);
  const auto dir = test::scratch_dir("tree_hybrid");
  model::write_random_target(dir.string(), spec);
  comm::SelfTransport self;
  model::TargetModel target(dir.string(), self);
  const int32_t tokens[3] = {1, 2, 3};
  const int parents[3] = {-1, 0, 0};
  model::TargetCache cache;
  std::vector<float> h(3 * size_t(spec.hidden));
  CHECK_THROWS_WITH(target.forward_tree(tokens, parents, 3, cache, {}, nullptr, h.data()),
                    doctest::Contains("Gated DeltaNet"));
}

TEST_CASE("build_draft_tree: the top-1 chain, then the best nodes by path log-probability") {
  Rng rng(3);
  const int positions = 4, k = 3;
  std::vector<int32_t> ids(size_t(positions) * k);
  std::vector<float> lp(ids.size());
  for (int d = 0; d < positions; ++d) {
    std::vector<float> row(static_cast<size_t>(k));
    for (auto& x : row) x = -float(0.05 + 3 * rng.uniform());
    std::sort(row.rbegin(), row.rend());  // best first, as propose_topk gives them
    for (int r = 0; r < k; ++r) {
      ids[size_t(d * k + r)] = int32_t(100 * (d + 1) + r);
      lp[size_t(d * k + r)] = row[size_t(r)];
    }
  }
  // every possible node as its rank path, with its path log-probability
  struct Node {
    std::vector<int> ranks;
    double score;
  };
  std::vector<Node> all;
  std::vector<Node> level = {{{}, 0.0}};
  for (int d = 0; d < positions; ++d) {
    std::vector<Node> next;
    for (const Node& p : level)
      for (int r = 0; r < k; ++r) {
        Node c{p.ranks, p.score + lp[size_t(d * k + r)]};
        c.ranks.push_back(r);
        next.push_back(c);
        all.push_back(c);
      }
    level = next;
  }
  auto ranks_of = [&](const eval::DraftTree& t, int node) {
    std::vector<int> r;
    for (int a = node; a > 0; a = t.parents[size_t(a)])
      r.push_back(int(t.tokens[size_t(a)] - ids[size_t((t.depth[size_t(a)] - 1) * k)]));  // ids are 100·d + rank
    std::reverse(r.begin(), r.end());
    return r;
  };
  for (int budget : {1, 2, 4, 5, 9, 20, 200}) {
    CAPTURE(budget);
    const eval::DraftTree t = eval::build_draft_tree(7, ids.data(), lp.data(), positions, k, budget);
    const int n = int(t.tokens.size());
    CHECK(n == 1 + std::min(budget, int(all.size())));
    CHECK(t.tokens[0] == 7);
    CHECK(t.parents[0] == -1);
    std::set<std::vector<int>> got;
    for (int i = 1; i < n; ++i) {
      REQUIRE(t.parents[size_t(i)] >= 0);
      REQUIRE(t.parents[size_t(i)] < i);
      CHECK(t.depth[size_t(i)] == t.depth[size_t(t.parents[size_t(i)])] + 1);
      got.insert(ranks_of(t, i));
    }
    CHECK(int(got.size()) == n - 1);  // no node twice
    // the chain: nodes 1..min(budget, positions) are the top-1 tokens, each the child of the one before
    const int chain = std::min(budget, positions);
    for (int d = 1; d <= chain; ++d) {
      CHECK(t.parents[size_t(d)] == d - 1);
      CHECK(t.tokens[size_t(d)] == ids[size_t((d - 1) * k)]);
    }
    // the rest: exactly the best non-chain nodes by path log-probability (all scores differ)
    std::vector<Node> others;
    for (const Node& x : all)
      if (std::count(x.ranks.begin(), x.ranks.end(), 0) != int(x.ranks.size())) others.push_back(x);
    std::sort(others.begin(), others.end(), [](const Node& a, const Node& b) { return a.score > b.score; });
    std::set<std::vector<int>> want;
    for (int d = 1; d <= chain; ++d) want.insert(std::vector<int>(size_t(d), 0));
    for (int i = 0; i < n - 1 - chain; ++i) want.insert(others[size_t(i)].ranks);
    CHECK(got == want);
  }
  // top-k 1, budget B − 1: the chain itself
  std::vector<int32_t> top1;
  std::vector<float> top1_lp;
  for (int d = 0; d < positions; ++d) top1.push_back(ids[size_t(d * k)]), top1_lp.push_back(lp[size_t(d * k)]);
  const eval::DraftTree c = eval::build_draft_tree(7, top1.data(), top1_lp.data(), positions, 1, positions);
  CHECK(std::vector<int32_t>(c.tokens.begin() + 1, c.tokens.end()) == top1);
  CHECK(c.parents == std::vector<int>({-1, 0, 1, 2, 3}));
}
