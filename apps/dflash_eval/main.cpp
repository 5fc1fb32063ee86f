// dflash_eval --target DIR --drafter DIR --prompts P.h5 [--max-new-tokens 128] [--limit K] [--eos ID]
//             [--vocab-limit N] [--out eval.json] [--check-greedy] [--teacher-forced] [--tree-budget N [--tree-topk K]]
//             [--device cpu|cuda [--precision bf16|fp32]]
// The real acceptance length: greedy speculative decoding of every prompt with the target and the drafter
// (lib/eval/spec_decode.h, docs/eval.md). Single process = TP 1; `mpirun -np K dflash_eval ...` runs the target
// as one TP group of K ranks with the drafter on rank 0 (the drafter's block costs far less than the target's
// verify forward, and the ranks must wait for the drafts anyway). Rank 0 prints and writes the JSON. The evaluation
// is lib/eval/drafter_eval.h; this program parses its options and prints what it found.
#include <cstdio>
#include <optional>
#include <string>

#include "lib/comm/mpi_init.h"
#include "lib/comm/mpi_transport.h"
#include "lib/core/atomic_file.h"
#include "lib/core/cli_app.h"
#include "lib/eval/drafter_eval.h"

using namespace dflash;

namespace {

// The command line: the evaluation's options (an absent optional has a default that depends on the models) and
// where the JSON goes.
struct EvalOptions : eval::DrafterEvalOptions {
  std::string out;
};

constexpr const char* kDescription =
    "dflash_eval: the real acceptance length of a drafter: greedy speculative decoding of every prompt with the target "
    "and the drafter (docs/eval.md). Single process = TP 1; `mpirun -np K dflash_eval ...` runs the target as one TP "
    "group of K ranks (the drafter on rank 0, which prints and writes the JSON).";

// Fills o from argv; else the exit code (--help, a usage error: lib/core/cli_app.h).
std::optional<int> parse_options(int argc, char** argv, EvalOptions& o) {
  CliApp app(kDescription, "dflash_eval");
  app.add_option("--target", o.target, "the target model (Hugging Face directory)")->required()->type_name("DIR");
  app.add_option("--drafter", o.drafter, "a training run folder (its newest complete checkpoint), a ckpt/step_* "
                 "folder, or an exported drafter folder (config.json + model.safetensors)")->required()->type_name("DIR");
  app.add_option("--prompts", o.prompts, "a dataset; each sequence's prompt is its tokens before the first "
                 "loss_mask = 1 (text prompt sets: dflash_data import-prompts / data/prep/dflash-prep prompts)")
      ->required()->type_name("P.h5");
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens generated per prompt")->check(CLI::Range(1, 1 << 20));
  app.add_option("--limit", o.limit, "only the first K prompts (0 = every prompt)")->check(non_negative_number());
  app.add_option("--eos", o.eos, "stop a prompt after the target generates ID (-1 = never)")->type_name("ID");
  app.add_option("--vocab-limit", o.vocab_limit, "generate only ids < N (default: the drafter's mask_token_id when "
                 "it is the last id)")->check(non_negative_number());
  app.add_option("--out", o.out, "write the results as JSON (atomically)")->type_name("FILE");
  app.add_flag("--check-greedy", o.check_greedy, "also decode each prompt plainly and fail unless the tokens are "
               "identical");
  app.add_flag("--teacher-forced", o.teacher_forced, "also the teacher-forced tau of the drafter on the generated "
               "sequences (every anchor, and only the anchors speculative decoding visited)");
  app.add_option("--tree-budget", o.tree_budget, "also decode with tree verification: up to N candidate nodes from "
                 "the drafter's top-k per block position, verified in one target forward (dense targets); reports "
                 "tau_tree (checked below: >= 1)");
  app.add_option("--tree-topk", o.tree_topk, "candidates per block position for the tree (default 4)")
      ->check(positive_number());
  add_named_option(app, "--device", o.device, "cuda: the target's forward on the GPU (rank r of mpirun: GPU "
                   "node-local r); the drafter and the head stay on the CPU. Chain decoding only (--tree-budget needs "
                   "the CPU)");
  add_named_option(app, "--precision", o.precision, "the GPU target's precision: bf16 (default there: as it is "
                   "served) or fp32; the CPU runs fp32", {kernels::Precision::bf16, kernels::Precision::fp32});
  return parse_or_exit_code(app, argc, argv);
}

int evaluate(const EvalOptions& a, comm::Transport& tp) {
  const bool root = tp.rank() == 0;
  eval::DrafterEval ev(a, tp);
  if (root) {
    for (const std::string& w : ev.warnings()) std::fprintf(stderr, "dflash_eval: warning: %s\n", w.c_str());
    std::printf("%s\n", ev.describe().c_str());
    std::fflush(stdout);
  }
  const eval::DrafterEvalResult r = ev.run();
  if (!root) return 0;
  if (!a.out.empty()) write_file_atomic(a.out, r.json.dump(2) + "\n");
  for (const std::string& line : r.lines) std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  EvalOptions options;
  if (const std::optional<int> rc = parse_options(argc, argv, options)) return *rc;
  return comm::run_mpi_program({"dflash_eval", /*only_when_launched=*/true}, argc, argv, [&](bool with_mpi) {
    if (!with_mpi) {
      comm::SelfTransport self;
      return evaluate(options, self);
    }
    comm::MpiTransport world(MPI_COMM_WORLD);
    return evaluate(options, world);
  });
}
