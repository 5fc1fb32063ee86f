#include "lib/report/progress.h"

#include <cmath>

#include <fmt/format.h>

namespace dflash::report {

namespace {

std::string format_duration(double seconds) {
  const long s = long(std::lround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace

void ProgressInterval::reset() {
  sum_ = train::StepResult{};
  sum_.metrics.correct.assign(block_size_, 0);
  sum_.metrics.scored.assign(block_size_, 0);
  steps_ = tokens_ = 0;
  wait_ = compute_ = 0;
}

void ProgressInterval::add(const train::StepResult& r) {
  sum_.sums.add(r.sums);
  sum_.metrics.add(r.metrics);
  sum_.positions += r.positions;
  tokens_ += r.tokens;  // global: every drafter rank's sequences
  wait_ += r.wait_seconds;
  compute_ += r.compute_seconds;
  last_lr_ = r.lr;
  last_grad_norm_ = r.grad_norm;
  ++steps_;
}

ProgressInterval::Rates ProgressInterval::rates() const {
  const double w = sum_.sums.weight > 0 ? sum_.sums.weight : 1.0;
  const model::VocabLossMetrics& m = sum_.metrics;
  Rates out{sum_.sums.loss / w, sum_.sums.ce / w, sum_.sums.kl / w, sum_.sums.cap / w, 0, 0, 0, {}};
  int64_t correct = 0, scored = 0;
  for (int k = 1; k < block_size_; ++k) {
    correct += m.correct[k];
    scored += m.scored[k];
    out.acc_by_pos.push_back(m.scored[k] ? double(m.correct[k]) / m.scored[k] : 0.0);
  }
  out.acc = scored ? double(correct) / scored : 0.0;
  out.topk = scored ? double(m.topk_hits) / scored : 0.0;
  out.tau = m.blocks ? double(m.accepted_sum) / m.blocks : 0.0;
  return out;
}

std::string ProgressInterval::line(int64_t next_step, int64_t total_steps, int top_k, double seconds,
                                   double eta_seconds) const {
  const Rates r = rates();
  return fmt::format(
      "step {}/{} | loss {:.4f} (ce {:.4f} kl {:.4f} cap {:.4f}) | acc {:.3f} top{} {:.3f} | tau {:.2f} | lr {:.2e} | "
      "gnorm {:.3f} | {:.0f} tok/s | wait {:.0f}% | eta {}",
      next_step, total_steps, r.loss, r.ce, r.kl, r.cap, r.acc, top_k, r.topk, r.tau, last_lr_, last_grad_norm_,
      tokens_ / seconds, 100 * wait_ / seconds, format_duration(eta_seconds));
}

nlohmann::ordered_json ProgressInterval::record(int64_t next_step, double seconds, double elapsed_seconds) const {
  const Rates r = rates();
  nlohmann::ordered_json j;
  j["step"] = next_step;
  j["steps_averaged"] = steps_;  // loss and metrics below are over these steps (weighted by Σw)
  j["loss"] = r.loss;
  j["ce"] = r.ce;
  j["kl"] = r.kl;
  j["cap"] = r.cap;
  j["weight_sum"] = sum_.sums.weight;
  j["acc"] = r.acc;
  j["acc_by_pos"] = r.acc_by_pos;
  j["topk_acc"] = r.topk;
  j["tau"] = r.tau;
  j["lr"] = last_lr_;
  j["grad_norm"] = last_grad_norm_;
  j["tokens_per_s"] = tokens_ / seconds;
  j["wait_share"] = wait_ / seconds;
  j["compute_share"] = compute_ / seconds;
  j["positions"] = sum_.positions;
  j["elapsed_s"] = elapsed_seconds;
  return j;
}

}  // namespace dflash::report
