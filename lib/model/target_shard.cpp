#include "lib/model/target_shard.h"

#include <algorithm>
#include <cmath>
#include <vector>

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
  if (expert_count > 0) d += fmt::format(" experts [{},{})", expert_begin, expert_begin + expert_count);
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

namespace {

// The heads of rank `rank`: attention by whole KV groups (or a replicated KV head), DeltaNet by whole key-head groups
// (or a replicated key head). No MLP yet.
TargetShard plan_heads(const QwenConfig& c, int tp, int rank) {
  TargetShard s;
  s.tp = tp;
  s.rank = rank;
  const GroupedSplit a = split_grouped(c.kv_heads, c.q_per_kv(), tp, rank);
  s.kv_begin = a.group_begin;
  s.kv_count = a.group_count;
  s.kv_replicated = a.replicated;
  s.q_begin = a.member_begin;
  s.q_count = a.member_count;
  if (c.hybrid) s.linear = split_grouped(c.linear_k_heads, c.v_per_k(), tp, rank);
  return s;
}

// Hybrids: the head splits are uneven (27B at TP 5: Q heads 3,3,6,6,6 and value heads 12,9,9,9,9), so the MLP
// channels even out the per-token weight work: each rank gets the tiles that bring its linear-weight total closest
// to the mean, as contiguous ranges in rank order. Returns rank `rank`'s channel range.
comm::Range balanced_mlp(const QwenConfig& c, int tp, int rank, int grain) {
  const int64_t tiles = (c.intermediate + grain - 1) / grain;
  const double tile_cost = 3.0 * c.hidden * grain * c.layers;  // gate, up, down rows/cols of one tile, all layers
  std::vector<double> other(static_cast<size_t>(tp));
  double total = double(c.intermediate) * 3.0 * c.hidden * c.layers;
  for (int r = 0; r < tp; ++r) {
    TargetShard s = plan_heads(c, tp, r);
    other[size_t(r)] = shard_cost(c, s, 1).weight_params;  // MLP range empty here: heads only
    total += other[size_t(r)];
  }
  std::vector<double> want(static_cast<size_t>(tp));
  double want_sum = 0;
  for (int r = 0; r < tp; ++r) want_sum += want[size_t(r)] = std::max(0.0, (total / tp - other[size_t(r)]) / tile_cost);
  // cumulative rounding keeps the ranges contiguous and covering every tile
  auto boundary = [&](int r) {
    double cum = 0;
    for (int i = 0; i < r; ++i) cum += want[size_t(i)];
    return std::min<int64_t>(c.intermediate, int64_t(std::llround(cum / want_sum * double(tiles))) * grain);
  };
  return comm::Range{boundary(rank), rank + 1 == tp ? c.intermediate : boundary(rank + 1)};
}

}  // namespace

TargetShard plan_target_shard(const QwenConfig& c, int tp, int rank, int mlp_grain) {
  DFLASH_CHECK(tp >= 1 && rank >= 0 && rank < tp, "target shard: rank {} outside a TP group of {}", rank, tp);
  DFLASH_USER_CHECK(tp <= c.heads,
               "target shard: TP size {} exceeds num_attention_heads {}: every TP rank needs at least one Q head; "
               "use target_tp ≤ {}",
               tp, c.heads, c.heads);
  DFLASH_USER_CHECK(!c.hybrid || tp <= c.linear_v_heads,
               "target shard: TP size {} exceeds linear_num_value_heads {}: every TP rank needs at least one "
               "Gated DeltaNet value head; use target_tp ≤ {}",
               tp, c.linear_v_heads, c.linear_v_heads);
  TargetShard s = plan_heads(c, tp, rank);
  // MoE hybrids have no dense MLP: the mlp range is the shared expert's channels, balanced the same way
  QwenConfig channels = c;
  if (c.shared_expert_intermediate > 0) channels.intermediate = c.shared_expert_intermediate;
  const comm::Range mlp = channels.intermediate == 0 ? comm::Range{0, 0}
                          : c.hybrid ? balanced_mlp(channels, tp, rank, mlp_grain)
                                     : comm::shard_range(channels.intermediate, mlp_grain, tp, rank);
  s.mlp_begin = mlp.begin;
  s.mlp_end = mlp.end;
  if (c.experts > 0) {  // whole experts, contiguous ranges in rank order; a rank may hold none when tp > experts
    const comm::Range e = comm::shard_range(c.experts, 1, tp, rank);
    s.expert_begin = int(e.begin);
    s.expert_count = int(e.size());
  }
  return s;
}

ShardCost shard_cost(const QwenConfig& c, const TargetShard& s, int seq_len) {
  const double H = c.hidden, hd = c.head_dim, ic = double(s.mlp_end - s.mlp_begin);
  const double qc = s.q_count, kvc = s.kv_count, gate = c.hybrid ? 2 : 1;
  const double attn_params = (gate * qc + 2 * kvc) * hd * H + qc * hd * H;
  const double attn_core = 4.0 * hd * qc * seq_len / 2;  // q·k and p·v over S/2 keys on average
  const double nk = s.linear.group_count, nv = s.linear.member_count, dk = c.linear_k_dim, dv = c.linear_v_dim;
  const double lin_params = (2 * nk * dk + nv * dv) * H + nv * dv * H + 2 * nv * H + nv * dv * H;
  // chunked delta rule (chunk 64) per value head and token: K·M₀, Q·M₀, state update (2·dk·dv each) and the
  // in-chunk products and solve (about 64 positions of dk and dv)
  const double lin_core = nv * (6 * dk * dv + 2 * 64 * (dk + dv));
  ShardCost cost;
  for (int l = 0; l < c.layers; ++l) {
    const bool lin = c.is_linear(l);
    cost.weight_params += lin ? lin_params : attn_params;
    if (c.is_moe(l)) {
      const double held = 3.0 * H * c.moe_intermediate * s.expert_count;
      cost.weight_params += double(c.experts) * H + held * c.experts_per_token / c.experts;
      if (c.shared_expert_intermediate > 0) cost.weight_params += 3 * H * ic + H;  // shared expert and its gate
      cost.expert_params += held;
    } else {
      cost.weight_params += 3 * H * ic;
    }
    cost.mixer_flops += lin ? lin_core : attn_core;
  }
  return cost;
}

}  // namespace dflash::model
