#include <cstdio>
#include <deque>
#include <optional>

#include "lib/comm/mpi_transport.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/eval/heldout_eval.h"
#include "lib/eval/spec_eval.h"
#include "lib/io/safetensors.h"
#include "lib/job/signals.h"
#include "lib/job/workers.h"
#include "lib/model/target.h"
#include "lib/report/metrics.h"
#include "lib/report/progress.h"
#include "lib/state/best_checkpoint.h"
#include "lib/state/checkpoint.h"
#include "lib/state/checkpointing.h"
#include "lib/state/step_dump.h"
#include "lib/train/drafter_step.h"
#include "lib/train/packet.h"

namespace dflash::train {

namespace {

// Every drafter rank must hold the same weights after each step; a divergence (non-deterministic reduction, a
// bad node) is an error rather than a silently forked run.
void check_identical_weights(comm::Transport& dp, DrafterStep& trainer, int64_t step) {
  uint64_t mine = trainer.weights_hash(), root = mine;
  dp.broadcast(&root, 1, 0);
  double differs = root != mine ? 1.0 : 0.0;
  dp.allreduce_sum(&differs, 1);
  DFLASH_CHECK(differs == 0, "after step {}: {} drafter rank(s) hold weights that differ from drafter rank 0",
               step, differs);
}

// Rank 0 holds the loaded checkpoint; the others get weights and optimizer state from it (no shared file system
// needed between drafter ranks).
void restore(comm::Transport& dp, DrafterStep& trainer, const LoadedCheckpoint* ckpt) {
  model::DrafterParams<float>& w = trainer.params();
  model::AdamWState& adam = trainer.optimizer();
  if (dp.rank() == 0) {
    DFLASH_CHECK(ckpt, "internal: drafter rank 0 resumes without a loaded checkpoint");
    w.flat = ckpt->params.flat;
    adam = ckpt->optimizer;
  }
  int64_t adam_step = adam.step, has_moments = adam.m.empty() ? 0 : 1;
  dp.broadcast(&adam_step, 1, 0);
  dp.broadcast(&has_moments, 1, 0);
  dp.broadcast(w.flat.data(), w.flat.size(), 0);
  adam.step = adam_step;
  if (has_moments) {
    adam.m.resize(w.flat.size());
    adam.v.resize(w.flat.size());
    dp.broadcast(adam.m.data(), adam.m.size(), 0);
    dp.broadcast(adam.v.data(), adam.v.size(), 0);
  }
  trainer.upload_state();  // the backend's copies follow the restored host state
}

}  // namespace

std::string write_final_weights(const std::string& out_dir, const model::DrafterParams<float>& params) {
  const std::string path = out_dir + "/drafter_final.safetensors", tmp = path + ".partial";
  std::vector<io::TensorToWrite> tensors;
  for (const model::ParamInfo& p : params.layout)
    tensors.push_back(io::tensor_from(p.name, io::DType::F32, p.shape, params.data(p)));
  io::write_safetensors(tmp, tensors, {{"format", "pt"}});
  DFLASH_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename {} to {}", tmp, path);
  return path;
}

void run_drafter_worker(const TrainConfig& cfg, const RunPlan& plan, const comm::RankLayout& layout,
                        const comm::RoleComms& comms, const io::Dataset& data, const DrafterRunOptions& opt,
                        Logger& log, Watchdog& watchdog) {
  comm::MpiTransport dp_mpi(comms.dp()), world_mpi(comms.world());
  WatchedTransport dp(dp_mpi, watchdog, "drafter DP group"), world(world_mpi, watchdog, "world");
  // the data plane (layout.transport): the gradient all-reduce and the packets' tensors
  const char* plane = comm::data_plane_name(comms.plane());
  WatchedTransport dp_data(comms.dp_data(), watchdog, fmt::format("drafter DP group ({} data plane)", plane)),
      world_data(comms.world_data(), watchdog, fmt::format("world ({} data plane)", plane));
  Timer load_timer;
  const model::TargetVocab vocab = model::load_target_vocab(cfg.target.path);
  DFLASH_CHECK(vocab.vocab == plan.target.vocab && vocab.hidden == plan.target.hidden,
               "{}: embedding is [{}, {}] but config.json says [{}, {}]", cfg.target.path, vocab.vocab, vocab.hidden,
               plan.target.vocab, plan.target.hidden);
  DrafterStep trainer(cfg, plan, vocab.embedding.data(), vocab.lm_head(), layout.dp_rank, dp_data);
  if (opt.start_step > 0) restore(dp, trainer, opt.resume);
  log.info("drafter: {} layers, H {}, {} Q / {} KV heads, block {}, {} parameters on the {} backend; {} in {:.2f} s",
           plan.drafter.layers, plan.drafter.hidden, plan.drafter.heads, plan.drafter.kv_heads,
           plan.drafter.block_size, model::drafter_param_count(plan.drafter), trainer.backend_name(),
           opt.start_step > 0 ? fmt::format("resumed at step {}", opt.start_step) : std::string("initialised"),
           load_timer.seconds());

  // the packets this rank will receive, in order: known from the schedule, so receives are posted early
  io::SequenceSchedule schedule(plan.num_sequences, cfg.layout.drafter_dp, cfg.optim.micro_batches,
                                uint64_t(cfg.run.seed), cfg.data.shuffle, cfg.data.path);
  int64_t plan_step = opt.start_step;
  int plan_micro = 0;
  // held-out eval (eval.every): this rank's share of the held-out sequences follows the packets of a due step
  const std::vector<int64_t> heldout =
      opt.eval.data ? heldout_sequences(heldout_count(cfg, *opt.eval.data), cfg.layout.drafter_dp, layout.dp_rank)
                    : std::vector<int64_t>{};
  std::deque<PacketPlan> heldout_plans;
  auto next_plan = [&]() -> std::optional<PacketPlan> {
    if (!heldout_plans.empty()) {
      const PacketPlan p = heldout_plans.front();
      heldout_plans.pop_front();
      return p;
    }
    if (plan_step >= plan.total_steps) return std::nullopt;
    PacketPlan p;
    p.step = plan_step;
    p.micro = plan_micro;
    p.seq_index = schedule.sequence(plan_step, plan_micro, layout.dp_rank);
    p.seq_len = streamed_length(cfg, data, p.seq_index);
    if (++plan_micro == cfg.optim.micro_batches) {
      plan_micro = 0;
      ++plan_step;
      if (opt.eval.data && heldout_due(cfg, plan_step))
        for (int64_t i : heldout) heldout_plans.push_back(heldout_plan(cfg, *opt.eval.data, plan_step - 1, i));
    }
    return p;
  };
  std::vector<int> sources;
  for (int t = 0; t < cfg.layout.target_tp; ++t) sources.push_back(layout.target_world_rank(layout.group, t));
  // a GPU drafter gets its packets in device memory: received in place over NCCL, uploaded on the receiver's copy
  // stream from page-locked staging over MPI (overlapping the compute of the packet before)
  PacketReceiver receiver(world, world_data, sources, int(plan.tap_ids.size()) * plan.target.hidden, plan.target.hidden,
                          cfg.layout.packets_in_flight, next_plan,
                          cfg.run.device == "cuda" ? MemoryKind::device : MemoryKind::host, cfg.data.max_seq_len);
  trainer.set_progress([&] { receiver.poll(); });  // the next packets move while this one is computed on

  const bool reporter = layout.dp_rank == 0;
  std::optional<MetricsWriter> metrics;
  if (reporter) {
    metrics.emplace(cfg.run.out_dir, opt.start_step);
    if (metrics->dropped() > 0)
      log.warn("{}: dropped {} record(s) past step {} (steps a stopped attempt ran after its last checkpoint, or a "
               "torn line); kept {}", metrics->path(), metrics->dropped(), opt.start_step, metrics->kept());
  }
  auto save = [&](int64_t next_step) {
    if (!reporter) return;
    Timer t;
    const std::string dir = save_checkpoint(cfg.run.out_dir, plan.drafter, trainer.params(), trainer.optimizer(),
                                                training_state(cfg, plan, next_step, opt.dataset_identity));
    const auto removed = prune_checkpoints(cfg.run.out_dir, cfg.ckpt.keep);
    log.info("checkpoint: {} ({:.2f} s){}", dir, t.seconds(),
             removed.empty() ? "" : fmt::format("; removed {} older", removed.size()));
  };

  // the best checkpoint (lib/state/best_checkpoint.h): by the speculative tau when it is measured, else held-out
  std::optional<BestCheckpoint> best;
  if (reporter && (cfg.eval.spec_every > 0 || cfg.eval.every > 0)) {
    best.emplace(cfg.run.out_dir, cfg.eval.spec_every > 0 ? "spec_tau" : "eval_tau", opt.start_step == 0);
    if (!best->notice().empty()) log.info("best checkpoint: {}", best->notice());
  }
  auto offer_best = [&](int64_t step, double tau) {
    Timer t;
    if (best->offer(tau, plan.drafter, trainer.params(), training_state(cfg, plan, step, opt.dataset_identity)))
      log.info("best checkpoint: {} = step {} ({} {:.4f}, {:.2f} s)", best_checkpoint_dir(cfg.run.out_dir), step,
               best->metric(), tau, t.seconds());
  };
  double heldout_seconds = 0, spec_seconds = 0;  // this rank's time in the evals (the end-of-run summary)

  Timer run_timer, interval;
  ProgressInterval progress(plan.drafter.block_size);
  int64_t next_step = opt.start_step;
  const bool dumping = !opt.dump_dir.empty();
  while (next_step < plan.total_steps) {
    const int64_t step = next_step++;
    StepCapture capture;
    std::vector<float> start_weights;  // --dump-step: the weights this step starts from
    if (dumping) start_weights = trainer.params().flat;
    const StepResult r = trainer.run(
        step, [&](int, double* wait) -> const FeaturePacket& { return receiver.next(wait); }, stop_signal() != 0,
        dumping ? &capture : nullptr);
    progress.add(r);
    if (r.skipped)
      log.warn("step {}: no scored positions in the global batch (sum of weights 0): weights unchanged", step + 1);
    if (dumping) {
      const std::string path = write_step_dump(opt.dump_dir, dp, plan, cfg, r, capture, trainer.params(),
                                                 start_weights);
      if (reporter) log.info("step dump: {}", path);
    }
    const bool stop_after = opt.stop_after > 0 && next_step - opt.start_step >= opt.stop_after;
    const bool stop = r.stop_requested || stop_after || dumping;
    const bool last = next_step == plan.total_steps;
    if (next_step % cfg.log.every == 0 || last || stop) {
      check_identical_weights(dp, trainer, next_step);
      const double secs = interval.seconds();
      const double eta = secs / progress.steps() * double(plan.total_steps - next_step);
      log.info("{}", progress.line(next_step, plan.total_steps, cfg.loss.top_k, secs, eta));
      if (metrics) metrics->write(progress.record(next_step, secs, run_timer.seconds()));
      interval.reset();
      progress.reset();
    }
    // the evals after this step (a stop skips the held-out one: its packets are dropped with the step's)
    // (every drafter rank joins its reduction, also one with no held-out sequence of its own)
    if (opt.eval.data && heldout_due(cfg, next_step) && !stop) {
      const HeldoutResult e = run_heldout_eval(trainer, dp, cfg, next_step, int64_t(heldout.size()),
                                               plan.drafter.block_size,
                                               [&](double* wait) -> const FeaturePacket& { return receiver.next(wait); });
      heldout_seconds += e.seconds;
      if (reporter) {
        log.info("{}", heldout_line(e, plan.drafter.block_size, cfg.loss.top_k));
        metrics->write(heldout_record(e, plan.drafter.block_size));
        if (best && best->metric() == "eval_tau") offer_best(next_step, heldout_tau(e));
      }
    }
    // drafter rank 0 always answers a due speculative eval: its target group waits for the weights
    if (reporter && spec_eval_due(cfg, next_step)) {
      Timer t;
      const nlohmann::ordered_json totals = spec_eval_exchange(world, trainer.params().flat, sources[0]);
      spec_seconds += t.seconds();
      log.info("{}", spec_eval_line(next_step, totals));
      metrics->write(spec_eval_record(next_step, totals));
      offer_best(next_step, totals.at("tau").get<double>());
    }
    const bool periodic = cfg.ckpt.every > 0 && (next_step % cfg.ckpt.every == 0 || last);
    if (periodic || (stop && !dumping)) save(next_step);
    if (r.stop_requested)
      log.warn("stopping after step {} on {} (checkpoint written); continue with ckpt.resume=auto", next_step,
               stop_signal() ? signal_name(stop_signal()) : "another drafter rank's signal");
    if (stop) break;
  }
  const int dropped = receiver.finish(next_step, sources[0]);
  const double run_seconds = run_timer.seconds();
  log.info("drafter: ran steps {}..{} in {:.1f} s{}", opt.start_step + 1, next_step, run_seconds,
           dropped ? fmt::format(" ({} prefetched packets dropped)", dropped) : std::string());
  if (heldout_seconds > 0 || spec_seconds > 0)
    log.info("drafter: held-out eval {:.2f} s ({:.1f}% of the run), speculative eval {:.2f} s ({:.1f}%)",
             heldout_seconds, 100 * heldout_seconds / run_seconds, spec_seconds, 100 * spec_seconds / run_seconds);
  if (reporter && next_step == plan.total_steps) {
    const std::string path = write_final_weights(cfg.run.out_dir, trainer.params());
    log.info("drafter: final fp32 weights in {}", path);
  }
}

}  // namespace dflash::train
