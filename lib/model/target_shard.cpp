#include "lib/model/target_shard.h"

#include <fmt/format.h>

#include "lib/comm/shard.h"
#include "lib/core/error.h"

namespace dflash::model {

std::string TargetShard::describe() const {
  std::string d = fmt::format("q heads [{},{}) kv heads [{},{}){} mlp [{},{})", q_begin, q_begin + q_count, kv_begin,
                              kv_begin + kv_count, kv_replicated ? " (replicated)" : "", mlp_begin, mlp_end);
  if (linear.member_count > 0) {
    d += fmt::format(" linear k heads [{},{}) v heads [{},{}){}", linear.group_begin,
                     linear.group_begin + linear.group_count, linear.member_begin,
                     linear.member_begin + linear.member_count, linear.replicated ? " (replicated)" : "");
  }
  return d;
}

GroupedSplit split_grouped(int groups, int per_group, int tp, int rank) {
  GroupedSplit s;
  if (groups >= tp) {
    // whole groups: 8 groups over 5 ranks → [2,2,2,1,1]
    const comm::Range g = comm::shard_range(groups, 1, tp, rank);
    s.group_begin = int(g.begin);
    s.group_count = int(g.size());
    s.member_begin = s.group_begin * per_group;
    s.member_count = s.group_count * per_group;
  } else {
    // group h is held by the ranks shard_range(tp, 1, groups, h), which split its members among them
    int h = 0;
    comm::Range ranks = comm::shard_range(tp, 1, groups, 0);
    while (rank >= ranks.end) ranks = comm::shard_range(tp, 1, groups, ++h);
    const comm::Range m = comm::shard_range(per_group, 1, int(ranks.size()), int(rank - ranks.begin));
    s.group_begin = h;
    s.group_count = 1;
    s.replicated = true;
    s.member_begin = h * per_group + int(m.begin);
    s.member_count = int(m.size());
  }
  return s;
}

TargetShard plan_target_shard(const QwenConfig& c, int tp, int rank, int mlp_grain) {
  DFLASH_CHECK(tp >= 1 && rank >= 0 && rank < tp, "target shard: rank {} outside a TP group of {}", rank, tp);
  DFLASH_CHECK(tp <= c.heads,
               "target shard: TP size {} exceeds num_attention_heads {}: every TP rank needs at least one Q head; "
               "use target_tp ≤ {}",
               tp, c.heads, c.heads);
  TargetShard s;
  s.tp = tp;
  s.rank = rank;
  const GroupedSplit a = split_grouped(c.kv_heads, c.q_per_kv(), tp, rank);
  s.kv_begin = a.group_begin;
  s.kv_count = a.group_count;
  s.kv_replicated = a.replicated;
  s.q_begin = a.member_begin;
  s.q_count = a.member_count;
  if (c.hybrid) {
    DFLASH_CHECK(tp <= c.linear_v_heads,
                 "target shard: TP size {} exceeds linear_num_value_heads {}: every TP rank needs at least one "
                 "Gated DeltaNet value head; use target_tp ≤ {}",
                 tp, c.linear_v_heads, c.linear_v_heads);
    s.linear = split_grouped(c.linear_k_heads, c.v_per_k(), tp, rank);
  }
  const comm::Range mlp = comm::shard_range(c.intermediate, mlp_grain, tp, rank);
  s.mlp_begin = mlp.begin;
  s.mlp_end = mlp.end;
  return s;
}

}  // namespace dflash::model
