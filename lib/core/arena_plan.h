#pragma once
// An arena's arrays declared once (llm.c's TENSOR_SPEC, tiny-cuda-nn's allocate_workspace_and_distribute): a model
// writes one `bind_*` function per stage that names every array with its element count, `b(p, count)`, and calls it
// with either binder. ArenaBinder hands out the pointers; ArenaMeter makes no pointers and sums the bytes the same
// calls take (Arena::footprint per array, the peak across rewinds). So a sizing function is the bind function under
// the meter, and the arena's capacity is its peak by construction, not a formula that mirrors the allocation order.
#include <algorithm>
#include <cstddef>

#include "lib/core/buffer.h"

namespace dflash {

// Pointers from the arena, in call order.
struct ArenaBinder {
  Arena& arena;
  template <typename U>
  void operator()(U*& p, size_t count) {
    p = arena.alloc<U>(count);
  }
  Arena::Mark mark() const { return arena.mark(); }
  void rewind(Arena::Mark m) { arena.rewind(m); }
};

// The same calls counted: bytes as the arena takes them (alignment included) and the peak across rewinds.
struct ArenaMeter {
  size_t used = 0, peak = 0;
  template <typename U>
  void operator()(U*& p, size_t count) {
    p = nullptr;
    used += Arena::footprint(count * sizeof(U));
    peak = std::max(peak, used);
  }
  size_t mark() const { return used; }  // as Arena::mark / rewind
  void rewind(size_t m) { used = m; }
};

// Bytes a bind function takes: `bind(meter)` under a fresh meter, its peak.
template <class BindFn>
size_t arena_bytes(BindFn&& bind) {
  ArenaMeter m;
  bind(m);
  return m.peak;
}

}  // namespace dflash
