#pragma once
// The greedy-decoding argmax rule, host and device: the only copy. The largest non-NaN value of a row and its first
// index (index −1, value −inf while there is none). The CPU (kernels/cpu/elementwise.cpp: one running ArgMax per
// row, elements in order) and CUDA (kernels/cuda/argmax.cu: one per thread over a strided slice, then a fixed tree
// of merges) both reduce with it, so ties and NaNs resolve the same way on every backend and split.
#include <math.h>

#include "kernels/math/hd.h"

namespace dflash::kernels::math {

template <typename F>
struct ArgMax {
  F value = -INFINITY;
  int index = -1;
  // elements in increasing index order: strict >, so the first of equal values stays; x == x: not NaN
  DFLASH_HD void add(F x, int i) {
    if (x == x && (index < 0 || x > value)) {
      value = x;
      index = i;
    }
  }
  // a partial over any other part of the row: ties go to the lower index
  DFLASH_HD void merge(const ArgMax& o) {
    if (o.index < 0) return;
    if (index < 0 || o.value > value || (o.value == value && o.index < index)) {
      value = o.value;
      index = o.index;
    }
  }
};

}  // namespace dflash::kernels::math
