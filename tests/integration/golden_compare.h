#pragma once
// What the golden-fixture programs (hybrid_golden_check, tests/golden_moe/moe_golden_check) measure against the
// tensors transformers wrote: the max absolute difference and rel = max_i |ours_i − hf_i| / max_i |hf_i| of one
// tensor, and whether every MPI rank holds bit-identical copies.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "lib/core/error.h"

namespace dflash::test {

struct GoldenDiff {
  double abs = 0, rel = 0;
};

inline GoldenDiff golden_diff(const float* ours, const float* hf, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(double(ours[i]) - double(hf[i])));
    den = std::max(den, std::fabs(double(hf[i])));
  }
  DFLASH_CHECK(den > 0, "golden tensor is all zeros: the check would be meaningless");
  return {num, num / den};
}

inline bool same_on_all_ranks(const std::vector<float>& v) {
  std::vector<float> root(v);
  MPI_Bcast(root.data(), int(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int differs = std::memcmp(root.data(), v.data(), v.size() * sizeof(float)) != 0, any = 0;
  MPI_Allreduce(&differs, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any == 0;
}

}  // namespace dflash::test
