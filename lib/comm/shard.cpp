#include "lib/comm/shard.h"

#include <algorithm>

#include "lib/core/error.h"

namespace dflash::comm {

Range shard_range(int64_t total, int64_t grain, int world, int rank) {
  DFLASH_CHECK(total >= 0 && grain >= 1 && world >= 1 && rank >= 0 && rank < world,
               "shard_range(total={}, grain={}, world={}, rank={}): need total ≥ 0, grain ≥ 1, 0 ≤ rank < world",
               total, grain, world, rank);
  const int64_t units = (total + grain - 1) / grain;
  const int64_t base = units / world, extra = units % world;
  const int64_t ub = rank * base + std::min<int64_t>(rank, extra);
  const int64_t ue = ub + base + (rank < extra ? 1 : 0);
  return {std::min(total, ub * grain), std::min(total, ue * grain)};
}

}  // namespace dflash::comm
