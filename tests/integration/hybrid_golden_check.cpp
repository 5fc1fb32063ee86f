// hybrid_golden_check: the TP target forward of a Qwen3.5 hybrid (Gated DeltaNet + gated attention) under
// mpirun -np N against the fixtures transformers made (tests/golden_hybrid/make_qwen3_5_golden.py).
//
//   mpirun -np N hybrid_golden_check --model tests/golden_hybrid/<name> [--tol 1e-4]
//
// For every sequence in <name>/golden.safetensors: every decoder layer's output (taps of all layers) and the final
// normed hidden state must be within `tol` of transformers', measured per tensor as
//   rel = max_i |ours_i − hf_i| / max_i |hf_i|,
// on every rank; the final state must be within `tol` too when the tokens are fed in pieces through
// TargetModel::forward_cached (KV cache, DeltaNet conv + recurrent state); every TP rank must hold bit-identical
// outputs; and the greedy continuation made by
// model::greedy_generate (what `dflash_data regenerate` runs: argmax of final_hidden · lm_headᵀ at the last
// position, a full forward per new token) must equal transformers' generate() tokens exactly. Exit 0 on pass, 1 on mismatch.
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

int run(int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  CliApp app("The Qwen3.5 hybrid target's TP forward against transformers' fixtures.", "hybrid_golden_check");
  std::string dir;
  double tol = 1e-4;
  model::TargetOptions opt;
  opt.attention_block = 16;
  opt.mlp_grain = 8;
  app.add_option("--model", dir, "a folder of tests/golden_hybrid")->required()->type_name("DIR");
  app.add_option("--tol", tol, "relative tolerance");
  app.add_option("--attention-block", opt.attention_block, "attention block")->check(positive_number());
  app.add_option("--mlp-grain", opt.mlp_grain, "MLP grain")->check(positive_number());
  if (!parse_command_line(app, argc, argv)) return 0;

  comm::MpiTransport tp(MPI_COMM_WORLD);
  model::TargetModel target(dir, tp, opt);
  const model::QwenConfig& c = target.config();
  model::GreedyHead head(dir, tp);
  io::SafetensorsFile golden(dir + "/golden.safetensors");
  const int H = c.hidden, L = c.layers;
  std::vector<int> all_layers(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) all_layers[size_t(l)] = l;

  bool ok = true;
  for (const int S : {30, 150}) {
    const std::string sfx = ".s" + std::to_string(S);
    const std::vector<float> tok_f = golden.read("tokens" + sfx), hf_layers = golden.read("layers" + sfx),
                             hf_final = golden.read("final" + sfx), hf_greedy = golden.read("greedy" + sfx);
    DFLASH_CHECK(int(tok_f.size()) == S && hf_layers.size() == size_t(L) * S * H, "{}: golden shapes for S {}",
                 dir, S);
    std::vector<int32_t> tokens(tok_f.begin(), tok_f.end());
    std::vector<float> taps(size_t(S) * L * H), final_hidden(size_t(S) * H);
    target.forward(tokens.data(), S, all_layers, taps.data(), final_hidden.data());
    double worst = 0;
    int worst_layer = -1;
    for (int l = 0; l < L; ++l) {
      std::vector<float> ours(size_t(S) * H);
      for (int i = 0; i < S; ++i)
        std::copy_n(&taps[(size_t(i) * L + l) * H], H, &ours[size_t(i) * H]);
      const double e = test::golden_diff(ours.data(), &hf_layers[size_t(l) * S * H], ours.size()).rel;
      if (e > worst) worst = e, worst_layer = l;
    }
    const double ef = test::golden_diff(final_hidden.data(), hf_final.data(), final_hidden.size()).rel;
    const bool identical = same_on_all_ranks(taps) && same_on_all_ranks(final_hidden);

    // incremental: the same tokens fed in pieces (1, 2, 61, 1, the rest: shorter than the conv
    // kernel, across the chunk of 64) through forward_cached
    model::TargetCache cache;
    std::vector<float> pieces(size_t(S) * H);
    const int sizes[] = {1, 2, 61, 1};  // then the rest in one piece
    for (int i = 0, b = 0; b < S; ++i) {
      const int n = std::min(i < 4 ? sizes[i] : S - b, S - b);
      target.forward_cached(&tokens[size_t(b)], n, cache, &pieces[size_t(b) * H]);
      b += n;
    }
    const double ec = test::golden_diff(pieces.data(), hf_final.data(), pieces.size()).rel;
    const bool cache_ok = cache.length == S && ec <= tol;

    // greedy continuation through the code regenerate uses (GreedyHead over this rank's lm_head rows)
    model::GenerateOptions gen;
    gen.max_new_tokens = int(hf_greedy.size());
    const std::vector<int32_t> greedy = model::greedy_generate(target, head, tokens, gen);
    const bool greedy_ok = greedy.size() == hf_greedy.size() &&
                           std::equal(greedy.begin(), greedy.end(), hf_greedy.begin(),
                                      [](int32_t x, float y) { return x == int32_t(y); });
    double max_e = std::max({worst, ef, ec}), max_all = 0;
    MPI_Allreduce(&max_e, &max_all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    std::printf("[rank %d/%d] %s S %d: %s | layers max rel %.3e (layer %d), final %.3e, final fed in pieces through "
                "the cache %.3e%s\n",
                rank, world, dir.c_str(), S, target.shard().describe().c_str(), worst, worst_layer, ef, ec,
                cache_ok ? "" : " FAIL");
    std::fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      std::string g;
      for (int t : greedy) g += std::to_string(t) + " ";
      std::printf("hybrid_golden_check: TP %d, S %d: max rel err %.3e over ranks (tol %.0e) %s; ranks bit-identical: "
                  "%s; greedy [%s] %s\n",
                  world, S, max_all, tol, max_all <= tol ? "ok" : "FAIL", identical ? "yes" : "NO", g.c_str(),
                  greedy_ok ? "= transformers" : "!= transformers: FAIL");
      std::fflush(stdout);
    }
    ok = ok && max_all <= tol && identical && greedy_ok && cache_ok;
  }
  int ok_all = ok, ok_min = 0;
  MPI_Allreduce(&ok_all, &ok_min, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return ok_min ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return dflash::test::mpi_test_main("hybrid_golden_check", argc, argv, run); }
