// moe_golden_check: the TP target forward of a Qwen3-MoE (experts split over the TP ranks) under mpirun -np N
// against the fixtures transformers made (tests/golden_moe/make_golden.py).
//
//   mpirun -np N moe_golden_check --model tests/golden_moe/<name> [--tol 1e-4]
//
// For every prompt in <name>/golden.safetensors: every decoder layer's output (the taps), the final normed state and
// the last rows' logits (final · lm_headᵀ, load_target_vocab) must be within `tol` of transformers', measured per
// tensor as rel = max_i |ours_i − hf_i| / max_i |hf_i| on every rank (the max abs difference is printed too); the
// final state again when the tokens are fed in pieces through forward_cached; every TP rank must hold bit-identical
// outputs; and model::greedy_generate (what `dflash_data regenerate` runs) must give transformers' generate()
// tokens exactly. Exit 0 on pass, 1 on mismatch.
#include "lib/comm/mpi_transport.h"
#include "tests/integration/mpi_test_main.h"
#include "tests/integration/golden_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/io/safetensors.h"
#include "lib/model/generate.h"
#include "lib/model/target.h"

using namespace dflash;

namespace {

using test::same_on_all_ranks;

double max_over_ranks(double x) {
  double m = 0;
  MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

int run(int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  CliApp app("The Qwen3-MoE targets' TP forward against transformers' fixtures.", "moe_golden_check");
  std::string dir;
  double tol = 1e-4;
  app.add_option("--model", dir, "a folder of tests/golden_moe")->required()->type_name("DIR");
  app.add_option("--tol", tol, "relative tolerance");
  if (!parse_command_line(app, argc, argv)) return 0;
  model::TargetOptions opt;
  opt.attention_block = 16;
  opt.mlp_grain = 8;

  comm::MpiTransport tp(MPI_COMM_WORLD);
  model::TargetModel target(dir, tp, opt);
  const model::QwenConfig& c = target.config();
  DFLASH_CHECK(c.experts > 0, "moe_golden_check: {} is not a MoE model", dir);
  model::GreedyHead head(dir, tp);
  const model::TargetVocab vocab = model::load_target_vocab(dir);
  io::SafetensorsFile golden(dir + "/golden.safetensors");
  const int H = c.hidden, L = c.layers, V = c.vocab;
  std::vector<int> all_layers(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) all_layers[size_t(l)] = l;

  bool ok = true;
  for (const int S : {30, 70}) {
    const std::string sfx = ".s" + std::to_string(S);
    const std::vector<float> tok_f = golden.read("tokens" + sfx), hf_layers = golden.read("layers" + sfx),
                             hf_final = golden.read("final" + sfx), hf_logits = golden.read("logits" + sfx),
                             hf_greedy = golden.read("greedy" + sfx);
    const int R = int(hf_logits.size() / size_t(V));  // logits of the last R positions
    DFLASH_CHECK(int(tok_f.size()) == S && hf_layers.size() == size_t(L) * S * H && R >= 1 && R <= S,
                 "{}: golden shapes for S {}", dir, S);
    std::vector<int32_t> tokens(tok_f.begin(), tok_f.end());
    std::vector<float> taps(size_t(S) * L * H), final_hidden(size_t(S) * H);
    target.forward(tokens.data(), S, all_layers, taps.data(), final_hidden.data());
    test::GoldenDiff worst;
    int worst_layer = -1;
    for (int l = 0; l < L; ++l) {
      std::vector<float> ours(size_t(S) * H);
      for (int i = 0; i < S; ++i) std::copy_n(&taps[(size_t(i) * L + l) * H], H, &ours[size_t(i) * H]);
      const test::GoldenDiff d = test::golden_diff(ours.data(), &hf_layers[size_t(l) * S * H], ours.size());
      worst.abs = std::max(worst.abs, d.abs);
      if (d.rel > worst.rel) worst.rel = d.rel, worst_layer = l;
    }
    const test::GoldenDiff df = test::golden_diff(final_hidden.data(), hf_final.data(), final_hidden.size());
    // logits of the last R rows in double from the fp32 final state and the checkpoint's head
    std::vector<float> logits(size_t(R) * V);
    const float* W = vocab.lm_head();
    for (int r = 0; r < R; ++r) {
      const float* x = &final_hidden[size_t(S - R + r) * H];
      for (int v = 0; v < V; ++v) {
        double acc = 0;
        for (int i = 0; i < H; ++i) acc += double(x[i]) * double(W[size_t(v) * H + i]);
        logits[size_t(r) * V + v] = float(acc);
      }
    }
    const test::GoldenDiff dl = test::golden_diff(logits.data(), hf_logits.data(), logits.size());
    const bool identical = same_on_all_ranks(taps) && same_on_all_ranks(final_hidden);

    // the same tokens fed in pieces (1, 2, 20, 1, the rest) through forward_cached
    model::TargetCache cache;
    std::vector<float> pieces(size_t(S) * H);
    const int sizes[] = {1, 2, 20, 1};
    for (int i = 0, b = 0; b < S; ++i) {
      const int n = std::min(i < 4 ? sizes[i] : S - b, S - b);
      target.forward_cached(&tokens[size_t(b)], n, cache, &pieces[size_t(b) * H]);
      b += n;
    }
    const test::GoldenDiff dc = test::golden_diff(pieces.data(), hf_final.data(), pieces.size());

    model::GenerateOptions gen;
    gen.max_new_tokens = int(hf_greedy.size());
    const std::vector<int32_t> greedy = model::greedy_generate(target, head, tokens, gen);
    const bool greedy_ok = greedy.size() == hf_greedy.size() &&
                           std::equal(greedy.begin(), greedy.end(), hf_greedy.begin(),
                                      [](int32_t x, float y) { return x == int32_t(y); });
    const double rel = max_over_ranks(std::max({worst.rel, df.rel, dl.rel, dc.rel}));
    const double abs_layers = max_over_ranks(worst.abs), abs_final = max_over_ranks(df.abs),
                 abs_logits = max_over_ranks(dl.abs), abs_cache = max_over_ranks(dc.abs);
    std::printf("[rank %d/%d] %s S %d: %s | expert rows so far %lld | layers max rel %.3e (layer %d), final %.3e, "
                "logits %.3e, cached %.3e\n",
                rank, world, dir.c_str(), S, target.shard().describe().c_str(),
                static_cast<long long>(target.stats().expert_rows), worst.rel, worst_layer, df.rel, dl.rel, dc.rel);
    std::fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      std::string g;
      for (int t : greedy) g += std::to_string(t) + " ";
      std::printf("moe_golden_check: TP %d, S %d: max abs diff layers %.3e, final %.3e, logits %.3e, cached final "
                  "%.3e; max rel %.3e (tol %.0e) %s; ranks bit-identical: %s; greedy [%s] %s\n",
                  world, S, abs_layers, abs_final, abs_logits, abs_cache, rel, tol, rel <= tol ? "ok" : "FAIL",
                  identical ? "yes" : "NO", g.c_str(), greedy_ok ? "= transformers" : "!= transformers: FAIL");
      std::fflush(stdout);
    }
    ok = ok && rel <= tol && identical && greedy_ok && cache.length == S;
  }
  int ok_all = ok, ok_min = 0;
  MPI_Allreduce(&ok_all, &ok_min, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return ok_min ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return dflash::test::mpi_test_main("moe_golden_check", argc, argv, run); }
