#pragma once
// A dflash_mpi rank's job, resolved once at start-up and handed whole to the role it runs (torchtitan's
// Trainer.__init__: everything decided once, the components built from it; the loops only call them).
// resolve_job fills it in this order: the config; the rank layout, this rank's GPU and the data plane; out_dir's
// lock (world rank 0); the target's config.json and the data; the run plan; the in-training evals (their inputs); the
// communicators, the logger and the watchdog; where the run starts (resume or warm start). A setting is read as
// its typed value here (run.device, run.precision, layout.transport: enums, lib/config/config.h) and nowhere
// compared as text.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "lib/comm/layout.h"
#include "lib/comm/mpi_transport.h"
#include "lib/config/config.h"
#include "lib/eval/evals.h"
#include "lib/io/dataset.h"
#include "lib/job/cli.h"
#include "lib/job/job_identity.h"
#include "lib/job/run_lock.h"
#include "lib/model/qwen_config.h"
#include "lib/report/log.h"
#include "lib/state/checkpoint.h"
#include "lib/state/checkpointing.h"
#include "lib/state/warm_start.h"
#include "lib/train/run_plan.h"
#include "lib/train/watchdog.h"

namespace dflash::job {

// Where the run starts: the first drafter rank resolves and verifies the checkpoint; every rank learns the step.
struct Resume {
  int64_t start_step = 0;
  std::optional<state::LoadedCheckpoint> checkpoint;  // first drafter rank, when resuming
  state::RunIdentity identity;                        // first drafter rank
  std::optional<state::WarmStart> warm;               // first drafter rank, a fresh start with drafter.init
};

struct Job {
  ProgramOptions options;                   // the command line
  int rank = 0, size = 1;                   // in MPI_COMM_WORLD
  TrainConfig cfg;
  comm::RankLayout layout;
  std::string who;                          // layout.describe(): how this rank's messages name it
  comm::DataPlane plane = comm::DataPlane::Mpi;
  JobIdentity me;                           // who runs this attempt
  std::optional<RunLock> lock;              // world rank 0: out_dir is this job's until the end
  model::QwenConfig target;                 // target.path's config.json
  std::optional<io::Dataset> data;          // data.path (target ranks check every token id on open)
  train::RunPlan plan;
  eval::TrainingEvals evals;                // the in-training evals, their inputs opened (lib/eval/evals.h)
  std::string init_identity;                // drafter.init's content identity (world rank 0, then broadcast)
  std::unique_ptr<comm::RoleComms> comms;
  std::unique_ptr<report::Logger> log;
  std::unique_ptr<train::Watchdog> watchdog;
  std::unique_ptr<comm::MpiTransport> world_mpi;
  std::unique_ptr<train::WatchedTransport> world;  // the control plane's world, every wait watched
  Resume resume;

  bool is_target() const { return layout.role == comm::Role::Target; }
  const io::Dataset& dataset() const { return *data; }
};

// Fills job (options, rank and size set) step by step in the order above; what was built stays in job when a step
// throws (the logger, once made, reports the error). Collective over MPI_COMM_WORLD. on_stall: what the watchdog
// does with its message when a wait outlives its bound (report it, take the world down; it does not return).
void resolve_job(Job& job, const std::function<void(const std::string& message)>& on_stall);

// World rank r's role as the messages about other ranks name it: "target group 0 tp 3", "drafter dp 1".
std::string rank_role(const TrainConfig& cfg, int world_size, int r);

}  // namespace dflash::job
