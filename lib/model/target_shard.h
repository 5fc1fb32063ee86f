#pragma once
// Which part of the Qwen3 target one TP rank holds. Attention splits by whole KV groups; with fewer KV heads than
// ranks each KV head is replicated on a run of ranks that split its Q heads. The MLP intermediate dimension is split
// by shard_range with a tile grain. docs/target.md states the rule with worked examples.
#include <cstdint>
#include <string>

#include "lib/model/qwen_config.h"

namespace dflash::model {

struct TargetShard {
  int tp = 1, rank = 0;
  int q_begin = 0, q_count = 0;    // Q heads [q_begin, q_begin + q_count)
  int kv_begin = 0, kv_count = 0;  // KV heads [kv_begin, kv_begin + kv_count); every local Q head maps inside
  bool kv_replicated = false;      // kv_heads < tp: this rank's one KV head is also held by other ranks
  int64_t mlp_begin = 0, mlp_end = 0;  // intermediate channels [mlp_begin, mlp_end) (may be empty)
  std::string describe() const;        // "q heads [0,6) kv heads [0,2) mlp [0,128)"
};

// Throws (naming the sizes and the fix) when tp < 1, rank outside [0, tp), or tp > num_attention_heads.
TargetShard plan_target_shard(const QwenConfig& c, int tp, int rank, int mlp_grain);

}  // namespace dflash::model
