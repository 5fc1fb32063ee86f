#include "lib/job/trainer.h"

#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <filesystem>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/backend.h"
#include "lib/comm/data_plane.h"
#include "lib/comm/layout.h"
#include "lib/comm/mpi_init.h"
#include "lib/comm/mpi_transport.h"
#include "lib/comm/nccl_transport.h"
#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/eval/spec_eval.h"
#include "lib/io/dataset.h"
#include "lib/job/cli.h"
#include "lib/job/export_command.h"
#include "lib/job/job_identity.h"
#include "lib/job/run_lock.h"
#include "lib/job/run_status.h"
#include "lib/job/signals.h"
#include "lib/job/workers.h"
#include "lib/model/drafter_export.h"
#include "lib/model/generate.h"
#include "lib/model/qwen_config.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"
#include "lib/preflight/memory_plan.h"
#include "lib/state/out_dir_guard.h"
#include "lib/state/warm_start.h"
#include "lib/train/heartbeat.h"
#include "lib/preflight/data_facts.h"
#include "lib/preflight/run_check.h"
#include "lib/preflight/target_check.h"
#include "lib/preflight/target_identity.h"
#include "lib/preflight/tokenizer_check.h"
#include "lib/report/log.h"
#include "lib/state/checkpointing.h"
#include "lib/train/run_plan.h"

