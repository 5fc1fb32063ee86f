#include "lib/job/trainer.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <optional>

#include "lib/comm/mpi_init.h"
#include "lib/config/config.h"
#include "lib/job/cli.h"
#include "lib/job/job.h"
#include "lib/job/run_status.h"
#include "lib/job/signals.h"
#include "lib/job/workers.h"
#include "lib/preflight/run_check.h"
#include "lib/report/log.h"
#include "lib/state/export_command.h"

namespace dflash::job {

namespace {

// dflash_mpi --export SOURCE OUT_DIR [options]: the one export (= dflash_data export, lib/state/export_command.h);
// no MPI job needed.
int run_export(const state::ExportOptions& o) {
  std::printf("%s\n", state::export_command(o).c_str());
  return 0;
}

// Prints the error once and takes the world down. Errors every rank hits alike (config, layout, data) are
// printed by world rank 0; the others give it a moment to do so, then abort too. An error only one rank sees is
// printed by that rank (after the same moment) with its identity.
// Writes an error line to the rank's log (and stderr); when the log cannot be written (full disk), to stderr.
void report_error(const std::string& who, const std::string& message, report::Logger* log) {
  if (log) {
    try {
      log->error("{}", message);  // to stderr and to the rank's log file, with its identity
      return;
    } catch (const std::exception& e) {  // the log itself cannot be written: stderr still gets both
      std::fprintf(stderr, "dflash_mpi %s: error: %s (%s)\n", log->prefix().c_str(), message.c_str(), e.what());
      return;
    }
  }
  std::fprintf(stderr, "dflash_mpi%s: error: %s\n", who.empty() ? "" : (" " + who).c_str(), message.c_str());
}

[[noreturn]] void abort_now(RunLock* lock) {
  if (lock) lock->release();  // the job ends here: the next one may use out_dir
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

[[noreturn]] void abort_world(int rank, const std::string& who, const std::string& message, report::Logger* log,
                              RunLock* lock) {
  if (rank != 0) {
    // mpirun answers rank 0's abort with SIGTERM: let it end this rank quietly instead of the stop handler
    std::signal(SIGTERM, SIG_DFL);
    sleep(2);
  }
  report_error(who, message, log);
  abort_now(lock);
}

}  // namespace

// --export and --check run as plain processes, without MPI (a login node, a laptop): errors go to stderr.
int run_without_mpi(const char* what, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dflash_mpi %s: error: %s\n", what, e.what());
    return 1;
  }
}

namespace {

// What runs without MPI: --help, --export, --print-key, --check and usage errors (under mpirun only the first rank
// prints). Returns the exit code when the program ends here; else fills `options` for the MPI job.
std::optional<int> run_before_mpi(int argc, char** argv, std::optional<ProgramOptions>& options) {
  const bool printer = launcher_rank() == 0;
  if (argc >= 2 && std::string(argv[1]) == "--export")
    return run_without_mpi("--export", [&] {
      const auto o = state::parse_export_options(argc, argv, printer);
      return o ? run_export(*o) : 0;
    });
  try {
    options = parse_program_options(argc, argv, printer);
  } catch (const std::exception& e) {
    if (printer) std::fprintf(stderr, "dflash_mpi: error: %s\n", e.what());
    return 2;
  }
  if (!options) return 0;  // --help
  if (!options->print_key.empty())
    return run_without_mpi("--print-key", [&] {
      std::printf("%s\n", config_value(load_config(options->config, options->sets), options->print_key).c_str());
      return 0;
    });
  if (options->check)
    return run_without_mpi("--check",
                           [&] { return preflight::run_check(load_config(options->config, options->sets), options->gpus); });
  return std::nullopt;
}

// Drafter rank 0's status, on every rank (a sum where only it contributes: also the job's last collective).
RunStatus gather_run_status(const RunStatus& mine, const comm::RankLayout& layout, comm::Transport& world) {
  const bool speaker = layout.role == comm::Role::Drafter && layout.dp_rank == 0;
  double v[4] = {0, 0, 0, 0};
  if (speaker) v[0] = double(int(mine.outcome)), v[1] = double(mine.step), v[2] = double(mine.total_steps),
               v[3] = double(mine.signal);
  world.allreduce_sum(v, 4);
  return {RunOutcome(int(v[0])), int64_t(v[1]), int64_t(v[2]), int(v[3])};
}

}  // namespace

int dflash_mpi_main(int argc, char** argv) {
  std::optional<ProgramOptions> options;
  if (const std::optional<int> rc = run_before_mpi(argc, argv, options)) return *rc;
  comm::init_mpi(&argc, &argv);
  auto job = std::make_unique<Job>();
  job->options = *options;
  MPI_Comm_rank(MPI_COMM_WORLD, &job->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &job->size);
  try {
    install_stop_signal_handlers();
    resolve_job(*job, [&job](const std::string& message) {  // the watchdog: a wait outlived its bound
      report_error(job->who, message, job->log.get());
      sleep(2);  // the other ranks' watchdogs, which fire about now, report their waits too: the stall's shape
      abort_now(job->lock ? &*job->lock : nullptr);
    });
    const std::string& out_dir = job->cfg.run.out_dir;
    const RunStatus running{RunOutcome::running, job->resume.start_step, job->plan.total_steps, 0};
    if (job->rank == 0) write_run_status(out_dir, running);
    const RunStatus mine = job->is_target() ? run_target_worker(*job) : run_drafter_worker(*job);
    const RunStatus end = gather_run_status(mine, job->layout, *job->world);
    if (job->rank == 0) write_run_status(out_dir, end);
  } catch (const std::exception& e) {
    abort_world(job->rank, job->who, e.what(), job->log.get(), job->lock ? &*job->lock : nullptr);
  }
  job.reset();  // the communicators before MPI_Finalize; the log, then out_dir's lock, last
  MPI_Finalize();
  return 0;
}

}  // namespace dflash::job
