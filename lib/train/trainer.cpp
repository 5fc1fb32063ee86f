#include "lib/train/trainer.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <optional>

#include "lib/comm/layout.h"
#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/io/dataset.h"
#include "lib/model/qwen_config.h"
#include "lib/train/log.h"
#include "lib/train/run_plan.h"
#include "lib/train/workers.h"

namespace dflash::train {

namespace {

const char* kUsage =
    "usage: mpirun -np N dflash_mpi CONFIG.yaml [--set key=value ...]\n"
    "  N must equal layout.target_tp * layout.target_groups + layout.drafter_dp (default 5*1+3 = 8).\n"
    "  Keys: docs/config.md. Example: mpi_launch/configs/tiny.yaml\n";

// Prints the error once and takes the world down. Errors every rank hits alike (config, layout, data) are
// printed by world rank 0; the others give it a moment to do so, then abort too. An error only one rank sees is
// printed by that rank (after the same moment) with its identity.
[[noreturn]] void abort_world(int rank, const std::string& who, const std::string& message, Logger* log) {
  if (log) log->error("{}", message);
  if (rank != 0) sleep(2);
  std::fprintf(stderr, "dflash_mpi%s: error: %s\n", who.empty() ? "" : (" " + who).c_str(), message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace

int dflash_mpi_main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string who;
  std::unique_ptr<Logger> log;
  try {
    ConfigCli cli = parse_config_cli(argc, argv);
    if (cli.file.empty() || !cli.rest.empty()) {
      if (rank == 0) {
        std::fprintf(stderr, "%s", kUsage);
        if (!cli.rest.empty()) std::fprintf(stderr, "dflash_mpi: unexpected argument '%s'\n", cli.rest[0].c_str());
      }
      MPI_Finalize();
      return 2;
    }
    const TrainConfig cfg = load_config(cli.file, cli.sets);
    const comm::RankLayout layout = comm::make_rank_layout(cfg.layout.target_tp, cfg.layout.target_groups,
                                                     cfg.layout.drafter_dp, size, rank);
    who = layout.describe();
    DFLASH_CHECK(cfg.run.device == "cpu",
                 "run.device = {}: this build trains on the CPU only (the CUDA backend is not implemented yet); set "
                 "run.device: cpu",
                 cfg.run.device);
    DFLASH_CHECK(cfg.layout.transport == "mpi",
                 "layout.transport = {}: only the MPI transport is implemented; set layout.transport: mpi",
                 cfg.layout.transport);
    const model::QwenConfig target = model::load_qwen_config(cfg.target.path);
    // targets check every token id against the vocabulary on open; drafters only need the offsets
    const bool is_target = layout.role == comm::Role::Target;
    const io::Dataset data(cfg.data.path, target.vocab, /*scan_tokens=*/is_target);
    const RunPlan plan = make_run_plan(cfg, target, data.size());
    if (rank == 0) {
      std::printf("%s\n", format_config_table(cfg).c_str());
      const std::string resolved = write_resolved_config(cfg);
      std::printf("dflash_mpi: %d ranks (%d target TP x %d groups + %d drafter DP), %lld steps of %d x %d "
                  "sequences; resolved config in %s\n",
                  size, cfg.layout.target_tp, cfg.layout.target_groups, cfg.layout.drafter_dp,
                  (long long)plan.total_steps, cfg.layout.drafter_dp, cfg.optim.micro_batches, resolved.c_str());
      std::fflush(stdout);
    }
    comm::RoleComms comms(layout, MPI_COMM_WORLD);
    LogIdentity id;
    id.rank = rank;
    id.role = comm::role_name(layout.role);
    id.index = is_target ? layout.tp_rank : layout.dp_rank;
    const bool console = !is_target && layout.dp_rank == 0;
    log = std::make_unique<Logger>(cfg.run.out_dir, id, resolve_log_level(cfg.log.level), console);
    log->info("{} of {} ranks; config {} (hash {})", who, size, cli.file, config_hash_hex(cfg));

    const int64_t start_step = 0;
    if (is_target)
      run_target_worker(cfg, plan, layout, comms, data, start_step, *log);
    else
      run_drafter_worker(cfg, plan, layout, comms, data, start_step, *log);
    MPI_Barrier(MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    abort_world(rank, who, e.what(), log.get());
  }
  log.reset();
  MPI_Finalize();
  return 0;
}

}  // namespace dflash::train