namespace dflash::job {

namespace {

// dflash_mpi --export SOURCE OUT_DIR [options]: the one export (= dflash_data export, lib/job/export_command.h); no
// MPI job needed.
int run_export(const ExportOptions& o) {
  std::printf("%s\n", export_command(o).c_str());
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
      const auto o = parse_export_options(argc, argv, printer);
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

// run.device cuda: every rank binds a GPU of its node by node-local rank (several ranks may share one); the drafter
// step and the target forward run on it (docs/backend.md). Then the data plane (lib/comm/data_plane.h): every rank
// decides alike from the job's shape.
comm::DataPlane bind_device_and_choose_plane(const TrainConfig& cfg, const comm::RankLayout& layout,
                                             const std::string& who) {
  const int local_rank = comm::node_local_rank(MPI_COMM_WORLD);
  if (cfg.run.device == "cuda") {
    const int gpu = kernels::bind_cuda_device(local_rank);
    std::printf("%s: %s on GPU %d\n", who.c_str(),
                layout.role == comm::Role::Drafter ? "drafter step" : "target forward", gpu);
  }
  return comm::choose_data_plane(cfg.layout.transport, cfg.run.device == "cuda", comm::nccl_built(),
                                 comm::node_shape(MPI_COMM_WORLD));
}

// The in-training eval's files, opened on every rank at start-up (an error is every rank's: rank 0 prints it).
struct EvalFiles {
  std::optional<io::Dataset> data, prompts;
  EvalFiles(const TrainConfig& cfg, const train::RunPlan& plan, bool is_target) {
    const int vocab = plan.target.vocab;
    if (cfg.eval.every > 0) {
      preflight::check_eval_file("eval.data", cfg.eval.data, "eval.every");
      data.emplace(cfg.eval.data, vocab, /*scan_tokens=*/is_target);
    }
    if (cfg.eval.spec_every > 0) {
      preflight::check_eval_file("eval.prompts", cfg.eval.prompts, "eval.spec_every");
      prompts.emplace(cfg.eval.prompts, vocab);
      const int64_t n = eval::spec_eval_prompt_count(cfg, *prompts);  // every prompt used has one
      model::check_generation_fits(plan.target, cfg.target.path, *prompts, n, cfg.eval.max_new_tokens,
                                   plan.drafter.block_size, "eval.max_new_tokens");
    }
  }
  eval::EvalInputs inputs() const { return {data ? &*data : nullptr, prompts ? &*prompts : nullptr}; }
};

void print_banner(const TrainConfig& cfg, const train::RunPlan& plan, int size, const std::string& init_identity) {
  std::printf("%s\n", format_config_table(cfg).c_str());
  // the warm start's content identity, which the keys do not hold (a folder's weights may change)
  const std::string resolved =
      write_resolved_config(cfg, init_identity.empty() ? "" : "# drafter.init: " + init_identity + "\n");
  std::printf("dflash_mpi: %d ranks (%d target TP x %d groups + %d drafter DP), %lld steps of %d x %d "
              "sequences; resolved config in %s\n",
              size, cfg.layout.target_tp, cfg.layout.target_groups, cfg.layout.drafter_dp,
              (long long)plan.total_steps, cfg.layout.drafter_dp, cfg.optim.micro_batches, resolved.c_str());
  std::fflush(stdout);
}

// Every attempt (first run, resume, requeue) appends to the rank's log after a header saying who runs it; the
// first drafter rank also prints to the console.
std::unique_ptr<report::Logger> make_logger(const TrainConfig& cfg, const comm::RankLayout& layout, int rank,
                                            const JobIdentity& me) {
  const bool is_target = layout.role == comm::Role::Target;
  report::LogIdentity id;
  id.rank = rank;
  id.role = comm::role_name(layout.role);
  id.index = is_target ? layout.tp_rank : layout.dp_rank;
  if (is_target && cfg.layout.target_groups > 1) id.group = layout.group;
  const bool console = !is_target && layout.dp_rank == 0;
  return std::make_unique<report::Logger>(cfg.run.out_dir, id, report::resolve_log_level(cfg.log.level), console,
                                          fmt::format("===== attempt: {} =====", describe(me)));
}

// World rank r's role as the messages about other ranks name it: "target group 0 tp 3", "drafter dp 1".
std::string rank_role(const TrainConfig& cfg, int world_size, int r) {
  const comm::RankLayout l =
      comm::make_rank_layout(cfg.layout.target_tp, cfg.layout.target_groups, cfg.layout.drafter_dp, world_size, r);
  return l.role == comm::Role::Target ? fmt::format("target group {} tp {}", l.group, l.tp_rank)
                                      : fmt::format("drafter dp {}", l.dp_rank);
}

// Before any rank allocates: the ranks that share a machine add up what the memory plan says each holds (the CPU
// backend: everything in host memory) and the first of them refuses a sum above the machine's memory, naming every
// rank's need, so absurd sizes end in a message instead of std::bad_alloc or the OOM killer. With run.device: cuda
// the host holds little (weights and activations are on the GPUs): --check compares the per-GPU plan with the cards.
void check_node_memory(const TrainConfig& cfg, const train::RunPlan& plan, const comm::RankLayout& layout,
                       const io::Dataset& data, int rank) {
  if (cfg.run.device == "cuda") return;
  int64_t longest = 0;
  for (size_t i = 1; i < data.offsets().size(); ++i) longest = std::max(longest, data.offsets()[i] - data.offsets()[i - 1]);
  const preflight::GpuMemoryPlan mem = preflight::gpu_memory_plan(preflight::memory_plan_inputs(cfg, plan, longest));
  const bool is_target = layout.role == comm::Role::Target;
  double need = is_target ? mem.target.total() : mem.drafter.total();
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int node_rank = 0, node_size = 1;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_size(node, &node_size);
  std::vector<double> needs(node_size);
  std::vector<int> ranks(node_size);
  MPI_Gather(&need, 1, MPI_DOUBLE, needs.data(), 1, MPI_DOUBLE, 0, node);
  MPI_Gather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, 0, node);
  MPI_Comm_free(&node);
  if (node_rank != 0) return;
  std::vector<std::pair<std::string, double>> named;
  for (int i = 0; i < node_size; ++i)
    named.push_back({fmt::format("world rank {} ({})", ranks[i], rank_role(cfg, layout.world_size, ranks[i])),
                     needs[i]});
  char host[256] = "this machine";
  gethostname(host, sizeof host - 1);
  const std::string refusal = preflight::memory_does_not_fit(named, preflight::machine_memory_bytes(), host);
  DFLASH_USER_CHECK(refusal.empty(), "{}", refusal);
}

// Where the run starts: the first drafter rank resolves and verifies the checkpoint; every rank learns the step.
struct Resume {
  int64_t start_step = 0;
  std::optional<state::LoadedCheckpoint> checkpoint;  // first drafter rank, when resuming
  state::RunIdentity identity;                        // first drafter rank
  std::optional<state::WarmStart> warm;               // first drafter rank, a fresh start with drafter.init
};

// init_identity: warm_start_identity(drafter.init) on world rank 0 (it hashes the weight file once, for the
// resolved config); the first drafter rank receives it for the checkpoints.
Resume resolve_resume(const TrainConfig& cfg, const train::RunPlan& plan, const comm::RankLayout& layout,
                      const io::Dataset& data, const EvalFiles& eval, comm::Transport& world, report::Logger& log,
                      std::string init_identity) {
  Resume out;
  const int first_drafter = layout.drafter_world_rank(0);
  if (!cfg.drafter.init.empty()) {
    int64_t length = int64_t(init_identity.size());
    world.broadcast(&length, 1, 0);
    init_identity.resize(size_t(length));
    world.broadcast_bytes(init_identity.data(), init_identity.size(), 0);
  }
  if (world.rank() == first_drafter) {
    // one pass over the data: what would train nothing or the wrong thing is refused; its identity goes into
    // every checkpoint and must match the one resumed from
    const preflight::DataFacts facts =
        preflight::scan_data_facts(data, plan.drafter.mask_token_id, cfg.data.max_seq_len);
    preflight::check_data_facts(facts, cfg);
    out.identity.dataset = facts.identity();
    out.identity.target = preflight::target_identity(cfg.target.path);
    // what --check verifies of the tokenizer, every job verifies too: a tokenizer that cannot produce the data or
    // disagrees with the target trains the wrong thing silently
    const preflight::TokenizerCheck tok =
        preflight::check_tokenizer(preflight::read_tokenizer_facts(cfg.target.path), cfg.target.path, plan.target.vocab,
                                   facts.max_token, plan.drafter.mask_token_id);
    DFLASH_USER_CHECK(tok.errors.empty(), "tokenizer, target and data disagree (dflash_mpi CONFIG --check shows the "
                      "same):\n  {}", fmt::format("{}", fmt::join(tok.errors, "\n  ")));
    for (const std::string& n : tok.notes) log.info("tokenizer: {}", n);
    log.info("target: {}", out.identity.target);
    log.info("data: {}; {} trained tokens, {} anchor candidates", out.identity.dataset, facts.trained_tokens,
             facts.anchor_candidates);
    if (eval.data) {  // what would score nothing is refused as for data.path
      TrainConfig as_data = cfg;
      as_data.data.path = cfg.eval.data;
      preflight::check_data_facts(
          preflight::scan_data_facts(*eval.data, plan.drafter.mask_token_id, cfg.data.max_seq_len), as_data);
    }
    const std::string dir = state::resolve_resume_dir(cfg);
    if (!dir.empty()) {
      out.checkpoint.emplace(state::load_checkpoint(dir, state::checkpoint_expectation(cfg, plan, out.identity)));
      for (const auto& [what, recorded] : {std::pair<const char*, const std::string&>{"dataset", out.checkpoint->state.dataset},
                                           {"target", out.checkpoint->state.target}})
        if (recorded.empty())
          log.warn("resuming from {}: the checkpoint records no {} identity (written by an older dflash_mpi), so "
                   "resuming on another {} would not be noticed; make sure {} is the one it was trained with", dir,
                   what, what, std::string(what) == "dataset" ? "data.path" : "target.path");
      DFLASH_USER_CHECK(!out.checkpoint->state.extra.contains("best"),
                        "ckpt.resume = {}: the best checkpoint holds weights without optimizer state and is not "
                        "for resuming; resume from a step_* checkpoint (ckpt.resume: auto)", dir);
      out.start_step = out.checkpoint->state.step;
      out.identity.init = out.checkpoint->state.extra.value("init", std::string());
      log.info("resuming from {} at step {}", dir, out.start_step);
      if (!cfg.drafter.init.empty()) log.info("drafter.init is not read: the run resumes from its checkpoint");
    } else if (cfg.ckpt.resume == "auto") {
      log.info("ckpt.resume=auto: no complete checkpoint in {}/ckpt; starting from step 0", cfg.run.out_dir);
    }
    if (out.start_step == 0 && !cfg.drafter.init.empty()) {
      out.warm.emplace(state::load_warm_start(cfg, plan, init_identity));
      out.identity.init = out.warm->identity;
      log.info("warm start (drafter.init): {}; fresh optimizer, step 0", out.identity.init);
    }
  }
  world.broadcast(&out.start_step, 1, first_drafter);
  DFLASH_USER_CHECK(out.start_step <= plan.total_steps, "the checkpoint is at step {}, past this run's {} steps",
                    out.start_step, plan.total_steps);
  return out;
}

// This rank's role: the target worker or the drafter worker (lib/job/workers.h).
// How the run ended on this rank: a target rank does not know (RunOutcome::running), a drafter rank does.
RunStatus run_my_role(const TrainConfig& cfg, const train::RunPlan& plan, const comm::RankLayout& layout,
                      const comm::RoleComms& comms, const io::Dataset& data, const EvalFiles& eval,
                      const Resume& resume, const ProgramOptions& options, report::Logger& log,
                      train::Watchdog& watchdog) {
  if (layout.role == comm::Role::Target) {
    run_target_worker(cfg, plan, layout, comms, data, resume.start_step, log, watchdog, eval.inputs());
    return {};
  }
  DrafterRunOptions o;
  o.start_step = resume.start_step;
  o.resume = resume.checkpoint ? &*resume.checkpoint : nullptr;
  o.init = resume.warm ? &resume.warm->params : nullptr;
  o.stop_after = options.stop_after;
  o.dump_dir = options.dump_dir;
  o.identity = resume.identity;
  o.eval.data = eval.inputs().data;
  return run_drafter_worker(cfg, plan, layout, comms, data, o, log, watchdog);
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

  dflash::comm::init_mpi(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string who;
  std::optional<RunLock> lock;  // world rank 0: out_dir is this job's until the end
  std::unique_ptr<report::Logger> log;
  try {
    install_stop_signal_handlers();
    const TrainConfig cfg = load_config(options->config, options->sets);
    const comm::RankLayout layout = comm::make_rank_layout(cfg.layout.target_tp, cfg.layout.target_groups,
                                                           cfg.layout.drafter_dp, size, rank);
    who = layout.describe();
    const comm::DataPlane plane = bind_device_and_choose_plane(cfg, layout, who);
    // nothing is written to out_dir before world rank 0 holds it (a refused job must not touch another's files)
    const JobIdentity me = current_job_identity();
    std::string out_dir_notice;
    if (rank == 0) {
      lock.emplace(cfg.run.out_dir, me);
      out_dir_notice = state::guard_out_dir(cfg);  // an earlier run's weights are never replaced by a fresh start
    }
    const model::QwenConfig target = model::load_qwen_config(cfg.target.path);
    if (rank == 0)
      preflight::check_target_weights(cfg.target.path, target);  // headers only: every rank would fail alike
    MPI_Barrier(MPI_COMM_WORLD);
    // targets check every token id against the vocabulary on open; drafters only need the offsets
    const bool is_target = layout.role == comm::Role::Target;
    const io::Dataset data(cfg.data.path, target.vocab, /*scan_tokens=*/is_target);
    const train::RunPlan plan = train::make_run_plan(cfg, target, data.size());
    check_node_memory(cfg, plan, layout, data, rank);
    const EvalFiles eval(cfg, plan, is_target);
    // world rank 0 hashes the warm start's weight file once: the resolved config and (broadcast) the checkpoints
    const std::string init_identity =
        rank == 0 && !cfg.drafter.init.empty() ? state::warm_start_identity(cfg.drafter.init) : std::string();
    if (rank == 0) print_banner(cfg, plan, size, init_identity);
    comm::RoleComms comms(layout, MPI_COMM_WORLD, plane, cfg.run.watchdog_seconds);
    log = make_logger(cfg, layout, rank, me);
    if (lock && !lock->taken_over().empty()) log->warn("{}", lock->taken_over());
    if (!out_dir_notice.empty()) log->warn("{}", out_dir_notice);
    // a rank blocked in one wait longer than the bound (which follows the steps: lib/train/watchdog.h) says so,
    // with every rank's heartbeat (which names a stopped rank), and takes the job down
    train::Watchdog watchdog(cfg.run.watchdog_seconds, [&](const std::string& what, double waited) {
      timeval tv{};
      gettimeofday(&tv, nullptr);
      const std::string ranks =
          train::diagnose_heartbeats(cfg.run.out_dir, size, double(tv.tv_sec) + 1e-6 * double(tv.tv_usec),
                                     /*stale_after=*/5.0, [&](int r) { return rank_role(cfg, size, r); });
      const std::string message = fmt::format(
          "watchdog: world rank {} has waited {:.0f} s for the {} (bound {}): a rank is stopped or stalled "
          "(SIGSTOP, a hung device, a dead link); aborting the job. Heartbeats:{}",
          rank, waited, what, watchdog.bound_reason(), ranks);
      report_error(who, message, log.get());
      sleep(2);  // the other ranks' watchdogs, which fire about now, report their waits too: the stall's shape
      abort_now(lock ? &*lock : nullptr);
    });
    watchdog.follow_steps(cfg.run.watchdog_floor_seconds, cfg.run.watchdog_step_multiple);
    watchdog.beat_to(train::heartbeat_path(cfg.run.out_dir, rank));
    comm::MpiTransport world_mpi(MPI_COMM_WORLD);
    train::WatchedTransport world(world_mpi, watchdog, "world");
    log->info("{} ranks ({}); config {} (hash {}); data plane {} (layout.transport {})", size, who, options->config,
              config_hash_hex(cfg), comm::data_plane_name(plane), cfg.layout.transport);
    const Resume resume = resolve_resume(cfg, plan, layout, data, eval, world, *log, init_identity);
    if (rank == 0) write_run_status(cfg.run.out_dir, {RunOutcome::running, resume.start_step, plan.total_steps, 0});
    const RunStatus mine = run_my_role(cfg, plan, layout, comms, data, eval, resume, *options, *log, watchdog);
    const RunStatus end = gather_run_status(mine, layout, world);
    if (rank == 0) write_run_status(cfg.run.out_dir, end);
  } catch (const std::exception& e) {
    abort_world(rank, who, e.what(), log.get(), lock ? &*lock : nullptr);
  }
  log.reset();
  lock.reset();
  MPI_Finalize();
  return 0;
}

}  // namespace dflash::job
