// target_tp_check: the TP target forward under mpirun -np N against the single-process double reference.
//
//   mpirun -np N target_tp_check --make DIR [model shape flags] | --model DIR
//                                [--seq 100 --taps 0,2 --mlp-grain 8 --attention-block 32 --tol 1e-5]
//
// Error measure, per output tensor (each tap column block and the final hidden state separately):
//   rel = max_i |tp_i − ref_i| / max_i |ref_i|
// on every rank; the check passes when the largest rel over tensors and ranks is ≤ tol. Also checked: every
// TP rank holds bit-identical outputs, the blocked attention kernel matches its plain reference, and drafter-side
// vocab loading returns the checkpoint's embedding and head. Exit 0 on pass, 1 on mismatch (max rel printed).
#include "lib/comm/mpi_transport.h"
#include "tests/integration/mpi_test_main.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/attention_causal.h"
#include "lib/core/cli_app.h"
#include "lib/model/random_target_options.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/io/safetensors.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"
#include "tests/integration/target_reference.h"

using namespace dflash;

namespace {

std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> ids;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) ids.push_back(std::stoi(part));
  return ids;
}

// max |a − b| / max |b| over n values with stride 1 taken from column block [off, off+len) of rows of `ld`
double rel_err(const float* a, const double* b, int rows, int ld, int off, int len) {
  double num = 0, den = 0;
  for (int r = 0; r < rows; ++r)
    for (int j = off; j < off + len; ++j) {
      num = std::max(num, std::fabs(double(a[size_t(r) * ld + j]) - b[size_t(r) * ld + j]));
      den = std::max(den, std::fabs(b[size_t(r) * ld + j]));
    }
  DFLASH_CHECK(den > 0, "reference output is all zeros: the check would be meaningless");
  return num / den;
}

// the blocked fp32 attention kernel against its plain fp32 reference, several sizes and block edges
double attention_kernel_err() {
  double worst = 0;
  struct Case { int S, qh, kvh, hd, block; };
  for (Case c : {Case{1, 2, 1, 8, 4}, Case{67, 6, 2, 16, 16}, Case{64, 4, 4, 8, 64}, Case{33, 3, 1, 4, 7}}) {
    Rng rng(uint64_t(c.S * 131 + c.block));
    std::vector<float> q(size_t(c.S) * c.qh * c.hd), k(size_t(c.S) * c.kvh * c.hd), v(k.size());
    for (auto* t : {&q, &k, &v})
      for (auto& x : *t) x = float(rng.normal());
    std::vector<float> out(q.size()), ref(q.size());
    cpu::attention_causal_forward<float>(out.data(), q.data(), k.data(), v.data(), c.S, c.qh, c.kvh, c.hd, c.block);
    cpu::attention_causal_reference<float>(ref.data(), q.data(), k.data(), v.data(), c.S, c.qh, c.kvh, c.hd);
    std::vector<double> refd(ref.begin(), ref.end());
    worst = std::max(worst, rel_err(out.data(), refd.data(), c.S, c.qh * c.hd, 0, c.qh * c.hd));
  }
  return worst;
}

