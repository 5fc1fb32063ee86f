// dflash_bench numerics: what bf16 vocab logits cost the loss and its gradient, at the real vocabulary. The bf16
// CUDA backend keeps the loss's logits z (drafter) and u (target) in bf16: cuBLASLt accumulates each logit in fp32
// and rounds it once, and the row gradient dZ is written back in bf16 (kernels/cuda/vocab_loss_rows.cu). This
// program reproduces exactly those roundings on the CPU row kernels (the same math the CUDA rows run): the loss
// and dZ from fp32 logits against the loss and dZ from the same logits rounded to bf16 (dZ rounded too), for
// logits of a given spread and offset (an offset changes nothing in exact arithmetic but scales the rounding:
// a logit of magnitude 16 is rounded by up to 2^-9·16 = 0.03). Prints, per setting, the relative error of the
// mean loss (CE + KL + CAP) and of each term, and the relative L2 error of dZ.
#include <cmath>
#include <cstdio>
#include <vector>

#include "apps/dflash_bench/bench.h"
#include "kernels/backend.h"
#include "kernels/vocab_loss_rows.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/io/safetensors.h"

namespace dflash::bench {

namespace {

// round to nearest even, as __float2bfloat16 and the CUDA kernels round
float bf16_round(float x) { return io::bf16_to_float(io::float_to_bf16(x)); }

struct LossAndGrad {
  double ce = 0, kl = 0, cap = 0;
  std::vector<float> dz;
};

LossAndGrad loss_and_grad(const std::vector<float>& z, const std::vector<float>& u, const std::vector<int32_t>& y,
                          int n, int V, const kernels::VocabLossCoeffs& k, bool round_grad) {
  auto& cpu = kernels::cpu_backend<float>();
  ExecContext& hx = kernels::host_exec_context();
  const std::vector<float> w(n, 1.0f);
  std::vector<kernels::VocabLossRow> rows(n);
  std::vector<kernels::VocabLossRowValues> vals(n);
  cpu.vocab_loss_row_stats(hx, z.data(), u.data(), n, V, y.data(), w.data(), k, 5, rows.data(), vals.data());
  LossAndGrad r;
  for (const auto& v : vals) r.ce += v.ce / n, r.kl += v.kl / n, r.cap += v.cap / n;
  r.dz = z;
  cpu.vocab_loss_row_grad(hx, r.dz.data(), u.data(), n, V, y.data(), w.data(), rows.data(), 1.0 / n, k);
  if (round_grad)
    for (auto& g : r.dz) g = bf16_round(g);
  return r;
}

}  // namespace

int run_numerics(int argc, char** argv) {
  CliApp app("bf16 vs fp32 vocab logits: the loss and its row gradient dZ, at the real vocabulary.",
             "dflash_bench numerics");
  int V = 248320, n = 64;
  double sd = 3.0;
  uint64_t seed = 7;
  app.add_option("--V", V, "vocabulary")->check(CLI::Range(2, 1 << 30));
  app.add_option("--rows", n, "rows")->check(positive_number());
  app.add_option("--sd", sd, "the logits' spread")->check(positive_number());
  app.add_option("--seed", seed, "random seed");
  if (!parse_command_line(app, argc, argv)) return 0;
  const kernels::VocabLossCoeffs k{1.0, 1.0, 0.1, 1.0};
  std::printf("numerics: bf16 vs fp32 vocab logits, V=%d, %d rows, logits sd %.1f + offset, one peak token per row "
              "(+4 sd), the target's logits = the drafter's + N(0, 0.5 sd); loss CE + KL (τ 1) + 0.1 CAP\n",
              V, n, sd);
  std::printf("  %-7s %-12s %-12s %-12s %-12s %-12s %s\n", "offset", "loss (fp32)", "rel. err", "CE rel.", "KL rel.",
              "CAP abs.", "dZ rel. L2");
  for (double offset : {0.0, 8.0, 16.0, 32.0}) {
    Rng rng(seed);
    std::vector<float> z(size_t(n) * V), u(z.size());
    std::vector<int32_t> y(n);
    for (int r = 0; r < n; ++r) {
      y[r] = int32_t(rng.below(uint64_t(V)));
      const int peak = rng.next_u64() % 2 ? y[r] : int(rng.below(uint64_t(V)));  // half the rows predict the label
      for (int v = 0; v < V; ++v) {
        const double base = sd * rng.normal() + (v == peak ? 4 * sd : 0.0);
        z[size_t(r) * V + v] = float(base + offset);
        u[size_t(r) * V + v] = float(base + 0.5 * sd * rng.normal() + offset);
      }
    }
    const LossAndGrad f = loss_and_grad(z, u, y, n, V, k, false);
    std::vector<float> zb(z.size()), ub(u.size());
    for (size_t i = 0; i < z.size(); ++i) zb[i] = bf16_round(z[i]), ub[i] = bf16_round(u[i]);
    const LossAndGrad b = loss_and_grad(zb, ub, y, n, V, k, true);
    const double lf = f.ce + f.kl + 0.1 * f.cap, lb = b.ce + b.kl + 0.1 * b.cap;
    double num = 0, den = 0;
    for (size_t i = 0; i < f.dz.size(); ++i) {
      const double d = double(b.dz[i]) - f.dz[i];
      num += d * d;
      den += double(f.dz[i]) * f.dz[i];
    }
    std::printf("  %-7.0f %-12.5f %-12.3e %-12.3e %-12.3e %-12.3e %.3e\n", offset, lf, std::fabs(lb - lf) / lf,
                std::fabs(b.ce - f.ce) / f.ce, std::fabs(b.kl - f.kl) / f.kl, std::fabs(b.cap - f.cap),
                std::sqrt(num / den));
  }
  return 0;
}

}  // namespace dflash::bench
