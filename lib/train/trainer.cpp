#include "lib/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>

#include "lib/comm/layout.h"
#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/io/dataset.h"
#include "lib/model/qwen_config.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"
#include "lib/io/export.h"
#include "lib/train/checkpointing.h"
#include "lib/train/log.h"
#include "lib/train/signals.h"
#include "lib/train/run_plan.h"
#include "lib/train/workers.h"

namespace dflash::train {

namespace {

const char* kUsage =
    "usage: mpirun -np N dflash_mpi CONFIG.yaml [--set key=value ...] [--stop-after-steps K] [--dump-step DIR]\n"
    "       dflash_mpi --export STEP_DIR OUT_DIR [--dtype bf16|f32]\n"
    "  N must equal layout.target_tp * layout.target_groups + layout.drafter_dp (default 5*1+3 = 8).\n"
    "  --stop-after-steps K  run K steps from the start (or the resumed step), write a checkpoint, exit\n"
    "  --dump-step DIR       run one step and write its inputs, loss and gradients to DIR/step_XXXXXXXX.safetensors\n"
    "  --export              write a checkpoint as model.safetensors + config.json for serving (docs/export.md)\n"
    "  --check               (no mpirun) validate the config, target config.json, data and checkpoint to resume;\n"
    "                        print the plan and memory estimates, run nothing\n"
    "  SIGTERM / SIGUSR1: finish the current step, write a checkpoint, exit 0 (resume with ckpt.resume=auto).\n"
    "  Keys: docs/config.md. Example: mpi_launch/configs/tiny.yaml\n";

struct ProgramOptions {
  int64_t stop_after = 0;
  std::string dump_dir;
  bool check = false;
};

// The options after the config file and its --set overrides.
ProgramOptions parse_program_options(const std::vector<std::string>& rest) {
  ProgramOptions o;
  for (size_t i = 0; i < rest.size(); ++i) {
    const std::string& a = rest[i];
    auto value = [&]() -> const std::string& {
      DFLASH_CHECK(i + 1 < rest.size(), "dflash_mpi: {} needs a value", a);
      return rest[++i];
    };
    if (a == "--stop-after-steps") {
      const std::string& v = value();
      char* end = nullptr;
      o.stop_after = std::strtoll(v.c_str(), &end, 10);
      DFLASH_CHECK(end && *end == 0 && o.stop_after > 0, "dflash_mpi: --stop-after-steps expects a positive integer, "
                                                         "got '{}'", v);
    } else if (a == "--dump-step") {
      o.dump_dir = value();
    } else if (a == "--check") {
      o.check = true;
    } else {
      DFLASH_FAIL("dflash_mpi: unknown option '{}'\n{}", a, kUsage);
    }
  }
  return o;
}

// --check: everything that can be validated without the MPI job, and what the job would need.
int run_check(const TrainConfig& cfg) {
  const int world = cfg.layout.target_tp * cfg.layout.target_groups + cfg.layout.drafter_dp;
  const model::QwenConfig target = model::load_qwen_config(cfg.target.path);
  const io::Dataset data(cfg.data.path, target.vocab, /*scan_tokens=*/true);
  const RunPlan plan = make_run_plan(cfg, target, data.size());
  const DrafterParams<float> params(plan.drafter);
  std::printf("%s\n", format_config_table(cfg).c_str());
  auto size = [](double bytes) {
    return bytes >= 1024.0 * 1024 * 1024 ? fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024))
                                         : fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
  };
  // the largest TP rank's linear weights (the embedding is read per forward, not held)
  double target_params = 0;
  for (int r = 0; r < cfg.layout.target_tp; ++r) {
    const auto shard = model::plan_target_shard(target, cfg.layout.target_tp, r, model::TargetOptions{}.mlp_grain);
    target_params = std::max(target_params, model::shard_cost(target, shard, 1).weight_params);
  }
  std::printf("check: OK\n");
  std::printf("  ranks          mpirun -np %d (%d target TP x %d groups + %d drafter DP)\n", world,
              cfg.layout.target_tp, cfg.layout.target_groups, cfg.layout.drafter_dp);
  std::printf("  target         %s: %d layers, H %d, %d Q / %d KV heads, vocab %d; taps %s\n", cfg.target.path.c_str(),
              target.layers, target.hidden, target.heads, target.kv_heads, target.vocab,
              fmt::format("{}", fmt::join(plan.tap_ids, ",")).c_str());
  std::printf("  drafter        %d layers, %d Q / %d KV heads x %d, I %d, block %d: %zu parameters\n",
              plan.drafter.layers, plan.drafter.heads, plan.drafter.kv_heads, plan.drafter.head_dim,
              plan.drafter.intermediate, plan.drafter.block_size, params.flat.size());
  std::printf("  data           %s: %lld sequences, %lld tokens; %lld steps per epoch, %lld steps\n",
              cfg.data.path.c_str(), (long long)data.size(), (long long)data.total_tokens(),
              (long long)plan.steps_per_epoch, (long long)plan.total_steps);
  std::printf("  memory (fp32)  target shard ~%s per TP rank; drafter rank: embedding + lm_head %s, weights + "
              "grads + AdamW %s, loss scratch %s\n",
              size(target_params * 4).c_str(),
              size(double(target.vocab) * target.hidden * 4 * (target.tie_word_embeddings ? 1 : 2)).c_str(),
              size(double(params.flat.size()) * 4 * 4).c_str(), size(2.0 * cfg.loss.chunk_size * target.vocab * 4).c_str());
  const std::string resume = resolve_resume_dir(cfg);
  if (!resume.empty()) {
    const io::LoadedCheckpoint c = io::load_checkpoint(resume, checkpoint_expectation(cfg, plan));
    std::printf("  resume         %s (step %lld) verified\n", resume.c_str(), (long long)c.state.step);
  } else {
    std::printf("  resume         %s\n", cfg.ckpt.resume == "auto" ? "auto: no complete checkpoint yet, would start at step 0"
                                                                   : "none: would start at step 0");
  }
  return 0;
}

