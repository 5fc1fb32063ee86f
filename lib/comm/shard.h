#pragma once
// How one dimension is split over the ranks of a group: every split dimension (MLP intermediate, KV groups,
// rows of a packet) goes through shard_range so that all of them agree on the rule.
#include <cstdint>

namespace dflash::comm {

struct Range {
  int64_t begin = 0, end = 0;  // [begin, end)
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// [begin, end) of `rank`'s share of `total` items split over `world` ranks in units of `grain` items:
// the ceil(total / grain) units are split as evenly as possible, the first (units % world) ranks taking one
// more; boundaries are multiples of grain except the last end, which is `total`. Ranks past the end get an empty
// range. Every item is covered exactly once. Throws on total < 0, grain < 1, world < 1 or rank outside [0, world).
Range shard_range(int64_t total, int64_t grain, int world, int rank);

}  // namespace dflash::comm
