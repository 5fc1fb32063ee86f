#include <memory>

#include "lib/comm/mpi_transport.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/eval/heldout_eval.h"
#include "lib/eval/spec_eval.h"
#include "lib/job/workers.h"
#include "lib/model/target.h"
#include "lib/train/packet.h"

namespace dflash::train {

void run_target_worker(const TrainConfig& cfg, const RunPlan& plan, const comm::RankLayout& layout,
                       const comm::RoleComms& comms, const io::Dataset& data, int64_t start_step, Logger& log,
                       Watchdog& watchdog, const EvalInputs& eval) {
  comm::MpiTransport tp_mpi(comms.tp()), world_mpi(comms.world());
  WatchedTransport tp(tp_mpi, watchdog, fmt::format("target TP group {}", layout.group)),
      world(world_mpi, watchdog, "world");
  // the data plane (layout.transport): the TP all-reduces of the forward and the packets' tensors
  const char* plane = comm::data_plane_name(comms.plane());
  WatchedTransport tp_data(comms.tp_data(), watchdog, fmt::format("target TP group {} ({} data plane)", layout.group,
                                                                  plane)),
      world_data(comms.world_data(), watchdog, fmt::format("world ({} data plane)", plane));
  Timer load_timer;
  // run.device cuda: the forward on the GPU the trainer bound at start-up, in run.precision's compute type (bf16 by
  // default); the TP all-reduces take the device pointers on the NCCL data plane, else go through the host
  // (docs/backend.md). The CPU computes in fp32.
  model::TargetOptions target_options;
  target_options.cuda = cfg.run.device == "cuda";
  target_options.precision = target_options.cuda ? cfg.run.compute_precision() : "fp32";
  model::TargetModel target(cfg.target.path, tp_data, target_options);
  log.info("target: loaded {} ({} layers, H {}, {} Q / {} KV heads) shard {:.1f} MiB ({}, {} backend) in {:.2f} s; "
           "taps {}",
           cfg.target.path, plan.target.layers, plan.target.hidden, plan.target.heads, plan.target.kv_heads,
           target.weight_bytes() / 1048576.0, target.precision(), target.backend_name(), load_timer.seconds(),
           fmt::join(plan.tap_ids, ","));

  io::SequenceSchedule schedule(plan.num_sequences, cfg.layout.drafter_dp, cfg.optim.micro_batches,
                                uint64_t(cfg.run.seed), cfg.data.shuffle, cfg.data.path);
  // the packets' tensors on this rank's GPU when the data plane is NCCL (packet_memory), else on the host
  PacketSender sender(world, world_data, cfg.layout.packets_in_flight,
                      packet_memory(cfg.run.device == "cuda", comms.world_data()));
  const int H = plan.target.hidden, tap_width = int(plan.tap_ids.size()) * H;
  const std::vector<int> drafters = layout.drafters_of_group(layout.group);
  // one packet: the target forward of `seq` (every TP rank), its slice streamed to drafter rank d
  auto stream = [&](io::Sequence&& seq, PacketHeader h, int d) {
    h.seq_len = int32_t(seq.tokens.size());
    h.tap_width = tap_width;
    h.hidden = H;
    FeaturePacket p = sender.blank(h);
    p.tokens = std::move(seq.tokens);
    p.loss_mask = std::move(seq.loss_mask);
    // device packets (NCCL): the forward writes its features there, no pass through the host
    if (h.seq_len > 0)
      target.forward(p.tokens.data(), h.seq_len, plan.tap_ids, p.taps.data(), p.final_hidden.data(), p.taps.memory());
    return sender.send(std::move(p), layout.drafter_world_rank(d), layout.tp_rank, tp.size());
  };
  const int64_t heldout = eval.data ? heldout_count(cfg, *eval.data) : 0;
  std::unique_ptr<SpecEvalTarget> spec;  // the group that feeds drafter rank 0
  if (eval.prompts && layout.group == 0)
    spec = std::make_unique<SpecEvalTarget>(cfg, plan, target, tp, world, *eval.prompts, layout.drafter_world_rank(0),
                                            watchdog);
  Timer interval;
  int64_t interval_tokens = 0;
  double interval_blocked = 0;
  target.reset_stats();
  int64_t step = start_step;
  for (; step < plan.total_steps; ++step) {
    if (sender.stop_requested(tp)) break;  // the drafters stopped early (signal, --stop-after-steps, --dump-step)
    for (int micro = 0; micro < cfg.optim.micro_batches; ++micro) {
      for (int d : drafters) {
        const int64_t index = schedule.sequence(step, micro, d);
        io::Sequence seq = data.read(index, cfg.data.max_seq_len);
        PacketHeader h;
        h.seq_index = index;
        h.step = step;
        h.micro = micro;
        interval_tokens += int64_t(seq.tokens.size());
        interval_blocked += stream(std::move(seq), h, d);
      }
    }
    // the held-out packets count as packets of this step (the stop protocol drops them with it)
    if (heldout > 0 && heldout_due(cfg, step + 1)) {
      for (int d : drafters)
        for (int64_t i : heldout_sequences(heldout, cfg.layout.drafter_dp, d)) {
          const PacketPlan pp = heldout_plan(cfg, *eval.data, step, i);
          PacketHeader h;
          h.seq_index = pp.seq_index;
          h.step = pp.step;
          h.micro = pp.micro;
          h.kind = pp.kind;
          interval_blocked += stream(eval.data->read(i, cfg.data.max_seq_len), h, d);
        }
    }
    if (spec && spec_eval_due(cfg, step + 1)) {
      spec->run(step + 1, log);
    }
    if ((step + 1) % cfg.log.every == 0 || step + 1 == plan.total_steps) {
      const double secs = interval.seconds();
      const auto& st = target.stats();
      log.info("target: step {} | {:.0f} tok/s | forward {:.2f} s, all-reduce {:.0f}% of it | blocked by drafters "
               "{:.0f}%",
               step + 1, interval_tokens / secs, st.forward_seconds,
               st.forward_seconds > 0 ? 100.0 * st.allreduce_seconds / st.forward_seconds : 0.0,
               100.0 * interval_blocked / secs);
      interval.reset();
      interval_tokens = 0;
      interval_blocked = 0;
      target.reset_stats();
    }
  }
  std::vector<int> drafter_ranks;
  for (int d : drafters) drafter_ranks.push_back(layout.drafter_world_rank(d));
  sender.finish(tp, step - 1, drafter_ranks);
  log.info("target: sent the packets of steps {}..{}", start_step + 1, step);
}

}  // namespace dflash::train
