// dflash_bench drafter: forward + backward of the drafter over one sequence's anchors, GFLOP/s achieved, and the
// ratio to this machine's sgemm rate measured in the same run.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "apps/dflash_bench/bench.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/core/memory.h"
#include "lib/core/rng.h"
#include "lib/core/timer.h"
#include "lib/model/drafter.h"

namespace dflash::bench {

int run_drafter(int argc, char** argv) {
  CliApp app("Times the drafter's forward + backward over one sequence's anchors against this machine's sgemm rate.",
             "dflash_bench drafter");
  model::DrafterConfig c;
  int S = 2048, N = 128, reps = 3, window = 0;
  uint64_t seed = 1;
  c.hidden = 1024, c.layers = 2, c.heads = 16, c.kv_heads = 4, c.head_dim = 64, c.intermediate = 2816;
  c.block_size = 16, c.n_taps = 5;
  app.add_option("--seq", S, "sequence length")->check(positive_number());
  app.add_option("--anchors", N, "anchors (blocks) drawn from the sequence")->check(positive_number());
  app.add_option("--block", c.block_size, "block size")->check(positive_number());
  app.add_option("--hidden", c.hidden, "hidden size");
  app.add_option("--layers", c.layers, "drafter layers");
  app.add_option("--heads", c.heads, "attention heads");
  app.add_option("--kv-heads", c.kv_heads, "key/value heads");
  app.add_option("--head-dim", c.head_dim, "head dimension");
  app.add_option("--intermediate", c.intermediate, "MLP width");
  app.add_option("--taps", c.n_taps, "tapped target layers");
  app.add_option("--window", window, "sliding attention window (0 = none)")->check(non_negative_number());
  app.add_option("--reps", reps, "timed repetitions (best of)")->check(positive_number());
  app.add_option("--seed", seed, "random seed");
  if (!parse_command_line(app, argc, argv)) return 0;
  c.vocab = 1024;  // only the embedding rows the block tokens touch matter here
  c.mask_token_id = c.vocab - 1;
  c.window.assign(c.layers, window);
  c.validate();

  // anchors: N distinct positions drawn uniformly from [0, S - 1), sorted (the training recipe's shape)
  Rng rng(seed, 3);
  std::vector<int> pool(std::max(S - 1, 1));
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = int(i);
  DFLASH_USER_CHECK(N <= int(pool.size()), "--anchors {} exceeds the {} candidate positions of --seq {}", N, pool.size(),
               S);
  for (int i = 0; i < N; ++i) std::swap(pool[i], pool[i + rng.below(pool.size() - i)]);
  std::vector<int> anchors(pool.begin(), pool.begin() + N);
  std::sort(anchors.begin(), anchors.end());

  const size_t rss0 = resident_bytes();
  model::DrafterParams<float> w(c), g(c);
  w.init_random(seed, 0.02);
  std::vector<float> taps(size_t(S) * c.n_taps * c.hidden), embed(size_t(c.vocab) * c.hidden);
  for (auto& x : taps) x = float(rng.normal());
  for (auto& x : embed) x = float(0.02 * rng.normal());
  std::vector<int32_t> tokens(S);
  for (auto& t : tokens) t = int32_t(rng.below(c.vocab - 1));
  model::DrafterInputs<float> in{taps.data(), tokens.data(), S, anchors.data(), N, embed.data()};
  std::vector<float> d_out(size_t(N) * c.block_size * c.hidden);
  for (auto& x : d_out) x = float(rng.normal());

  model::DrafterActivations<float> acts;
  model::drafter_forward(c, w, in, acts);  // warm-up: first-touch page faults and BLAS thread start-up
  model::drafter_backward(c, w, in, acts, d_out.data(), g);
  double t_fwd = 1e30, t_bwd = 1e30;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    model::drafter_forward(c, w, in, acts);
    t_fwd = std::min(t_fwd, t.seconds());
    t.reset();
    model::drafter_backward(c, w, in, acts, d_out.data(), g);
    t_bwd = std::min(t_bwd, t.seconds());
  }
  const size_t rss = peak_resident_bytes();
  const model::DrafterFlops f = model::drafter_flops(c, S, anchors);
  const int NB = N * c.block_size;
  const double sgemm = sgemm_gflops(NB, c.intermediate, c.hidden);  // the drafter's largest GEMM shape
  const double gf_fwd = f.forward / t_fwd * 1e-9, gf_bwd = f.backward / t_bwd * 1e-9;
  const double gf_all = (f.forward + f.backward) / (t_fwd + t_bwd) * 1e-9;

  std::printf("drafter: S=%d anchors=%d B=%d (rows %d) H=%d L=%d heads=%d/%d D=%d I=%d taps=%d window=%d\n", S, N,
              c.block_size, NB, c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim, c.intermediate, c.n_taps,
              c.window[0]);
  std::printf("  forward   %8.1f ms  %8.2f GFLOP  %7.1f GFLOP/s\n", t_fwd * 1e3, f.forward * 1e-9, gf_fwd);
  std::printf("  backward  %8.1f ms  %8.2f GFLOP  %7.1f GFLOP/s\n", t_bwd * 1e3, f.backward * 1e-9, gf_bwd);
  std::printf("  fwd+bwd   %8.1f ms  %8.2f GFLOP  %7.1f GFLOP/s\n", (t_fwd + t_bwd) * 1e3,
              (f.forward + f.backward) * 1e-9, gf_all);
  std::printf("  sgemm rate (M=%d N=%d K=%d, same run): %.1f GFLOP/s\n", NB, c.intermediate, c.hidden, sgemm);
  std::printf("  ratio to sgemm: %.2f   peak RSS %.0f MiB (process start %.0f MiB)\n", gf_all / sgemm,
              rss / 1048576.0, rss0 / 1048576.0);
  return 0;
}

}  // namespace dflash::bench
