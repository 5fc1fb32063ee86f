#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/comm/mpi_transport.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/eval/evals.h"      // defines: make_stream_plan, make_drafter_evals, best_checkpoint_metric
#include "lib/job/signals.h"
#include "lib/job/workers.h"
#include "lib/model/target.h"    // defines: load_target_vocab
#include "lib/report/reporter.h" // defines: Reporter, JsonlSink
#include "lib/state/checkpointer.h"  // defines: Checkpointer, restore_drafter, write_final_weights
#include "lib/state/step_dump.h"     // defines: StepDumper
#include "lib/train/drafter_step.h"
#include "lib/train/packet.h"
#include "lib/train/stream_plan.h"

namespace dflash::job {

namespace {

// A drafter rank's transports, every wait watched (run.watchdog_seconds): the control plane (MPI) and the data
// plane (layout.transport: the gradient all-reduce and the packets' tensors).
struct DrafterTransports {
  comm::MpiTransport dp_mpi, world_mpi;
  train::WatchedTransport dp, world, dp_data, world_data;
  DrafterTransports(const comm::RoleComms& comms, train::Watchdog& watchdog)
      : dp_mpi(comms.dp()),
        world_mpi(comms.world()),
        dp(dp_mpi, watchdog, "drafter DP group"),
        world(world_mpi, watchdog, "world"),
        dp_data(comms.dp_data(), watchdog,
                fmt::format("drafter DP group ({} data plane)", comm::data_plane_name(comms.plane()))),
        world_data(comms.world_data(), watchdog,
                   fmt::format("world ({} data plane)", comm::data_plane_name(comms.plane()))) {}
};

// The frozen target's embedding and lm_head, which the drafter shares.
model::TargetVocab load_vocab(const TrainConfig& cfg, const train::RunPlan& plan) {
  model::TargetVocab vocab = model::load_target_vocab(cfg.target.path);
  DFLASH_CHECK(vocab.vocab == plan.target.vocab && vocab.hidden == plan.target.hidden,
               "{}: embedding is [{}, {}] but config.json says [{}, {}]", cfg.target.path, vocab.vocab, vocab.hidden,
               plan.target.vocab, plan.target.hidden);
  return vocab;
}

// The packet stream of this rank's target group: receives posted early from the stream plan; a GPU drafter gets
// its packets in device memory (received in place over NCCL, uploaded from page-locked staging over MPI).
std::unique_ptr<train::PacketReceiver> make_receiver(const TrainConfig& cfg, const train::RunPlan& plan,
                                                     const comm::RankLayout& layout, DrafterTransports& t,
                                                     train::StreamCursor& cursor) {
  std::vector<int> sources;
  for (int tp = 0; tp < cfg.layout.target_tp; ++tp) sources.push_back(layout.target_world_rank(layout.group, tp));
  return std::make_unique<train::PacketReceiver>(
      t.world, t.world_data, sources, int(plan.tap_ids.size()) * plan.target.hidden, plan.target.hidden,
      cfg.layout.packets_in_flight, [&cursor] { return cursor.next(); },
      cfg.run.device == kernels::Device::cuda ? MemoryKind::device : MemoryKind::host, cfg.data.max_seq_len);
}

// Progress every log.every steps and the metrics sinks (drafter rank 0 writes: metrics.jsonl).
std::unique_ptr<report::Reporter> make_reporter(const TrainConfig& cfg, const train::RunPlan& plan, bool writer,
                                                int64_t start_step, report::Logger& log, DrafterTransports& t,
                                                train::DrafterStep& drafter) {
  auto r = std::make_unique<report::Reporter>(
      report::ReporterSettings{cfg.log.every, plan.total_steps, cfg.loss.top_k, plan.drafter.block_size, writer}, log,
      t.dp, [&drafter] { return drafter.weights_hash(); });
  if (writer) r->add_sink(std::make_unique<report::JsonlSink>(cfg.run.out_dir, start_step, log));
  return r;
}

std::string describe(const train::RunPlan& plan, const train::DrafterStep& trainer, int64_t start_step,
                     double seconds) {
  return fmt::format("drafter: {} layers, H {}, {} Q / {} KV heads, block {}, {} parameters on the {} backend; {} in "
                     "{:.2f} s", plan.drafter.layers, plan.drafter.hidden, plan.drafter.heads, plan.drafter.kv_heads,
                     plan.drafter.block_size, model::drafter_param_count(plan.drafter), trainer.backend_name(),
                     start_step > 0 ? fmt::format("resumed at step {}", start_step) : std::string("initialised"),
                     seconds);
}

void log_if(report::Logger& log, const std::string& line) {
  if (!line.empty()) log.info("{}", line);
}

// The end-of-run summary of this rank's time in the evals ("" when none took any).
std::string eval_summary(const std::vector<std::unique_ptr<eval::Evaluator>>& evals, double run_seconds) {
  std::string out;
  bool any = false;
  for (const auto& e : evals) {
    any = any || e->seconds() > 0;
    out += fmt::format("{}{} {:.2f} s ({:.1f}%{})", out.empty() ? "drafter: " : ", ", e->name(), e->seconds(),
                       100 * e->seconds() / run_seconds, out.empty() ? " of the run" : "");
  }
  return any ? out : "";
}

// The weights the run starts from: a resume takes its checkpoint, whatever drafter.init says; else the warm start.
// The first drafter rank holds them (resume.checkpoint, resume.warm) and sends them over the DP group.
void load_start_weights(const TrainConfig& cfg, const Resume& resume, DrafterTransports& t,
                        train::DrafterStep& trainer) {
  if (resume.start_step > 0)
    state::restore_drafter(t.dp, trainer, resume.checkpoint ? &*resume.checkpoint : nullptr);
  else if (!cfg.drafter.init.empty())
    state::init_drafter(t.dp, trainer, resume.warm ? &resume.warm->params : nullptr);
}

// An eval or a save (on drafter rank 0, which the others then wait for) is long by nature: the watchdog holds this
// step and the next to run.watchdog_seconds instead of a multiple of the steps (every rank knows the cadence).
bool long_step_due(const Job& job, const std::vector<std::unique_ptr<eval::Evaluator>>& evals, int64_t next_step,
                   bool last, bool stop) {
  bool due = state::Checkpointer::due(job.cfg.ckpt.every, next_step, last, stop, job.options.dump_dir.empty());
  for (const auto& e : evals) due = due || e->due(next_step, stop);
  return due;
}

// Every eval due after this step: its record to the reporter, its τ to the best checkpoint.
void run_due_evals(const std::vector<std::unique_ptr<eval::Evaluator>>& evals, eval::EvalContext ctx, bool stop,
                   report::Reporter& reporter, state::Checkpointer& ckpt, report::Logger& log) {
  for (const auto& e : evals) {
    if (!e->due(ctx.next_step, stop)) continue;
    const eval::EvalOutcome o = e->run(ctx);
    reporter.report(o.report);
    log_if(log, ckpt.offer_best(ctx.next_step, o.metric, o.tau, ctx.drafter));  // the best checkpoint keeps one τ
  }
}

// How the loop ended, for status.json and the exit code.
RunStatus run_status(const train::RunPlan& plan, int64_t next_step, bool signalled) {
  RunStatus end;
  end.outcome = next_step == plan.total_steps ? RunOutcome::finished
                : signalled                  ? RunOutcome::stopped
                                             : RunOutcome::partial;
  end.step = next_step;
  end.total_steps = plan.total_steps;
  end.signal = signalled ? stop_signal() : 0;
  return end;
}

}  // namespace

RunStatus run_drafter_worker(Job& job) {
  const TrainConfig& cfg = job.cfg;
  const train::RunPlan& plan = job.plan;
  const comm::RankLayout& layout = job.layout;
  const int64_t start_step = job.resume.start_step;
  report::Logger& log = *job.log;
  train::Watchdog& watchdog = *job.watchdog;
  DrafterTransports t(*job.comms, watchdog);
  Timer load_timer;
  const model::TargetVocab vocab = load_vocab(cfg, plan);
  train::DrafterStep trainer(cfg, plan, vocab.embedding.data(), vocab.lm_head(), layout.dp_rank, t.dp_data);
  load_start_weights(cfg, job.resume, t, trainer);
  log.info("{}", describe(plan, trainer, start_step, load_timer.seconds()));
  const train::StreamPlan stream = eval::make_stream_plan(cfg, plan, job.dataset(), job.evals);
  train::StreamCursor cursor(stream, layout.dp_rank, start_step);
  const std::unique_ptr<train::PacketReceiver> receiver = make_receiver(cfg, plan, layout, t, cursor);
  trainer.set_progress([&] { receiver->poll(); });  // the next packets move while this one is computed on
  const std::function<const train::FeaturePacket&(double*)> next_packet =
      [&](double* w) -> const train::FeaturePacket& { return receiver->next(w); };

  // the components, each deciding its own cadence; drafter rank 0 writes (metrics, checkpoints, the best)
  const bool writer = layout.dp_rank == 0;
  const std::unique_ptr<report::Reporter> reporter = make_reporter(cfg, plan, writer, start_step, log, t, trainer);
  const std::string& dump_dir = job.options.dump_dir;
  state::Checkpointer ckpt(
      cfg, plan, {writer, dump_dir.empty(), start_step, eval::best_checkpoint_metric(job.evals), job.resume.identity});
  log_if(log, ckpt.best_notice());
  const std::vector<std::unique_ptr<eval::Evaluator>> evals = eval::make_drafter_evals(job.evals, layout);
  state::StepDumper dumper(dump_dir, t.dp, plan, cfg, trainer);

  Timer run_timer;
  int64_t next_step = start_step;
  bool signalled = false;  // the stop came from a signal (a step's stop_requested), not --stop-after-steps
  while (next_step < plan.total_steps) {
    const int64_t step = next_step++;
    dumper.before(step);
    const train::StepResult r = trainer.run(
        step, [&](int, double* w) -> const train::FeaturePacket& { return next_packet(w); }, stop_signal() != 0,
        dumper.capture());
    if (const std::string path = dumper.after(r); !path.empty()) log.info("step dump: {}", path);
    const int64_t stop_after_steps = job.options.stop_after;
    const bool stop_after = stop_after_steps > 0 && next_step - start_step >= stop_after_steps;
    const bool stop = r.stop_requested || stop_after || dumper.active(), last = next_step == plan.total_steps;
    reporter->after_step(r, next_step, last, stop);
    if (long_step_due(job, evals, next_step, last, stop)) watchdog.relax(2);
    run_due_evals(evals, {next_step, trainer, t.dp, t.world, next_packet}, stop, *reporter, ckpt, log);
    if (ckpt.due(next_step, last, stop)) log.info("{}", ckpt.save(next_step, trainer));
    signalled = r.stop_requested;
    if (r.stop_requested)
      log.warn("stopping after step {} on {} (checkpoint written); continue with ckpt.resume=auto", next_step,
               stop_signal() ? signal_name(stop_signal()) : "another drafter rank's signal");
    if (stop) break;
    watchdog.step_done();
  }
  const int dropped = receiver->finish(next_step, layout.target_world_rank(layout.group, 0));
  const double run_seconds = run_timer.seconds();
  log.info("drafter: ran steps {}..{} in {:.1f} s{}", start_step + 1, next_step, run_seconds,
           dropped ? fmt::format(" ({} prefetched packets dropped)", dropped) : std::string());
  log_if(log, eval_summary(evals, run_seconds));
  if (writer && next_step == plan.total_steps)
    log.info("drafter: final fp32 weights in {}", state::write_final_weights(cfg.run.out_dir, trainer.params()));
  return run_status(plan, next_step, signalled);
}

}  // namespace dflash::job