// dflash_mpi --export STEP_DIR OUT_DIR [--dtype bf16|f32]: no MPI job needed.
int run_export(const std::vector<std::string>& args) {
  DFLASH_CHECK(args.size() == 2 || (args.size() == 4 && args[2] == "--dtype"),
               "usage: dflash_mpi --export STEP_DIR OUT_DIR [--dtype bf16|f32]");
  const std::string dtype = args.size() == 4 ? args[3] : "bf16";
  DFLASH_CHECK(dtype == "bf16" || dtype == "f32", "--dtype {}: use bf16 or f32", dtype);
  io::export_drafter(args[0], args[1], dtype == "bf16" ? io::DType::BF16 : io::DType::F32);
  std::printf("exported %s to %s (%s): model.safetensors + config.json\n", args[0].c_str(), args[1].c_str(),
              dtype.c_str());
  return 0;
}

// Prints the error once and takes the world down. Errors every rank hits alike (config, layout, data) are
// printed by world rank 0; the others give it a moment to do so, then abort too. An error only one rank sees is
// printed by that rank (after the same moment) with its identity.
[[noreturn]] void abort_world(int rank, const std::string& who, const std::string& message, Logger* log) {
  if (rank != 0) {
    // mpirun answers rank 0's abort with SIGTERM: let it end this rank quietly instead of the stop handler
    std::signal(SIGTERM, SIG_DFL);
    sleep(2);
  }
  if (log) {
    log->error("{}", message);  // to the rank's log file and to stderr, with its identity
  } else {
    std::fprintf(stderr, "dflash_mpi%s: error: %s\n", who.empty() ? "" : (" " + who).c_str(), message.c_str());
  }
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
    if (argc >= 2 && std::string(argv[1]) == "--export") {
      int rc = 0;
      if (rank == 0) rc = run_export(std::vector<std::string>(argv + 2, argv + argc));
      MPI_Finalize();
      return rc;
    }
    ConfigCli cli = parse_config_cli(argc, argv);
    if (cli.file.empty()) {
      if (rank == 0) std::fprintf(stderr, "%s", kUsage);
      MPI_Finalize();
      return 2;
    }
    const ProgramOptions options = parse_program_options(cli.rest);
    install_stop_signal_handlers();
    const TrainConfig cfg = load_config(cli.file, cli.sets);
    if (options.check) {
      const int rc = rank == 0 ? run_check(cfg) : 0;
      MPI_Finalize();
      return rc;
    }
    const comm::RankLayout layout = comm::make_rank_layout(cfg.layout.target_tp, cfg.layout.target_groups,
                                                     cfg.layout.drafter_dp, size, rank);
    who = layout.describe();
    DFLASH_USER_CHECK(cfg.run.device == "cpu",
                 "run.device = {}: this build trains on the CPU only (the CUDA backend is not implemented yet); set "
                 "run.device: cpu",
                 cfg.run.device);
    DFLASH_USER_CHECK(cfg.layout.transport == "mpi",
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
    if (is_target && cfg.layout.target_groups > 1) id.group = layout.group;
    const bool console = !is_target && layout.dp_rank == 0;
    log = std::make_unique<Logger>(cfg.run.out_dir, id, resolve_log_level(cfg.log.level), console);
    log->info("{} ranks ({}); config {} (hash {})", size, who, cli.file, config_hash_hex(cfg));

    // the first drafter rank resolves and verifies the checkpoint to resume from; every rank learns its step
    std::optional<io::LoadedCheckpoint> resumed;
    int64_t start_step = 0;
    const int first_drafter = layout.drafter_world_rank(0);
    if (rank == first_drafter) {
      const std::string dir = resolve_resume_dir(cfg);
      if (!dir.empty()) {
        resumed.emplace(io::load_checkpoint(dir, checkpoint_expectation(cfg, plan)));
        start_step = resumed->state.step;
        log->info("resuming from {} at step {}", dir, start_step);
      } else if (cfg.ckpt.resume == "auto") {
        log->info("ckpt.resume=auto: no complete checkpoint in {}/ckpt; starting from step 0", cfg.run.out_dir);
      }
    }
    MPI_Bcast(&start_step, 1, MPI_INT64_T, first_drafter, MPI_COMM_WORLD);
    DFLASH_USER_CHECK(start_step <= plan.total_steps, "the checkpoint is at step {}, past this run's {} steps",
                 start_step, plan.total_steps);
    if (is_target) {
      run_target_worker(cfg, plan, layout, comms, data, start_step, *log);
    } else {
      DrafterRunOptions o;
      o.start_step = start_step;
      o.resume = resumed ? &*resumed : nullptr;
      o.stop_after = options.stop_after;
      o.dump_dir = options.dump_dir;
      run_drafter_worker(cfg, plan, layout, comms, data, o, *log);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    abort_world(rank, who, e.what(), log.get());
  }
  log.reset();
  MPI_Finalize();
  return 0;
}

}  // namespace dflash::train
