#include "lib/model/target_shard.h"

#include <fmt/format.h>

#include "lib/comm/shard.h"
#include "lib/core/error.h"

namespace dflash::model {

std::string TargetShard::describe() const {
  return fmt::format("q heads [{},{}) kv heads [{},{}){} mlp [{},{})", q_begin, q_begin + q_count, kv_begin,
                     kv_begin + kv_count, kv_replicated ? " (replicated)" : "", mlp_begin, mlp_end);
}

TargetShard plan_target_shard(const QwenConfig& c, int tp, int rank, int mlp_grain) {
  DFLASH_CHECK(tp >= 1 && rank >= 0 && rank < tp, "target shard: rank {} outside a TP group of {}", rank, tp);
  DFLASH_CHECK(tp <= c.heads,
               "target shard: TP size {} exceeds num_attention_heads {}: every TP rank needs at least one Q head; "
               "use target_tp ≤ {}",
               tp, c.heads, c.heads);
  const int g = c.q_per_kv();
  TargetShard s;
  s.tp = tp;
  s.rank = rank;
  if (c.kv_heads >= tp) {
    // whole KV groups: 8 groups over 5 ranks → [2,2,2,1,1]
    const comm::Range kv = comm::shard_range(c.kv_heads, 1, tp, rank);
    s.kv_begin = int(kv.begin);
    s.kv_count = int(kv.size());
    s.q_begin = s.kv_begin * g;
    s.q_count = s.kv_count * g;
  } else {
    // KV head h is held by the ranks shard_range(tp, 1, kv_heads, h), which split its g Q heads among them
    int h = 0;
    comm::Range ranks = comm::shard_range(tp, 1, c.kv_heads, 0);
    while (rank >= ranks.end) ranks = comm::shard_range(tp, 1, c.kv_heads, ++h);
    const comm::Range q = comm::shard_range(g, 1, int(ranks.size()), int(rank - ranks.begin));
    s.kv_begin = h;
    s.kv_count = 1;
    s.kv_replicated = true;
    s.q_begin = h * g + int(q.begin);
    s.q_count = int(q.size());
  }
  const comm::Range mlp = comm::shard_range(c.intermediate, mlp_grain, tp, rank);
  s.mlp_begin = mlp.begin;
  s.mlp_end = mlp.end;
  return s;
}

}  // namespace dflash::model
