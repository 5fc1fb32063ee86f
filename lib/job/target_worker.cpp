#include <memory>

#include "lib/comm/mpi_transport.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/eval/evals.h"
#include "lib/job/workers.h"
#include "lib/model/target.h"
#include "lib/state/checkpointer.h"
#include "lib/train/packet.h"
#include "lib/train/stream_plan.h"

namespace dflash::job {

namespace {

// The target's progress line after every log.every steps and the last: tokens/s, the all-reduce share of the
// forward, the share of time blocked by the drafters (the send window full).
class TargetProgress {
 public:
  TargetProgress(const TrainConfig& cfg, const train::RunPlan& plan, model::TargetModel& target, report::Logger& log)
      : log_every_(cfg.log.every), total_steps_(plan.total_steps), target_(target), log_(log) {
    target_.reset_stats();
  }
  int64_t* tokens() { return &tokens_; }
  void blocked(double seconds) { blocked_ += seconds; }
  void after_step(int64_t next_step) {
    if (!((log_every_ > 0 && next_step % log_every_ == 0) || next_step == total_steps_)) return;
    const double secs = interval_.seconds();
    const auto& st = target_.stats();
    log_.info("target: step {} | {:.0f} tok/s | forward {:.2f} s, all-reduce {:.0f}% of it | blocked by drafters "
              "{:.0f}%",
              next_step, tokens_ / secs, st.forward_seconds,
              st.forward_seconds > 0 ? 100.0 * st.allreduce_seconds / st.forward_seconds : 0.0,
              100.0 * blocked_ / secs);
    interval_.reset();
    tokens_ = 0;
    blocked_ = 0;
    target_.reset_stats();
  }

 private:
  int log_every_;
  int64_t total_steps_;
  model::TargetModel& target_;
  report::Logger& log_;
  Timer interval_;
  int64_t tokens_ = 0;
  double blocked_ = 0;
};

}  // namespace

RunStatus run_target_worker(Job& job) {
  const TrainConfig& cfg = job.cfg;
  const train::RunPlan& plan = job.plan;
  const comm::RankLayout& layout = job.layout;
  const comm::RoleComms& comms = *job.comms;
  const int64_t start_step = job.resume.start_step;
  report::Logger& log = *job.log;
  train::Watchdog& watchdog = *job.watchdog;
  comm::MpiTransport tp_mpi(comms.tp()), world_mpi(comms.world());
  train::WatchedTransport tp(tp_mpi, watchdog, fmt::format("target TP group {}", layout.group)),
      world(world_mpi, watchdog, "world");
  // the data plane (layout.transport): the TP all-reduces of the forward and the packets' tensors
  const char* plane = comm::data_plane_name(comms.plane());
  train::WatchedTransport tp_data(comms.tp_data(), watchdog,
                                  fmt::format("target TP group {} ({} data plane)", layout.group, plane)),
      world_data(comms.world_data(), watchdog, fmt::format("world ({} data plane)", plane));
  Timer load_timer;
  // run.device cuda: the forward on the GPU the trainer bound at start-up, in run.precision's compute type (bf16 by
  // default); the TP all-reduces take the device pointers on the NCCL data plane, else go through the host
  // (docs/backend.md). The CPU computes in fp32.
  model::TargetOptions target_options;
  target_options.device = cfg.run.device;
  target_options.precision = cfg.run.compute_precision();
  target_options.tp_allreduce = cfg.layout.tp_allreduce;  // bf16 targets on the NCCL plane
  model::TargetModel target(cfg.target.path, tp_data, target_options);
  log.info("target: loaded {} ({} layers, H {}, {} Q / {} KV heads) shard {:.1f} MiB ({}, {} backend) in {:.2f} s; "
           "taps {}",
           cfg.target.path, plan.target.layers, plan.target.hidden, plan.target.heads, plan.target.kv_heads,
           target.weight_bytes() / 1048576.0, target.precision(), target.backend_name(), load_timer.seconds(),
           fmt::join(plan.tap_ids, ","));

  // every packet of the stream, in the order the drafters expect them (lib/train/stream_plan.h)
  const train::StreamPlan stream = eval::make_stream_plan(cfg, plan, job.dataset(), job.evals);
  // the packets' tensors on this rank's GPU when the data plane is NCCL (packet_memory), else on the host
  train::PacketSender sender(world, world_data, cfg.layout.packets_in_flight,
                             train::packet_memory(cfg.run.device == kernels::Device::cuda, comms.world_data()));
  const int H = plan.target.hidden, tap_width = int(plan.tap_ids.size()) * H;
  const std::vector<int> drafters = layout.drafters_of_group(layout.group);
  // one packet: the target forward of its sequence (every TP rank), its slice streamed to drafter rank d
  auto stream_packet = [&](const train::PacketPlan& pp, int d, int64_t* tokens) {
    io::Sequence seq = stream.read(pp);
    train::PacketHeader h;
    h.seq_index = pp.seq_index;
    h.step = pp.step;
    h.micro = pp.micro;
    h.kind = pp.kind;
    h.seq_len = int32_t(seq.tokens.size());
    h.tap_width = tap_width;
    h.hidden = H;
    if (tokens) *tokens += h.seq_len;
    train::FeaturePacket p = sender.blank(h);
    p.tokens = std::move(seq.tokens);
    p.loss_mask = std::move(seq.loss_mask);
    // device packets (NCCL): the forward writes its features there, no pass through the host
    if (h.seq_len > 0)
      target.forward(p.tokens.data(), h.seq_len, plan.tap_ids, p.taps.data(), p.final_hidden.data(), p.taps.memory());
    return sender.send(std::move(p), layout.drafter_world_rank(d), layout.tp_rank, tp.size());
  };
  // the target side of the evals (the speculative decode on the group that feeds drafter rank 0)
  const std::vector<std::unique_ptr<eval::TargetEvaluator>> evals =
      eval::make_target_evals(job.evals, {layout, target, tp, world, watchdog});
  TargetProgress progress(cfg, plan, target, log);
  int64_t step = start_step;
  for (; step < plan.total_steps; ++step) {
    if (sender.stop_requested(tp)) break;  // the drafters stopped early (signal, --stop-after-steps, --dump-step)
    for (int micro = 0; micro < stream.micro_batches(); ++micro)
      for (int d : drafters) progress.blocked(stream_packet(stream.train_packet(step, micro, d), d, progress.tokens()));
    // the evals' packets count as packets of this step (the stop protocol drops them with it)
    for (int d : drafters)
      for (const train::PacketPlan& pp : stream.extras(step, d)) progress.blocked(stream_packet(pp, d, nullptr));
    // around an eval or a checkpoint save the drafters are slow to take packets: those steps (up to the packets in
    // flight ahead of them) are held to run.watchdog_seconds, not to a multiple of the steps
    bool long_step = state::Checkpointer::due(cfg.ckpt.every, step + 1, step + 1 == plan.total_steps, false, true);
    for (const auto& e : evals) long_step = long_step || e->due(step + 1);
    if (long_step) watchdog.relax(cfg.layout.packets_in_flight + 2);
    for (const auto& e : evals)
      if (e->due(step + 1)) e->run(step + 1, log);
    progress.after_step(step + 1);
    watchdog.step_done();
  }
  std::vector<int> drafter_ranks;
  for (int d : drafters) drafter_ranks.push_back(layout.drafter_world_rank(d));
  sender.finish(tp, step - 1, drafter_ranks);
  log.info("target: sent the packets of steps {}..{}", start_step + 1, step);
  return {};  // RunOutcome::running: drafter rank 0 knows how the run ended
}

}  // namespace dflash::job
