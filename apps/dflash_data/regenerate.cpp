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

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "apps/dflash_data/commands.h"
#include "lib/core/args.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/io/dataset.h"
#include "lib/model/generate.h"
#include "lib/model/target.h"

namespace dflash::data {

namespace {

constexpr const char* kUsage =
    "usage: dflash_data regenerate --target DIR --prompts IN.h5 --out OUT.h5 [--max-new-tokens 256] [--eos ID]\n"
    "                              [--limit K] [--vocab-limit N]\n"
    "  --target DIR        the target model (Hugging Face directory: config.json + safetensors)\n"
    "  --prompts IN.h5     a dataset; each sequence's prompt is its tokens before the first loss_mask = 1\n"
    "                      (all of it when none is 1); the old response, if any, is dropped\n"
    "  --out OUT.h5        prompt (loss_mask 0) + greedy continuation (loss_mask 1), one sequence per prompt\n"
    "  --max-new-tokens N  tokens generated per prompt (default 256)\n"
    "  --eos ID            stop a sequence after the target generates ID (kept, trained)\n"
    "  --limit K           only the first K prompts\n"
    "  --vocab-limit N     generate only ids < N (keep reserved ids such as the mask token out of the data)\n"
    "  single process = TP 1; `mpirun -np K dflash_data regenerate ...` runs one TP group of K ranks\n"
    "  (the prompt runs once, then one position per new token with a KV / recurrent-state cache)\n";

// Launched by mpirun / srun? Then MPI is initialised and the world is the TP group; otherwise no MPI at all
// (a plain run must not depend on MPI singleton start-up working on this machine).
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

int regenerate(const Args& a, comm::Transport& tp) {
  const bool writer_rank = tp.rank() == 0;
  const std::string target_dir = a.str("target", ""), in = a.str("prompts", ""), out = a.str("out", "");
  model::GenerateOptions opt;
  opt.eos_id = int32_t(a.integer("eos", -1));
  opt.vocab_limit = int(a.integer("vocab-limit", 0));
  const int64_t limit = a.integer("limit", 0);
  const int64_t max_new_tokens = a.integer("max-new-tokens", opt.max_new_tokens);
  DFLASH_USER_CHECK(max_new_tokens >= 1 && max_new_tokens <= (1 << 20), "--max-new-tokens {}: must be in [1, 1048576]",
                    max_new_tokens);
  opt.max_new_tokens = int(max_new_tokens);  // in range: the check above
  DFLASH_USER_CHECK(limit >= 0, "--limit {}: must be >= 0 (0 = every prompt)", limit);
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
  auto progress = [&](const model::RegenerateStats& s) {
    if (!writer_rank || (s.seconds - last_print < 2.0 && s.sequences < n)) return;
    last_print = s.seconds;
    std::printf("  %lld/%lld sequences  %.2f sequences/s  %.0f new tokens/s\n", (long long)s.sequences,
                (long long)n, double(s.sequences) / s.seconds, double(s.new_tokens) / s.seconds);
    std::fflush(stdout);
  };
  const model::RegenerateStats st =
      model::regenerate_dataset(target, head, prompts, writer.get(), opt, limit, progress);
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
  Args a(argc, argv, {"target", "prompts", "out", "max-new-tokens", "eos", "limit", "vocab-limit"}, {}, kUsage);
  DFLASH_USER_CHECK(a.has("target") && a.has("prompts") && a.has("out"),
              "--target DIR, --prompts IN.h5 and --out OUT.h5 are required\n{}", kUsage);
  if (!launched_by_mpi()) {
    comm::SelfTransport self;
    return regenerate(a, self);  // errors go to main, which prints them
  }
  dflash::comm::init_mpi(nullptr, nullptr);
  int rc = 1;
  try {
    comm::MpiTransport world(MPI_COMM_WORLD);
    rc = regenerate(a, world);
  } catch (const std::exception& e) {
    // one rank may fail alone (e.g. rank 0 cannot write OUT.h5): abort the job rather than leave others waiting
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "[rank %d] dflash_data regenerate: error: %s\n", rank, e.what());
    std::fflush(stderr);
    // most errors hit every rank alike: give rank 0 a moment to remove OUT.h5.partial and abort first
    if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace dflash::data