int run(int argc, char** argv) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  CliApp app("The TP target forward against the single-process double reference.", "target_tp_check");
  std::string dir, make, tap_list = "0";
  int S = 100;
  double tol = 1e-5;
  model::TargetOptions opt;
  opt.mlp_grain = 8;
  opt.attention_block = 32;
  app.add_option("--model", dir, "the target to check")->type_name("DIR");
  app.add_option("--make", make, "write a random target (the target options below) here and check it")
      ->type_name("DIR");
  app.add_option("--seq", S, "tokens")->check(positive_number());
  app.add_option("--taps", tap_list, "tapped layers, e.g. 0,2,1")->type_name("LIST");
  app.add_option("--tol", tol, "relative tolerance");
  app.add_option("--mlp-grain", opt.mlp_grain, "MLP grain")->check(positive_number());
  app.add_option("--attention-block", opt.attention_block, "attention block")->check(positive_number());
  const model::RandomTargetOptions target_options(app);
  if (!parse_command_line(app, argc, argv)) return 0;
  if (!make.empty()) {
    dir = make;
    if (rank == 0) {
      model::RandomTargetSpec s;
      s.seed = 7;
      target_options.apply(s);
      model::write_random_target(dir, s);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  DFLASH_CHECK(!dir.empty(), "target_tp_check: pass --make DIR (write a random target) or --model DIR");
  const std::vector<int> tap_ids = parse_ids(tap_list);

  comm::MpiTransport tp(MPI_COMM_WORLD);
  model::TargetModel target(dir, tp, opt);
  const model::QwenConfig& c = target.config();
  const int H = c.hidden, n_taps = int(tap_ids.size());
  std::vector<int32_t> tokens(static_cast<size_t>(S));
  Rng rng(99);
  for (auto& t : tokens) t = int32_t(rng.below(uint64_t(c.vocab)));

  std::vector<float> taps(size_t(S) * n_taps * H), final_hidden(size_t(S) * H);
  target.forward(tokens.data(), S, tap_ids, taps.data(), final_hidden.data());

  std::vector<double> ref_taps, ref_final;
  test::reference_target_forward(dir, tokens.data(), S, tap_ids, ref_taps, ref_final);
  double err = 0;
  std::string worst = "none";
  for (int t = 0; t < n_taps; ++t) {
    const double e = rel_err(taps.data(), ref_taps.data(), S, n_taps * H, t * H, H);
    if (e > err) err = e, worst = "tap layer " + std::to_string(tap_ids[size_t(t)]);
  }
  const double ef = rel_err(final_hidden.data(), ref_final.data(), S, H, 0, H);
  if (ef > err) err = ef, worst = "final hidden";
  std::printf("[rank %d/%d] %s: max rel err %.3e (worst: %s; final hidden %.3e)\n", rank, world,
              target.shard().describe().c_str(), err, worst.c_str(), ef);
  std::fflush(stdout);

  // every TP rank must hold the same activations, bit for bit
  std::vector<float> root_taps(taps), root_final(final_hidden);
  MPI_Bcast(root_taps.data(), int(root_taps.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  MPI_Bcast(root_final.data(), int(root_final.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int differs = std::memcmp(root_taps.data(), taps.data(), taps.size() * 4) != 0 ||
                std::memcmp(root_final.data(), final_hidden.data(), final_hidden.size() * 4) != 0;
  double max_err = 0;
  int ranks_differing = 0;
  MPI_Allreduce(&err, &max_err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&differs, &ranks_differing, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);

  bool ok = max_err <= tol && ranks_differing == 0;
  if (rank == 0) {
    const double attn = attention_kernel_err();
    const bool attn_ok = attn <= 1e-5;
    // drafter-side loading: the embedding and lm_head as in the checkpoint, tied → one table
    const model::TargetVocab vocab = model::load_target_vocab(dir);
    io::Checkpoint ck(dir);
    const bool vocab_ok = vocab.embedding == ck.read("model.embed_tokens.weight") &&
                          (c.tie_word_embeddings ? vocab.lm_head() == vocab.embedding.data() && vocab.tied
                                                 : std::equal(vocab.lm_head_untied.begin(), vocab.lm_head_untied.end(),
                                                              ck.read("lm_head.weight").begin()));
    std::printf("target_tp_check: TP %d, S %d, %d taps: max rel err %.3e over ranks (tol %.0e) %s; ranks "
                "bit-identical: %s; attention kernel vs reference %.3e %s; vocab load %s\n",
                world, S, n_taps, max_err, tol, max_err <= tol ? "ok" : "FAIL",
                ranks_differing == 0 ? "yes" : "NO", attn, attn_ok ? "ok" : "FAIL", vocab_ok ? "ok" : "FAIL");
    ok = ok && attn_ok && vocab_ok;
  }
  int ok_all = ok, ok_min = 0;
  MPI_Allreduce(&ok_all, &ok_min, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return ok_min ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return dflash::test::mpi_test_main("target_tp_check", argc, argv, run); }
