#include <cmath>
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "lib/comm/mpi_transport.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/io/safetensors.h"
#include "lib/model/target.h"
#include "lib/train/drafter_step.h"
#include "lib/train/metrics.h"
#include "lib/train/packet.h"
#include "lib/train/workers.h"

namespace dflash::train {

namespace {

std::string format_duration(double seconds) {
  const long s = long(std::lround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

// Every drafter rank must hold the same weights after each step; a divergence (non-deterministic reduction, a
// bad node) is an error rather than a silently forked run.
void check_identical_weights(comm::Transport& dp, const DrafterStep& trainer, int64_t step) {
  uint64_t mine = trainer.weights_hash(), root = mine;
  dp.broadcast(&root, 1, 0);
  double differs = root != mine ? 1.0 : 0.0;
  dp.allreduce_sum(&differs, 1);
  DFLASH_CHECK(differs == 0, "after step {}: {} drafter rank(s) hold weights that differ from drafter rank 0",
               step, differs);
}

}  // namespace

std::string write_final_weights(const std::string& out_dir, const DrafterParams<float>& params) {
  const std::string path = out_dir + "/drafter_final.safetensors", tmp = path + ".partial";
  std::vector<io::TensorToWrite> tensors;
  for (const ParamInfo& p : params.layout)
    tensors.push_back(io::tensor_from(p.name, io::DType::F32, p.shape, params.data(p)));
  io::write_safetensors(tmp, tensors, {{"format", "pt"}});
  DFLASH_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename {} to {}", tmp, path);
  return path;
}

void run_drafter_worker(const TrainConfig& cfg, const RunPlan& plan, const comm::RankLayout& layout,
                        const comm::RoleComms& comms, const io::Dataset& data, int64_t start_step, Logger& log) {
  comm::MpiTransport dp(comms.dp()), world(comms.world());
  Timer load_timer;
  const model::TargetVocab vocab = model::load_target_vocab(cfg.target.path);
  DFLASH_CHECK(vocab.vocab == plan.target.vocab && vocab.hidden == plan.target.hidden,
               "{}: embedding is [{}, {}] but config.json says [{}, {}]", cfg.target.path, vocab.vocab, vocab.hidden,
               plan.target.vocab, plan.target.hidden);
  DrafterStep trainer(cfg, plan, vocab.embedding.data(), vocab.lm_head(), layout.dp_rank, dp);
  log.info("drafter: {} layers, H {}, {} Q / {} KV heads, block {}, {} parameters; embedding + lm_head loaded in "
           "{:.2f} s",
           plan.drafter.layers, plan.drafter.hidden, plan.drafter.heads, plan.drafter.kv_heads,
           plan.drafter.block_size, trainer.params().flat.size(), load_timer.seconds());

  // the packets this rank will receive, in order: known from the schedule, so receives are posted early
  io::SequenceSchedule schedule(plan.num_sequences, cfg.layout.drafter_dp, cfg.optim.micro_batches,
                                uint64_t(cfg.run.seed), cfg.data.shuffle, cfg.data.path);
  int64_t plan_step = start_step;
  int plan_micro = 0;
  auto next_plan = [&]() -> std::optional<PacketPlan> {
    if (plan_step >= plan.total_steps) return std::nullopt;
    PacketPlan p;
    p.step = plan_step;
    p.micro = plan_micro;
    p.seq_index = schedule.sequence(plan_step, plan_micro, layout.dp_rank);
    p.seq_len = streamed_length(cfg, data, p.seq_index);
    if (++plan_micro == cfg.optim.micro_batches) plan_micro = 0, ++plan_step;
    return p;
  };
  std::vector<int> sources;
  for (int t = 0; t < cfg.layout.target_tp; ++t) sources.push_back(layout.target_world_rank(layout.group, t));
  PacketReceiver receiver(world, sources, int(plan.tap_ids.size()) * plan.target.hidden, plan.target.hidden,
                          cfg.layout.packets_in_flight, next_plan);

  const bool reporter = layout.dp_rank == 0;
  std::optional<MetricsWriter> metrics;
  if (reporter) metrics.emplace(cfg.run.out_dir, start_step > 0);
  const int B = plan.drafter.block_size;
  Timer run_timer, interval;
  double interval_wait = 0, interval_compute = 0;
  int64_t interval_tokens = 0, interval_steps = 0;
  StepResult acc;  // sums and counts over the log interval: what the progress line and metrics.jsonl report
  auto reset_interval = [&] {
    acc = StepResult{};
    acc.metrics.correct.assign(B, 0);
    acc.metrics.scored.assign(B, 0);
  };
  reset_interval();
  for (int64_t step = start_step; step < plan.total_steps; ++step) {
    const StepResult r = trainer.run(step, [&](int, double* wait) { return receiver.next(wait); });
    interval_wait += r.wait_seconds;
    interval_compute += r.compute_seconds;
    interval_tokens += r.tokens;
    ++interval_steps;
    acc.sums.add(r.sums);
    acc.metrics.add(r.metrics);
    acc.positions += r.positions;
    if (r.skipped)
      log.warn("step {}: no scored positions in the global batch (sum of weights 0): weights unchanged", step + 1);
    const bool last = step + 1 == plan.total_steps;
    if ((step + 1) % cfg.log.every != 0 && !last) continue;

    check_identical_weights(dp, trainer, step + 1);
    const double secs = interval.seconds();
    const double w = acc.sums.weight > 0 ? acc.sums.weight : 1.0;
    int64_t correct = 0, scored = 0;
    std::vector<double> acc_by_pos;
    for (int k = 1; k < B; ++k) {
      correct += acc.metrics.correct[k];
      scored += acc.metrics.scored[k];
      acc_by_pos.push_back(acc.metrics.scored[k] ? double(acc.metrics.correct[k]) / acc.metrics.scored[k] : 0.0);
    }
    const double accuracy = scored ? double(correct) / scored : 0.0;
    const double tau = acc.metrics.blocks ? double(acc.metrics.accepted_sum) / acc.metrics.blocks : 0.0;
    const double topk = scored ? double(acc.metrics.topk_hits) / scored : 0.0;
    const double tok_per_s = interval_tokens / secs;  // global: r.tokens sums every drafter rank
    const double wait_share = interval_wait / secs;
    const double eta = secs / interval_steps * double(plan.total_steps - step - 1);
    const std::string line = fmt::format(
        "step {}/{} | loss {:.4f} (ce {:.4f} kl {:.4f} cap {:.4f}) | acc {:.3f} top{} {:.3f} | tau {:.2f} | lr {:.2e} "
        "| gnorm {:.3f} | {:.0f} tok/s | wait {:.0f}% | eta {}",
        step + 1, plan.total_steps, acc.sums.loss / w, acc.sums.ce / w, acc.sums.kl / w, acc.sums.cap / w, accuracy,
        cfg.loss.top_k, topk, tau, r.lr, r.grad_norm, tok_per_s, 100 * wait_share, format_duration(eta));
    log.info("{}", line);
    if (metrics) {
      nlohmann::ordered_json j;
      j["step"] = step + 1;
      j["steps_averaged"] = interval_steps;  // loss and metrics below are over these steps (weighted by Σw)
      j["loss"] = acc.sums.loss / w;
      j["ce"] = acc.sums.ce / w;
      j["kl"] = acc.sums.kl / w;
      j["cap"] = acc.sums.cap / w;
      j["weight_sum"] = acc.sums.weight;
      j["acc"] = accuracy;
      j["acc_by_pos"] = acc_by_pos;
      j["topk_acc"] = topk;
      j["tau"] = tau;
      j["lr"] = r.lr;
      j["grad_norm"] = r.grad_norm;
      j["tokens_per_s"] = tok_per_s;
      j["wait_share"] = wait_share;
      j["compute_share"] = interval_compute / secs;
      j["positions"] = acc.positions;
      j["elapsed_s"] = run_timer.seconds();
      metrics->write(j);
    }
    interval.reset();
    interval_wait = interval_compute = 0;
    interval_tokens = interval_steps = 0;
    reset_interval();
  }
  log.info("drafter: finished {} steps in {}", plan.total_steps - start_step, format_duration(run_timer.seconds()));
  if (reporter) {
    const std::string path = write_final_weights(cfg.run.out_dir, trainer.params());
    log.info("drafter: final fp32 weights in {}", path);
  }
}

}  // namespace dflash::train
