#include "lib/eval/heldout_eval.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lib/core/timer.h"
#include "lib/train/data_facts.h"
#include "lib/train/run_plan.h"

namespace dflash::eval {

bool heldout_due(const TrainConfig& cfg, int64_t next_step) {
  return cfg.eval.every > 0 && next_step > 0 && next_step % cfg.eval.every == 0;
}

int64_t heldout_count(const TrainConfig& cfg, const io::Dataset& eval) {
  return cfg.eval.max_sequences > 0 ? std::min<int64_t>(cfg.eval.max_sequences, eval.size()) : eval.size();
}

std::vector<int64_t> heldout_sequences(int64_t count, int drafter_dp, int d) {
  std::vector<int64_t> out;
  for (int64_t i = d; i < count; i += drafter_dp) out.push_back(i);
  return out;
}

train::PacketPlan heldout_plan(const TrainConfig& cfg, const io::Dataset& eval, int64_t step, int64_t i) {
  train::PacketPlan p;
  p.seq_index = i;
  p.step = step;
  p.micro = int32_t(i);  // the held-out slot
  p.seq_len = train::streamed_length(cfg, eval, i);
  p.kind = train::kEvalPacket;
  return p;
}

namespace {

struct Rates {
  double loss, ce, kl, cap, acc, topk, tau;
  std::vector<double> acc_by_pos;  // k = 1..B-1
};

Rates rates_of(const train::StepResult& s, int B) {
  const double w = s.sums.weight > 0 ? s.sums.weight : 1.0;
  Rates r{s.sums.loss / w, s.sums.ce / w, s.sums.kl / w, s.sums.cap / w, 0, 0, 0, {}};
  int64_t correct = 0, scored = 0;
  for (int k = 1; k < B; ++k) {
    correct += s.metrics.correct[k];
    scored += s.metrics.scored[k];
    r.acc_by_pos.push_back(s.metrics.scored[k] ? double(s.metrics.correct[k]) / double(s.metrics.scored[k]) : 0.0);
  }
  r.acc = scored ? double(correct) / double(scored) : 0.0;
  r.topk = scored ? double(s.metrics.topk_hits) / double(scored) : 0.0;
  r.tau = s.metrics.blocks ? double(s.metrics.accepted_sum) / double(s.metrics.blocks) : 0.0;
  return r;
}

}  // namespace

HeldoutResult run_heldout_eval(train::DrafterStep& drafter, comm::Transport& dp, const TrainConfig& cfg,
                               int64_t next_step, int64_t sequences, int B,
                               const std::function<const train::FeaturePacket&(double* wait_seconds)>& next_packet) {
  Timer timer;
  HeldoutResult out;
  out.step = next_step;
  train::StepResult& s = out.sums;
  s.metrics.correct.assign(B, 0);
  s.metrics.scored.assign(B, 0);
  for (int64_t j = 0; j < sequences; ++j) {
    const train::FeaturePacket& p = next_packet(&s.wait_seconds);
    const train::AnchorKey key{uint64_t(cfg.run.seed), next_step, p.header.seq_index};
    const train::StepResult r = drafter.evaluate(p, key);
    s.sums.add(r.sums);
    s.metrics.add(r.metrics);
    s.tokens += r.tokens;
    s.positions += r.positions;
    s.compute_seconds += r.compute_seconds;
  }
  // the training step's reduction (drafter_step.h), the sequence count alongside
  out.sequences = int64_t(train::allreduce_step_sums(dp, s, B, {double(sequences)})[0]);
  out.seconds = timer.seconds();
  return out;
}

double heldout_tau(const HeldoutResult& r) {
  return r.sums.metrics.blocks ? double(r.sums.metrics.accepted_sum) / double(r.sums.metrics.blocks) : 0.0;
}

nlohmann::ordered_json heldout_record(const HeldoutResult& r, int B) {
  const Rates x = rates_of(r.sums, B);
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["kind"] = "eval";
  j["eval_loss"] = x.loss;
  j["eval_ce"] = x.ce;
  j["eval_kl"] = x.kl;
  j["eval_cap"] = x.cap;
  j["eval_weight_sum"] = r.sums.sums.weight;
  j["eval_acc"] = x.acc;
  j["eval_acc_by_pos"] = x.acc_by_pos;
  j["eval_topk_acc"] = x.topk;
  j["eval_tau"] = x.tau;
  j["eval_sequences"] = r.sequences;
  j["eval_tokens"] = r.sums.tokens;
  j["eval_positions"] = r.sums.positions;
  j["eval_seconds"] = r.seconds;
  return j;
}

std::string heldout_line(const HeldoutResult& r, int B, int top_k) {
  const Rates x = rates_of(r.sums, B);
  return fmt::format("eval step {} | held-out loss {:.4f} (ce {:.4f} kl {:.4f} cap {:.4f}) | acc {:.3f} top{} {:.3f} | "
                     "tau {:.2f} | {} sequences in {:.2f} s",
                     r.step, x.loss, x.ce, x.kl, x.cap, x.acc, top_k, x.topk, x.tau, r.sequences, r.seconds);
}

std::vector<train::PacketPlan> HeldoutPackets::after_step(int64_t step, int d) const {
  std::vector<train::PacketPlan> out;
  if (!heldout_due(cfg_, step + 1)) return out;
  for (int64_t i : heldout_sequences(count_, cfg_.layout.drafter_dp, d))
    out.push_back(heldout_plan(cfg_, eval_, step, i));
  return out;
}

HeldoutEval::HeldoutEval(const TrainConfig& cfg, const io::Dataset& eval, int block_size, int dp_rank)
    : cfg_(cfg), block_size_(block_size),
      sequences_(int64_t(heldout_sequences(heldout_count(cfg, eval), cfg.layout.drafter_dp, dp_rank).size())) {}

EvalOutcome HeldoutEval::run(EvalContext& ctx) {
  const HeldoutResult e = run_heldout_eval(ctx.drafter, ctx.dp, cfg_, ctx.next_step, sequences_, block_size_,
                                           ctx.next_packet);
  seconds_ += e.seconds;
  EvalOutcome o;
  o.report.line = heldout_line(e, block_size_, cfg_.loss.top_k);
  o.report.metrics = heldout_record(e, block_size_);
  o.metric = state::TauMetric::eval_tau;
  o.tau = heldout_tau(e);
  return o;
}

HeldoutTrainingEval::HeldoutTrainingEval(const TrainConfig& cfg, const train::RunPlan& plan, bool scan_tokens)
    : cfg_(cfg), plan_(plan), data_([&] {
        require_eval_file("eval.data", cfg.eval.data, "eval.every");
        return io::Dataset(cfg.eval.data, plan.target.vocab, scan_tokens);
      }()) {}

void HeldoutTrainingEval::check_on_start() const {
  TrainConfig as_data = cfg_;
  as_data.data.path = cfg_.eval.data;
  train::check_data_facts(train::scan_data_facts(data_, plan_.drafter.mask_token_id, cfg_.data.max_seq_len), as_data);
}

report::CheckItem HeldoutTrainingEval::check_item() const {
  return {"eval data",
          {fmt::format("{}: {} of {} sequences every {} steps (held-out loss, acc, tau)", cfg_.eval.data,
                       heldout_count(cfg_, data_), data_.size(), cfg_.eval.every)}};
}

std::unique_ptr<train::ExtraPackets> HeldoutTrainingEval::packets() const {
  return std::make_unique<HeldoutPackets>(cfg_, data_);
}

std::unique_ptr<Evaluator> HeldoutTrainingEval::drafter_side(const comm::RankLayout& layout) const {
  return std::make_unique<HeldoutEval>(cfg_, data_, plan_.drafter.block_size, layout.dp_rank);
}

}  // namespace dflash::eval
