// dflash_data regenerate --target DIR --prompts IN.h5 --out OUT.h5 [--max-new-tokens 256] [--eos ID]
//                        [--limit K] [--vocab-limit N]
// Target-regenerated training data: for each sequence of IN.h5 its prompt (the tokens before the first
// loss_mask = 1; the whole sequence when none is 1) is continued greedily by the target; OUT.h5 gets
// prompt + continuation with loss_mask 0 on the prompt and 1 on the continuation.
//
// Single process: TP = 1 (no MPI at all). Under mpirun (or srun): every rank of MPI_COMM_WORLD is one rank of a
// single TP group (`mpirun -np 5 dflash_data regenerate ...`), all ranks read IN.h5, rank 0 writes OUT.h5.
// OUT.h5 is written as OUT.h5.partial and renamed at the end: a failed run leaves no dataset behind.
#include "lib/comm/mpi_init.h"
#include "lib/comm/mpi_transport.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "apps/dflash_data/commands.h"
#include "apps/dflash_data/regenerate_dataset.h"
#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/io/dataset.h"
#include "lib/model/generate.h"
#include "lib/model/target.h"

namespace dflash::data {

namespace {

struct RegenerateOptions {
  std::string target, prompts, out;
  int max_new_tokens = 256, eos = -1, vocab_limit = 0;
  int64_t limit = 0;
};

int regenerate(const RegenerateOptions& a, comm::Transport& tp) {
  const bool writer_rank = tp.rank() == 0;
  const std::string &target_dir = a.target, &in = a.prompts, &out = a.out;
  model::GenerateOptions opt;
  opt.eos_id = a.eos;
  opt.vocab_limit = a.vocab_limit;
  const int64_t limit = a.limit;
  opt.max_new_tokens = a.max_new_tokens;
  DFLASH_USER_CHECK(std::filesystem::is_directory(target_dir), "--target {}: not a directory (a model directory with "
              "config.json and *.safetensors; `dflash_data make-target` writes one)", target_dir);

  Timer load;
  model::TargetModel target(target_dir, tp);
  model::GreedyHead head(target_dir, tp);
  const model::QwenConfig& c = target.config();
  DFLASH_USER_CHECK(opt.eos_id < c.vocab, "--eos {}: not a token id of the target (vocab {})", opt.eos_id, c.vocab);
  DFLASH_USER_CHECK(opt.vocab_limit >= 0 && opt.vocab_limit <= c.vocab, "--vocab-limit {}: must be in [1, vocab {}] (0 = every id)",
              opt.vocab_limit, c.vocab);
  io::Dataset prompts(in, c.vocab);  // validates; errors name the file and sequence
  const int64_t n = model::check_prompts(prompts, limit);  // input errors before OUT.h5.partial exists
  DFLASH_USER_CHECK(n > 0, "{}: no sequences to regenerate", in);
  model::check_generation_fits(c, target_dir, prompts, n, opt.max_new_tokens, 0, "--max-new-tokens");
  if (writer_rank) {
    std::printf("regenerate: target %s (H %d, %d layers, vocab %d) on TP %d, loaded in %.2f s\n", target_dir.c_str(),
                c.hidden, c.layers, c.vocab, tp.size(), load.seconds());
    std::printf("regenerate: %lld of %lld prompts from %s, up to %d new tokens each%s%s\n", (long long)n,
                (long long)prompts.size(), in.c_str(), opt.max_new_tokens,
                opt.eos_id >= 0 ? fmt::format(", eos {}", opt.eos_id).c_str() : "",
                opt.vocab_limit > 0 ? fmt::format(", ids < {}", opt.vocab_limit).c_str() : "");
    std::fflush(stdout);
  }

  // Rank 0 writes OUT.h5.partial; commit() renames it once complete. On any failure (here or on the way to main /
  // MPI_Abort) the writer's destructor removes the partial file it created; OUT.h5 is left as it was.
  std::unique_ptr<io::DatasetWriter> writer;
  if (writer_rank) writer = std::make_unique<io::DatasetWriter>(out + ".partial");
  double last_print = 0;
  auto progress = [&](const RegenerateStats& s) {
    if (!writer_rank || (s.seconds - last_print < 2.0 && s.sequences < n)) return;
    last_print = s.seconds;
    std::printf("  %lld/%lld sequences  %.2f sequences/s  %.0f new tokens/s\n", (long long)s.sequences,
                (long long)n, double(s.sequences) / s.seconds, double(s.new_tokens) / s.seconds);
    std::fflush(stdout);
  };
  const RegenerateStats st =
      regenerate_dataset(target, head, prompts, writer.get(), opt, limit, progress);
  if (writer_rank) {
    writer->commit(out);
    const double secs = std::max(st.seconds, 1e-9);
    std::printf("wrote %s: %lld sequences, %lld tokens (%lld prompt, %lld generated), %lld stopped at eos\n",
                out.c_str(), (long long)st.sequences, (long long)(st.prompt_tokens + st.new_tokens),
                (long long)st.prompt_tokens, (long long)st.new_tokens, (long long)st.eos_stops);
    std::printf("regenerate: %.2f s, %.2f sequences/s, %.0f new tokens/s, %.0f forward tokens/s (%ld forwards, "
                "cached)\n",
                secs, double(st.sequences) / secs, double(st.new_tokens) / secs,
                double(target.stats().tokens) / std::max(target.stats().forward_seconds, 1e-9),
                target.stats().forwards);
  }
  return 0;
}

}  // namespace

int run_regenerate(int argc, char** argv) {
  CliApp app("Prompts + the target's greedy continuations: each sequence's prompt (its tokens before the first "
             "loss_mask = 1; all of it when none is 1; the old response, if any, is dropped) continued greedily, "
             "with loss_mask 0 on the prompt and 1 on the continuation (a KV / recurrent-state cache: the prompt runs "
             "once, then one position per new token). Single process = TP 1; `mpirun -np K dflash_data regenerate "
             "...` runs one TP group of K ranks.", "dflash_data regenerate");
  RegenerateOptions o;
  app.add_option("--target", o.target, "the target model (Hugging Face directory: config.json + safetensors)")
      ->required()->type_name("DIR");
  app.add_option("--prompts", o.prompts, "a dataset of prompts")->required()->type_name("IN.h5");
  app.add_option("--out", o.out, "prompt + continuation, one sequence per prompt")->required()->type_name("OUT.h5");
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens generated per prompt")->check(CLI::Range(1, 1 << 20));
  app.add_option("--eos", o.eos, "stop a sequence after the target generates ID (kept, trained; -1 = never)")
      ->type_name("ID");
  app.add_option("--limit", o.limit, "only the first K prompts (0 = every prompt)")->check(non_negative_number());
  app.add_option("--vocab-limit", o.vocab_limit, "generate only ids < N (keep reserved ids such as the mask token "
                 "out of the data; 0 = every id)")->check(non_negative_number());
  if (!parse_command_line(app, argc, argv)) return 0;
  // under mpirun every rank is one rank of the TP group; one rank may fail alone (e.g. rank 0 cannot write OUT.h5):
  // the wrapper aborts the job rather than leave the others waiting
  return comm::run_mpi_program({"dflash_data regenerate", /*only_when_launched=*/true}, argc, argv,
                               [&](bool with_mpi) {
                                 if (!with_mpi) {
                                   comm::SelfTransport self;
                                   return regenerate(o, self);
                                 }
                                 comm::MpiTransport world(MPI_COMM_WORLD);
                                 return regenerate(o, world);
                               });
}

}  // namespace dflash::data
