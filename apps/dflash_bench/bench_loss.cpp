// dflash_bench loss: the chunked vocab loss (forward + backward) against the bound made of its own GEMMs, timed
// alone in the same run at the same shapes, and the peak resident memory the loss added on top of its inputs.
//   fused:     per chunk 2 drafter GEMMs (logits, dX) + 1 target GEMM  = 3 vocab GEMMs
//   recompute: per chunk 3 drafter GEMMs (logits twice, dX) + 2 target = 5 vocab GEMMs
//   naive:     fused with one chunk of all T rows: every [T, V] logit in memory at once (memory linear in T)
// The objective: --ce --kl --tau --cap and the acceptance-aware --tv --lk --eta --nla, --position-weight
// (decay | dpace | dpace_cumulative_confidence | dpace_continuation_value) --alpha: their extra cost is in the row
// passes only (docs/loss.md), so the bound is the same GEMMs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "apps/dflash_bench/bench.h"
#include "kernels/cpu/gemm.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/core/memory.h"
#include "lib/core/rng.h"
#include "lib/core/timer.h"
#include "lib/model/vocab_loss.h"

namespace dflash::bench {

namespace {

// Seconds of the vocab GEMMs of one chunk of n rows, timed alone (best of reps): logits [n,V] = X[n,H] Wᵀ and
// dX [n,H] = dZ[n,V] W.
struct ChunkGemmTimes {
  double logits = 0, dx = 0;          // wall seconds
  double logits_cpu = 0, dx_cpu = 0;  // process CPU seconds (all threads): less sensitive to other processes
};

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

ChunkGemmTimes best_of(const ChunkGemmTimes& a, const ChunkGemmTimes& b) {
  return {std::min(a.logits, b.logits), std::min(a.dx, b.dx), std::min(a.logits_cpu, b.logits_cpu),
          std::min(a.dx_cpu, b.dx_cpu)};
}

ChunkGemmTimes time_chunk_gemms(const float* W, int n, int H, int V, int reps) {
  std::vector<float> x(size_t(n) * H), z(size_t(n) * V), dx(size_t(n) * H);
  Rng rng(5);
  for (auto& v : x) v = float(rng.normal());
  for (auto& v : z) v = float(1e-3 * rng.normal());
  ChunkGemmTimes t{1e30, 1e30, 1e30, 1e30};
  for (int r = 0; r < reps; ++r) {
    Timer a;
    double c = cpu_seconds();
    cpu::gemm<float>(false, true, n, V, H, 1.0f, x.data(), H, W, H, 0.0f, z.data(), V);
    t.logits = std::min(t.logits, a.seconds());
    t.logits_cpu = std::min(t.logits_cpu, cpu_seconds() - c);
    a.reset();
    c = cpu_seconds();
    cpu::gemm<float>(false, false, n, H, V, 1.0f, z.data(), V, W, H, 0.0f, dx.data(), H);
    t.dx = std::min(t.dx, a.seconds());
    t.dx_cpu = std::min(t.dx_cpu, cpu_seconds() - c);
  }
  return t;
}

}  // namespace

int run_loss(int argc, char** argv) {
  CliApp app("Times forward + backward of the vocab loss in float, the same GEMMs alone (the bound), and the peak "
             "resident memory the loss added. naive = one chunk of all T rows (materialises [T, V] logits).",
             "dflash_bench loss");
  int T = 4096, H = 2048, V = 32000, B = 16, reps = 1, chunk = 1024, top_k = 5;
  std::string mode = "recompute";
  model::PositionWeight position_weight = model::PositionWeight::decay;
  double ce = 1.0, kl = 1.0, tau = 1.0, cap = 0.1, tv = 0, lk = 0, eta = 3, nla = 0, alpha = 0.5;
  uint64_t seed = 1;
  app.add_option("--T", T, "rows (anchor block positions)")->check(positive_number());
  app.add_option("--H", H, "hidden size")->check(positive_number());
  app.add_option("--V", V, "vocabulary")->check(CLI::Range(2, 1 << 30));
  app.add_option("--chunk", chunk, "rows per chunk (recompute, fused)")->check(positive_number());
  app.add_option("--mode", mode, "recompute, fused or naive")->check(CLI::IsMember({"recompute", "fused", "naive"}));
  app.add_option("--B", B, "block size")->check(CLI::Range(2, 1 << 20));
  app.add_option("--ce", ce, "cross-entropy weight");
  app.add_option("--kl", kl, "KL weight (0: no target logits)");
  app.add_option("--tau", tau, "KL temperature");
  app.add_option("--cap", cap, "CAP weight");
  app.add_option("--tv", tv, "total variation weight");
  app.add_option("--lk", lk, "LK-hybrid weight");
  app.add_option("--eta", eta, "LK-hybrid's eta");
  app.add_option("--nla", nla, "negative log-acceptance weight");
  add_named_option(app, "--position-weight", position_weight, "how a row's loss is weighted across its block");
  app.add_option("--alpha", alpha, "D-PACE's alpha");
  app.add_option("--top-k", top_k, "CAP's top k");
  app.add_option("--reps", reps, "timed repetitions (best of)")->check(positive_number());
  app.add_option("--seed", seed, "random seed");
  if (!parse_command_line(app, argc, argv)) return 0;
  model::VocabLossSettings s;
  s.mode = mode == "recompute" ? model::VocabLossMode::recompute : model::VocabLossMode::fused;
  s.chunk_size = mode == "naive" ? T : chunk;
  s.ce_weight = ce;
  s.kl_weight = kl;
  s.kl_temperature = tau;
  s.cap_weight = cap;
  s.tv_weight = tv;
  s.lk_weight = lk;
  s.lk_eta = eta;
  s.nla_weight = nla;
  s.position_weight = position_weight;
  s.dpace_alpha = alpha;
  s.top_k = top_k;
  s.block_size = B;
  const bool target = s.uses_target();
  const bool pace = position_weight != model::PositionWeight::decay;

  // Inputs: random head with logits of std ~3, blocks of B−1 rows, weights exp(−(k−1)/7) (D-PACE: 1).
  Rng rng(seed, 1);
  std::vector<float> W(size_t(V) * H), X(size_t(T) * H), Y(target ? size_t(T) * H : 0), dX(size_t(T) * H);
  const float ws = float(3.0 / std::sqrt(double(H)));
  for (auto& v : W) v = ws * float(rng.normal());
  for (auto& v : X) v = float(rng.normal());
  for (size_t i = 0; i < Y.size(); ++i) Y[i] = X[i] + 0.5f * float(rng.normal());
  std::vector<int32_t> labels(T), kpos(T), bid(T);
  std::vector<float> w(T);
  for (int r = 0; r < T; ++r) {
    labels[r] = int32_t(rng.below(uint64_t(V)));
    kpos[r] = 1 + r % (B - 1);
    bid[r] = r / (B - 1);
    w[r] = pace ? 1.0f : float(std::exp(-(kpos[r] - 1) / 7.0));
  }
  model::VocabLossBatch<float> batch;
  batch.rows = T;
  batch.hidden = X.data();
  batch.target_hidden = target ? Y.data() : nullptr;
  batch.labels = labels.data();
  batch.weights = w.data();
  batch.block_pos = kpos.data();
  batch.block_id = bid.data();
  double wsum = 0;
  for (float v : w) wsum += v;

  // Warm BLAS up (thread pool, buffers) before the memory baseline so that they are not counted as the loss's.
  { std::vector<float> a(64 * 64), c(64 * 64); cpu::linear_forward(c.data(), a.data(), a.data(), 64, 64, 64); }
  const bool reset_ok = reset_peak_resident();
  const size_t base = resident_bytes();

  model::VocabLoss<float> loss(s, W.data(), V, H);
  model::VocabLossContext ctx;
  model::VocabLossResult out;
  // The bound's GEMMs are timed before and after the loss (best of both): the machine may be shared. Under D-PACE a
  // chunk is the whole blocks of B − 1 rows that fit (at least one).
  const int C0 = std::min(s.chunk_size, T);
  const int C = pace ? std::min(T, std::max(B - 1, C0 / (B - 1) * (B - 1))) : C0, full = T / C, rest = T % C;
  ChunkGemmTimes g = time_chunk_gemms(W.data(), C, H, V, 1);
  double t_fwd = 1e30, t_bwd = 1e30, cpu_loss = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double c0 = cpu_seconds();
    Timer t;
    out = loss.forward(batch, ctx, 1.0 / wsum, dX.data());
    t_fwd = std::min(t_fwd, t.seconds());
    t.reset();
    loss.backward(batch, ctx, 1.0 / wsum, dX.data());
    t_bwd = std::min(t_bwd, t.seconds());
    cpu_loss = std::min(cpu_loss, cpu_seconds() - c0);
  }
  const size_t peak = peak_resident_bytes();
  const double added = double(peak > base ? peak - base : 0);
  const size_t scratch = loss.scratch_bytes();
  const size_t context = ctx.rows.bytes();

