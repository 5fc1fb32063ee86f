#pragma once
// Which part of the Qwen target one TP rank holds. Attention splits by whole KV groups; with fewer KV heads than
// ranks each KV head is replicated on a run of ranks that split its Q heads. Gated DeltaNet (Qwen3.5/3.6 linear
// attention) follows the same rule with key heads as the groups and value heads as their members (the conv
// channels of q, k and v go with their heads). The MLP intermediate dimension is split by shard_range with a tile
// grain. Qwen3-MoE experts split whole (expert parallel inside the TP group): rank r holds the contiguous experts
// shard_range(num_experts, 1, tp, r) (uneven counts allowed: 6 over 5 → 2,1,1,1,1), the router is replicated.
// docs/target.md states the rule with worked examples.
#include <cstdint>
#include <string>

#include "lib/model/qwen_config.h"

namespace dflash::model {

// `groups` groups of `per_group` members each over `tp` ranks. groups ≥ tp: whole groups per rank
// (shard_range(groups, 1, tp, rank)). groups < tp: each rank holds one group, group h on the run of ranks
// shard_range(tp, 1, groups, h), which split its members. Every member is on exactly one rank, inside a group
// that rank holds.
struct GroupedSplit {
  int group_begin = 0, group_count = 0;    // groups [group_begin, group_begin + group_count)
  int member_begin = 0, member_count = 0;  // global member indices [member_begin, member_begin + member_count)
  bool replicated = false;                 // groups < tp: this rank's group is also held by other ranks
};
GroupedSplit split_grouped(int groups, int per_group, int tp, int rank);

struct TargetShard {
  int tp = 1, rank = 0;
  int q_begin = 0, q_count = 0;    // Q heads [q_begin, q_begin + q_count)
  int kv_begin = 0, kv_count = 0;  // KV heads [kv_begin, kv_begin + kv_count); every local Q head maps inside
  bool kv_replicated = false;      // kv_heads < tp: this rank's one KV head is also held by other ranks
  int64_t mlp_begin = 0, mlp_end = 0;  // intermediate channels [mlp_begin, mlp_end) (may be empty); MoE
                                       // hybrids: the shared expert's channels
  GroupedSplit linear;                 // Gated DeltaNet: groups = key heads, members = value heads (hybrid only)
  int expert_begin = 0, expert_count = 0;  // MoE: experts [expert_begin, expert_begin + expert_count) (may be none)
  std::string describe() const;  // "q heads [0,6) kv heads [0,2) mlp [0,128)" (+ " linear k [..) v [..)", " experts [..)")
};

// What one rank computes per token of a forward over sequences of `seq_len`: how the split balances the work.
struct ShardCost {
  // linear weights that a token multiplies (= GEMM multiply-adds per token); norms and embedding excluded. MoE
  // layers count the router and the held experts' weights × k / E (the expected share under uniform routing).
  double weight_params = 0;
  double expert_params = 0;  // MoE: the expert weights this rank holds (all layers)
  double mixer_flops = 0;    // per token: causal attention scores + values (4·hd·heads·S/2) and the delta rule
  double flops_per_token() const { return 2 * weight_params + mixer_flops; }
};
ShardCost shard_cost(const QwenConfig& c, const TargetShard& s, int seq_len);

// Throws (naming the sizes and the fix) when tp < 1, rank outside [0, tp), or tp > num_attention_heads (or, for
// hybrids, tp > linear_num_value_heads).
TargetShard plan_target_shard(const QwenConfig& c, int tp, int rank, int mlp_grain);

}  // namespace dflash::model
