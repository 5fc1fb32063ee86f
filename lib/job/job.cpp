#include "lib/job/job.h"

#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/backend.h"
#include "lib/comm/data_plane.h"
#include "lib/comm/mpi_init.h"
#include "lib/comm/nccl_transport.h"
#include "lib/core/error.h"
#include "lib/core/named_enum.h"
#include "lib/model/target_identity.h"
#include "lib/preflight/memory_plan.h"
#include "lib/preflight/target_check.h"
#include "lib/preflight/tokenizer_check.h"
#include "lib/state/out_dir_guard.h"
#include "lib/train/data_facts.h"
#include "lib/train/heartbeat.h"

namespace dflash::job {

std::string rank_role(const TrainConfig& cfg, int world_size, int r) {
  const comm::RankLayout l =
      comm::make_rank_layout(cfg.layout.target_tp, cfg.layout.target_groups, cfg.layout.drafter_dp, world_size, r);
  return l.role == comm::Role::Target ? fmt::format("target group {} tp {}", l.group, l.tp_rank)
                                      : fmt::format("drafter dp {}", l.dp_rank);
}

namespace {

// run.device cuda: every rank binds a GPU of its node by node-local rank (several ranks may share one); the drafter
// step and the target forward run on it (docs/backend.md). Then the data plane (lib/comm/data_plane.h): every rank
// decides alike from the job's shape.
comm::DataPlane bind_device_and_choose_plane(const Job& job) {
  const int local_rank = comm::node_local_rank(MPI_COMM_WORLD);
  const bool cuda = job.cfg.run.device == kernels::Device::cuda;
  if (cuda) {
    const int gpu = kernels::bind_cuda_device(local_rank);
    std::printf("%s: %s on GPU %d\n", job.who.c_str(), job.is_target() ? "target forward" : "drafter step", gpu);
  }
  return comm::choose_data_plane(job.cfg.layout.transport, cuda, comm::nccl_built(), comm::node_shape(MPI_COMM_WORLD));
}

void print_banner(const Job& job) {
  const TrainConfig& cfg = job.cfg;
  std::printf("%s\n", format_config_table(cfg).c_str());
  // the warm start's content identity, which the keys do not hold (a folder's weights may change)
  const std::string resolved = write_resolved_config(
      cfg, job.init_identity.empty() ? "" : "# drafter.init: " + job.init_identity + "\n");
  std::printf("dflash_mpi: %d ranks (%d target TP x %d groups + %d drafter DP), %lld steps of %d x %d "
              "sequences; resolved config in %s\n",
              job.size, cfg.layout.target_tp, cfg.layout.target_groups, cfg.layout.drafter_dp,
              (long long)job.plan.total_steps, cfg.layout.drafter_dp, cfg.optim.micro_batches, resolved.c_str());
  std::fflush(stdout);
}

// Every attempt (first run, resume, requeue) appends to the rank's log after a header saying who runs it; the
// first drafter rank also prints to the console.
std::unique_ptr<report::Logger> make_logger(const Job& job) {
  const comm::RankLayout& layout = job.layout;
  report::LogIdentity id;
  id.rank = job.rank;
  id.role = comm::role_name(layout.role);
  id.index = job.is_target() ? layout.tp_rank : layout.dp_rank;
  if (job.is_target() && job.cfg.layout.target_groups > 1) id.group = layout.group;
  const bool console = !job.is_target() && layout.dp_rank == 0;
  return std::make_unique<report::Logger>(job.cfg.run.out_dir, id, report::resolve_log_level(job.cfg.log.level),
                                          console, fmt::format("===== attempt: {} =====", describe(job.me)));
}

// Before any rank allocates: the ranks that share a machine add up what the memory plan says each holds (the CPU
// backend: everything in host memory) and the first of them refuses a sum above the machine's memory, naming every
// rank's need, so absurd sizes end in a message instead of std::bad_alloc or the OOM killer. With run.device: cuda
// the host holds little (weights and activations are on the GPUs): --check compares the per-GPU plan with the cards.
void check_node_memory(const Job& job) {
  const TrainConfig& cfg = job.cfg;
  if (cfg.run.device == kernels::Device::cuda) return;
  const io::Dataset& data = job.dataset();
  int64_t longest = 0;
  for (size_t i = 1; i < data.offsets().size(); ++i)
    longest = std::max(longest, data.offsets()[i] - data.offsets()[i - 1]);
  const preflight::GpuMemoryPlan mem =
      preflight::gpu_memory_plan(preflight::memory_plan_inputs(cfg, job.plan, longest));
  double need = job.is_target() ? mem.target.total() : mem.drafter.total();
  int rank = job.rank;
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
    named.push_back({fmt::format("world rank {} ({})", ranks[i], rank_role(cfg, job.size, ranks[i])), needs[i]});
  char host[256] = "this machine";
  gethostname(host, sizeof host - 1);
  const std::string refusal = preflight::memory_does_not_fit(named, preflight::machine_memory_bytes(), host);
  DFLASH_USER_CHECK(refusal.empty(), "{}", refusal);
}

// A rank blocked in one wait longer than the bound (which follows the steps: lib/train/watchdog.h) says so, with
// every rank's heartbeat (which names a stopped rank), and takes the job down.
std::unique_ptr<train::Watchdog> make_watchdog(Job& job, const std::function<void(const std::string&)>& abort) {
  const TrainConfig& cfg = job.cfg;
  auto watchdog = std::make_unique<train::Watchdog>(cfg.run.watchdog_seconds, [&job, abort](const std::string& what,
                                                                                           double waited) {
    timeval tv{};
    gettimeofday(&tv, nullptr);
    const std::string ranks =
        train::diagnose_heartbeats(job.cfg.run.out_dir, job.size, double(tv.tv_sec) + 1e-6 * double(tv.tv_usec),
                                   /*stale_after=*/5.0, [&](int r) { return rank_role(job.cfg, job.size, r); });
    abort(fmt::format("watchdog: world rank {} has waited {:.0f} s for the {} (bound {}): a rank is stopped or "
                      "stalled (SIGSTOP, a hung device, a dead link); aborting the job. Heartbeats:{}",
                      job.rank, waited, what, job.watchdog->bound_reason(), ranks));
  });
  watchdog->follow_steps(cfg.run.watchdog_floor_seconds, cfg.run.watchdog_step_multiple);
  watchdog->beat_to(train::heartbeat_path(cfg.run.out_dir, job.rank));
  return watchdog;
}

// init_identity: warm_start_identity(drafter.init) on world rank 0 (it hashes the weight file once, for the
// resolved config); the first drafter rank receives it for the checkpoints.
Resume resolve_resume(Job& job) {
  const TrainConfig& cfg = job.cfg;
  const train::RunPlan& plan = job.plan;
  comm::Transport& world = *job.world;
  report::Logger& log = *job.log;
  Resume out;
  const int first_drafter = job.layout.drafter_world_rank(0);
  std::string init_identity = job.init_identity;
  if (!cfg.drafter.init.empty()) {
    int64_t length = int64_t(init_identity.size());
    world.broadcast(&length, 1, 0);
    init_identity.resize(size_t(length));
    world.broadcast_bytes(init_identity.data(), init_identity.size(), 0);
  }
  if (world.rank() == first_drafter) {
    // one pass over the data: what would train nothing or the wrong thing is refused; its identity goes into
    // every checkpoint and must match the one resumed from
    const train::DataFacts facts =
        train::scan_data_facts(job.dataset(), plan.drafter.mask_token_id, cfg.data.max_seq_len);
    train::check_data_facts(facts, cfg);
    out.identity.dataset = facts.identity();
    out.identity.target = model::target_identity(cfg.target.path);
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
    for (const auto& e : job.evals) e->check_on_start();
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

}  // namespace

void resolve_job(Job& job, const std::function<void(const std::string&)>& abort) {
  job.cfg = load_config(job.options.config, job.options.sets);
  const TrainConfig& cfg = job.cfg;
  job.layout = comm::make_rank_layout(cfg.layout.target_tp, cfg.layout.target_groups, cfg.layout.drafter_dp,
                                      job.size, job.rank);
  job.who = job.layout.describe();
  job.plane = bind_device_and_choose_plane(job);
  // nothing is written to out_dir before world rank 0 holds it (a refused job must not touch another's files)
  job.me = current_job_identity();
  std::string out_dir_notice;
  if (job.rank == 0) {
    job.lock.emplace(cfg.run.out_dir, job.me);
    out_dir_notice = state::guard_out_dir(cfg);  // an earlier run's weights are never replaced by a fresh start
  }
  job.target = model::load_qwen_config(cfg.target.path);
  if (job.rank == 0)
    preflight::check_target_weights(cfg.target.path, job.target);  // headers only: every rank would fail alike
  MPI_Barrier(MPI_COMM_WORLD);
  // targets check every token id against the vocabulary on open; drafters only need the offsets
  job.data.emplace(cfg.data.path, job.target.vocab, /*scan_tokens=*/job.is_target());
  job.plan = train::make_run_plan(cfg, job.target, job.dataset().size());
  check_node_memory(job);
  job.evals = eval::make_training_evals(cfg, job.plan, /*scan_tokens=*/job.is_target());
  // world rank 0 hashes the warm start's weight file once: the resolved config and (broadcast) the checkpoints
  if (job.rank == 0 && !cfg.drafter.init.empty()) job.init_identity = state::warm_start_identity(cfg.drafter.init);
  if (job.rank == 0) print_banner(job);
  job.comms = std::make_unique<comm::RoleComms>(job.layout, MPI_COMM_WORLD, job.plane, cfg.run.watchdog_seconds);
  job.log = make_logger(job);
  if (job.lock && !job.lock->taken_over().empty()) job.log->warn("{}", job.lock->taken_over());
  if (!out_dir_notice.empty()) job.log->warn("{}", out_dir_notice);
  job.watchdog = make_watchdog(job, abort);
  job.world_mpi = std::make_unique<comm::MpiTransport>(MPI_COMM_WORLD);
  job.world = std::make_unique<train::WatchedTransport>(*job.world_mpi, *job.watchdog, "world");
  job.log->info("{} ranks ({}); config {} (hash {}); data plane {} (layout.transport {})", job.size, job.who,
                job.options.config, config_hash_hex(cfg), comm::data_plane_name(job.plane),
                name_of(cfg.layout.transport));
  job.resume = resolve_resume(job);
}

}  // namespace dflash::job
