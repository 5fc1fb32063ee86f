#include <algorithm>
#include <vector>

#include "apps/dflash_bench/bench.h"
#include "kernels/cpu/gemm.h"
#include "lib/core/rng.h"
#include "lib/core/timer.h"

namespace dflash::bench {

double sgemm_gflops(int M, int N, int K, int reps) {
  std::vector<float> A(size_t(M) * K), B(size_t(N) * K), C(size_t(M) * N);
  Rng rng(1);
  for (auto& v : A) v = float(rng.uniform() - 0.5);
  for (auto& v : B) v = float(rng.uniform() - 0.5);
  cpu::linear_forward(C.data(), A.data(), B.data(), M, K, N);  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    cpu::linear_forward(C.data(), A.data(), B.data(), M, K, N);
    best = std::min(best, t.seconds());
  }
  return 2.0 * M * N * K / best * 1e-9;
}

}  // namespace dflash::bench
