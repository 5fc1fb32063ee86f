// shard_range, the rank layout and the target's head/channel split: every item covered exactly once.
#include <doctest/doctest.h>

#include <set>
#include <vector>

#include "lib/comm/layout.h"
#include "lib/comm/shard.h"
#include "lib/core/error.h"
#include "lib/model/target_shard.h"

using namespace dflash;

TEST_CASE("shard_range: covers every item exactly once, grain-aligned and balanced, over a sweep") {
  for (int64_t total = 0; total <= 70; ++total) {
    for (int64_t grain = 1; grain <= 9; ++grain) {
      for (int world = 1; world <= 8; ++world) {
        int64_t next = 0, min_units = INT64_MAX, max_units = 0;
        for (int rank = 0; rank < world; ++rank) {
          const comm::Range r = comm::shard_range(total, grain, world, rank);
          REQUIRE(r.begin == next);  // contiguous, in rank order: no gap, no overlap
          REQUIRE(r.end >= r.begin);
          REQUIRE((r.begin % grain == 0 || r.begin == total));
          REQUIRE((r.end % grain == 0 || r.end == total));
          const int64_t units = (r.size() + grain - 1) / grain;
          min_units = std::min(min_units, units);
          max_units = std::max(max_units, units);
          next = r.end;
        }
        REQUIRE(next == total);
        REQUIRE(max_units - min_units <= 1);
      }
    }
  }
  CHECK(comm::shard_range(8, 1, 5, 0) == comm::Range{0, 2});
  CHECK(comm::shard_range(8, 1, 5, 4) == comm::Range{7, 8});
  CHECK(comm::shard_range(25600, 64, 5, 4) == comm::Range{20480, 25600});
  CHECK(comm::shard_range(100, 64, 3, 2) == comm::Range{100, 100});  // 2 units over 3 ranks: the last is empty
  CHECK_THROWS_AS(comm::shard_range(10, 0, 2, 0), Error);
  CHECK_THROWS_AS(comm::shard_range(10, 1, 2, 2), Error);
}

TEST_CASE("rank layout: default 5 + 3 and two target groups") {
  const auto t3 = comm::make_rank_layout(5, 1, 3, 8, 3);
  CHECK(t3.role == comm::Role::Target);
  CHECK(t3.group == 0);
  CHECK(t3.tp_rank == 3);
  CHECK(t3.dp_rank == -1);
  CHECK(t3.drafters_of_group(0) == std::vector<int>{0, 1, 2});
  const auto d6 = comm::make_rank_layout(5, 1, 3, 8, 6);
  CHECK(d6.role == comm::Role::Drafter);
  CHECK(d6.dp_rank == 1);
  CHECK(d6.group == 0);
  CHECK(d6.drafter_world_rank(1) == 6);
  // 2 groups of TP 2 + 3 drafters: world 7; drafter d is fed by group d % 2
  const auto g1 = comm::make_rank_layout(2, 2, 3, 7, 3);
  CHECK(g1.role == comm::Role::Target);
  CHECK(g1.group == 1);
  CHECK(g1.tp_rank == 1);
  CHECK(g1.drafters_of_group(0) == std::vector<int>{0, 2});
  CHECK(g1.drafters_of_group(1) == std::vector<int>{1});
  const auto d2 = comm::make_rank_layout(2, 2, 3, 7, 6);
  CHECK(d2.dp_rank == 2);
  CHECK(d2.group == 0);
  CHECK(d2.describe() == "[rank 6 | drafter | dp 2]");
  CHECK_THROWS_WITH_AS(comm::make_rank_layout(5, 1, 3, 6, 0),
                       doctest::Contains("the world has 6 ranks but target_tp 5 × target_groups 1 + drafter_dp 3 = 8"),
                       Error);
  CHECK_THROWS_WITH_AS(comm::make_rank_layout(2, 3, 2, 8, 0), doctest::Contains("would feed no drafter"), Error);
}

namespace {

model::QwenConfig shape(int heads, int kv_heads, int intermediate) {
  model::QwenConfig c;
  c.hidden = 64;
  c.layers = 1;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = 16;
  c.intermediate = intermediate;
  c.vocab = 32;
  return c;
}

// every Q head on exactly one rank, each rank's Q heads inside the KV heads it holds; returns per-rank Q counts
std::vector<int> check_plan(const model::QwenConfig& c, int tp) {
  std::vector<int> owner(size_t(c.heads), -1), counts;
  int64_t mlp_next = 0;
  for (int r = 0; r < tp; ++r) {
    const auto s = model::plan_target_shard(c, tp, r, 8);
    REQUIRE(s.q_count >= 1);
    REQUIRE(s.kv_count >= 1);
    for (int h = s.q_begin; h < s.q_begin + s.q_count; ++h) {
      REQUIRE(owner[size_t(h)] == -1);
      owner[size_t(h)] = r;
      const int kv = h / c.q_per_kv();
      REQUIRE(kv >= s.kv_begin);
      REQUIRE(kv < s.kv_begin + s.kv_count);
    }
    REQUIRE(s.mlp_begin == mlp_next);
    mlp_next = s.mlp_end;
    counts.push_back(s.q_count);
  }
  for (int o : owner) REQUIRE(o >= 0);
  REQUIRE(mlp_next == c.intermediate);
  return counts;
}

}  // namespace

TEST_CASE("target shard: whole KV groups, replication, and every head exactly once") {
  // Qwen3-32B: 64 Q / 8 KV over 5 ranks → KV groups [2,2,2,1,1], Q heads [16,16,16,8,8]
  CHECK(check_plan(shape(64, 8, 25600), 5) == std::vector<int>{16, 16, 16, 8, 8});
  CHECK(model::plan_target_shard(shape(64, 8, 25600), 5, 3, 64).kv_begin == 6);
  // 24 Q / 4 KV over 5: KV 0 on ranks {0,1} (3 + 3 Q heads), KV 1..3 on one rank each (6 Q heads)
  CHECK(check_plan(shape(24, 4, 96), 5) == std::vector<int>{3, 3, 6, 6, 6});
  const auto r1 = model::plan_target_shard(shape(24, 4, 96), 5, 1, 8);
  CHECK(r1.kv_begin == 0);
  CHECK(r1.kv_replicated);
  CHECK(r1.q_begin == 3);
  // 12 Q / 2 KV over 5: KV 0 on 3 ranks, KV 1 on 2
  CHECK(check_plan(shape(12, 2, 40), 5) == std::vector<int>{2, 2, 2, 3, 3});
  for (int heads : {4, 8, 16, 24}) {
    for (int kv : {1, 2, 4, 8}) {
      if (heads % kv) continue;
      for (int tp = 1; tp <= std::min(heads, 8); ++tp) check_plan(shape(heads, kv, 100), tp);
    }
  }
  CHECK_THROWS_WITH_AS(model::plan_target_shard(shape(4, 2, 64), 5, 0, 8),
                       doctest::Contains("TP size 5 exceeds num_attention_heads 4"), Error);
}