  // The bound: the same GEMMs alone, at the chunk shapes this run used (full chunks + the remainder chunk).
  const int per_chunk_logits = (mode == "recompute" ? 2 : 1) * (target ? 2 : 1);
  g = best_of(g, time_chunk_gemms(W.data(), C, H, V, 1));
  double bound = full * (per_chunk_logits * g.logits + g.dx);
  double bound_cpu = full * (per_chunk_logits * g.logits_cpu + g.dx_cpu);
  if (rest) {
    const ChunkGemmTimes gr = time_chunk_gemms(W.data(), rest, H, V, 2);
    bound += per_chunk_logits * gr.logits + gr.dx;
    bound_cpu += per_chunk_logits * gr.logits_cpu + gr.dx_cpu;
  }
  const int n_gemms = per_chunk_logits + 1;
  const double flops = n_gemms * 2.0 * T * double(H) * V;
  const double total = t_fwd + t_bwd;

  std::printf("loss: mode=%s T=%d H=%d V=%d chunk=%d B=%d ce=%g kl=%g tau=%g cap=%g tv=%g lk=%g eta=%g nla=%g "
              "position_weight=%s alpha=%g top_k=%d reps=%d\n",
              mode.c_str(), T, H, V, C, B, s.ce_weight, s.kl_weight, s.kl_temperature, s.cap_weight, s.tv_weight,
              s.lk_weight, s.lk_eta, s.nla_weight, name_of(s.position_weight), s.dpace_alpha, s.top_k, reps);
  std::printf("  loss/Σw %.6f  (ce %.6f kl %.6f cap %.6f tv %.6f lk %.6f nla %.6f; Σwd/Σw %.4f)  acc@k1 %.4f  τ %.3f\n",
              out.sums.loss / out.sums.weight, out.sums.ce / out.sums.weight, out.sums.kl / out.sums.weight,
              out.sums.cap / out.sums.weight, out.sums.tv / out.sums.weight, out.sums.lk / out.sums.weight,
              out.sums.nla / out.sums.weight, out.sums.dpace / out.sums.weight,
              double(out.metrics.correct[1]) / double(std::max<int64_t>(out.metrics.scored[1], 1)),
              double(out.metrics.accepted_sum) / double(std::max<int64_t>(out.metrics.blocks, 1)));
  std::printf("  time      fwd %.3f s  bwd %.3f s  total %.3f s  (%.2f us/position)\n", t_fwd, t_bwd, total,
              total / T * 1e6);
  std::printf("  GFLOP     %.1f in %d vocab GEMMs  ->  %.1f GFLOP/s\n", flops * 1e-9, n_gemms, flops / total * 1e-9);
  std::printf("  bound     same GEMMs alone %.3f s (%.1f GFLOP/s; chunk logits %.3f s, dX %.3f s)  ratio %.3f\n",
              bound, flops / bound * 1e-9, g.logits, g.dx, bound / total);
  std::printf("  cpu time  loss %.3f s, same GEMMs alone %.3f s  ratio %.3f  (process CPU seconds, all threads)\n",
              cpu_loss, bound_cpu, bound_cpu / cpu_loss);
  std::printf("  memory    peak RSS added by the loss %.1f MiB%s  (scratch %.1f MiB, context %.1f MiB;"
              " 2*chunk*V*4 = %.1f MiB)\n",
              added / 1048576.0, reset_ok ? "" : " [peak not resettable: includes setup]", scratch / 1048576.0,
              context / 1048576.0, 2.0 * C * V * 4 / 1048576.0);
  return 0;
}

}  // namespace dflash::bench
