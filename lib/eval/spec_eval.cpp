#include "lib/eval/spec_eval.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lib/comm/tags.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/eval/spec_decode.h"
#include "lib/model/generate.h"
#include "lib/train/packet.h"

namespace dflash::eval {

bool spec_eval_due(const TrainConfig& cfg, int64_t next_step) {
  return cfg.eval.spec_every > 0 && next_step > 0 && next_step % cfg.eval.spec_every == 0;
}

int64_t spec_eval_prompt_count(const TrainConfig& cfg, const io::Dataset& prompts) {
  const int64_t n = model::check_prompts(prompts, cfg.eval.spec_prompts);
  DFLASH_USER_CHECK(n > 0, "eval.prompts {}: no prompts; give a prompts HDF5 (dflash_data make-prompts)",
                    prompts.path());
  return n;
}

struct SpecEvalTarget::Impl {
  const TrainConfig& cfg;
  const train::RunPlan& plan;
  model::TargetModel& target;
  comm::Transport& tp;
  comm::Transport& world;
  const io::Dataset& prompts;
  int drafter0;
  train::Watchdog& watchdog;
  model::GreedyHead head;
  model::TargetVocab vocab;       // TP rank 0: embedding, lm_head [V, H]
  model::DrafterParams<float> weights;   // TP rank 0: the drafter's, as received
  eval::SpecOptions options;
  int64_t count = 0;

  Impl(const TrainConfig& c, const train::RunPlan& p, model::TargetModel& t, comm::Transport& tp_, comm::Transport& w,
       const io::Dataset& pr, int d0, train::Watchdog& wd)
      : cfg(c),
        plan(p),
        target(t),
        tp(tp_),
        world(w),
        prompts(pr),
        drafter0(d0),
        watchdog(wd),
        head(c.target.path, tp_),
        weights(p.drafter) {
    if (tp.rank() == 0) vocab = model::load_target_vocab(cfg.target.path);
    options.block_size = plan.drafter.block_size;
    options.tap_layer_ids = plan.tap_ids;
    options.max_new_tokens = cfg.eval.max_new_tokens;
    options.eos_id = -1;
    // dflash_eval's default --vocab-limit: the mask token, when it is the last id, is never generated
    const int V = plan.target.vocab;
    options.vocab_limit = plan.drafter.mask_token_id == V - 1 ? V - 1 : 0;
    count = spec_eval_prompt_count(cfg, prompts);
  }

  // TP rank 0: true once the weights are in, false when drafter rank 0 stopped first.
  bool receive_weights() {
    comm::Request req = world.irecv(weights.flat.data(), weights.flat.size(), drafter0, comm::kTagSpecWeights);
    auto guard = watchdog.arm([&] { return fmt::format("drafter rank 0's weights (world rank {}) for the "
                                                       "speculative eval", drafter0); });
    while (true) {
      if (req.test()) return true;
      // drafter rank 0 sends comm::kTagStop only after its last exchange's answer: a stop now means no weights come
      if (world.probe(drafter0, comm::kTagStop)) {
        req.cancel();
        return false;
      }
      usleep(200);  // the cores are shared with the ranks that are training
    }
  }
};

SpecEvalTarget::SpecEvalTarget(const TrainConfig& cfg, const train::RunPlan& plan, model::TargetModel& target,
                               comm::Transport& tp, comm::Transport& world, const io::Dataset& prompts,
                               int drafter0_world_rank, train::Watchdog& watchdog)
    : cfg_(cfg), impl_(std::make_unique<Impl>(cfg, plan, target, tp, world, prompts, drafter0_world_rank, watchdog)) {}
SpecEvalTarget::~SpecEvalTarget() = default;

bool SpecEvalTarget::decode(int64_t next_step, report::Logger& log) {
  Impl& m = *impl_;
  uint8_t go = m.tp.rank() == 0 ? uint8_t(m.receive_weights()) : 0;
  m.tp.broadcast(&go, 1, 0);
  if (!go) return false;
  std::unique_ptr<eval::DrafterProposer> drafter;
  if (m.tp.rank() == 0)
    drafter = std::make_unique<eval::DrafterProposer>(m.plan.drafter, m.weights, m.vocab.embedding.data(),
                                                      m.vocab.lm_head(), m.options.vocab_limit);
  eval::SpecSummary sum(m.plan.drafter.block_size);
  for (int64_t i = 0; i < m.count; ++i) {
    const std::vector<int32_t> prompt = model::prompt_of(m.prompts.read(i), m.prompts.path());
    sum.add(eval::speculative_generate(m.target, m.head, m.tp, drafter.get(), prompt, m.options));
  }
  if (m.tp.rank() == 0) {
    nlohmann::ordered_json totals = sum.to_json();
    totals.erase("per_prompt");  // metrics.jsonl keeps the totals; the per-prompt detail is dflash_eval's
    totals["drafter_seconds"] = drafter->seconds();
    const std::string text = totals.dump();
    const int64_t size = int64_t(text.size());
    m.world.send(&size, 1, m.drafter0, comm::kTagSpecResultSize);
    m.world.send_bytes(text.data(), text.size(), m.drafter0, comm::kTagSpecResult);
    log.info("target: speculative eval after step {}: tau {:.3f} on {} prompts in {:.2f} s", next_step, sum.tau(),
             sum.prompts, sum.seconds);
  }
  return true;
}

nlohmann::ordered_json spec_eval_exchange(comm::Transport& world, const std::vector<float>& weights,
                                          int target_rank0) {
  world.send(weights.data(), weights.size(), target_rank0, comm::kTagSpecWeights);
  int64_t size = 0;
  world.recv(&size, 1, target_rank0, comm::kTagSpecResultSize);
  std::string text(size_t(size), '\0');
  world.recv_bytes(text.data(), text.size(), target_rank0, comm::kTagSpecResult);
  return nlohmann::ordered_json::parse(text);
}

nlohmann::ordered_json spec_eval_record(int64_t step, const nlohmann::ordered_json& totals) {
  nlohmann::ordered_json j;
  j["step"] = step;
  j["kind"] = "spec_eval";
  for (const auto& [k, v] : totals.items()) j["spec_" + k] = v;
  return j;
}

// τ of a result (null when no verify ran: NaN, which no best checkpoint takes).
static double tau_of(const nlohmann::ordered_json& t) {
  return t.at("tau").is_null() ? std::nan("") : t.at("tau").get<double>();
}

std::string spec_eval_line(int64_t step, const nlohmann::ordered_json& t) {
  return fmt::format("spec eval step {} | tau {} (speculative, {} prompts, {} tokens, {} verify forwards) | "
                     "kept histogram [{}] | {:.2f} s",
                     step, t.at("tau").is_null() ? std::string("undefined (no verify ran)")
                                                 : fmt::format("{:.3f}", tau_of(t)),
                     t.at("prompts").get<int64_t>(),
                     t.at("generated_tokens").get<int64_t>(), t.at("verify_forwards").get<int64_t>(),
                     fmt::join(t.at("kept_histogram").get<std::vector<int64_t>>(), ", "), t.at("seconds").get<double>());
}

EvalOutcome SpecEval::run(EvalContext& ctx) {
  Timer t;
  const nlohmann::ordered_json totals = spec_eval_exchange(ctx.world, ctx.drafter.params().flat, target_rank0_);
  seconds_ += t.seconds();
  EvalOutcome o;
  o.report.line = spec_eval_line(ctx.next_step, totals);
  o.report.metrics = spec_eval_record(ctx.next_step, totals);
  o.metric = state::TauMetric::spec_tau;
  o.tau = tau_of(totals);
  return o;
}

SpecTrainingEval::SpecTrainingEval(const TrainConfig& cfg, const train::RunPlan& plan)
    : cfg_(cfg), plan_(plan), prompts_([&] {
        require_eval_file("eval.prompts", cfg.eval.prompts, "eval.spec_every");
        return io::Dataset(cfg.eval.prompts, plan.target.vocab);
      }()),
      count_(spec_eval_prompt_count(cfg, prompts_)) {  // every prompt used has one
  model::check_generation_fits(plan.target, cfg.target.path, prompts_, count_, cfg.eval.max_new_tokens,
                               plan.drafter.block_size, "eval.max_new_tokens");
}

report::CheckItem SpecTrainingEval::check_item() const {
  return {"eval prompts",
          {fmt::format("{}: {} prompts x {} new tokens every {} steps (speculative tau)", cfg_.eval.prompts, count_,
                       cfg_.eval.max_new_tokens, cfg_.eval.spec_every)}};
}

std::unique_ptr<Evaluator> SpecTrainingEval::drafter_side(const comm::RankLayout& layout) const {
  if (layout.dp_rank != 0) return nullptr;  // drafter rank 0 exchanges with TP rank 0 of the group feeding it
  return std::make_unique<SpecEval>(cfg_, layout.target_world_rank(layout.group, 0));
}

std::unique_ptr<TargetEvaluator> SpecTrainingEval::target_side(const TargetContext& ctx) const {
  if (ctx.layout.group != 0) return nullptr;  // the group that feeds drafter rank 0
  return std::make_unique<SpecEvalTarget>(cfg_, plan_, ctx.target, ctx.tp, ctx.world, prompts_,
                                          ctx.layout.drafter_world_rank(0), ctx.watchdog);
}

}  // namespace dflash::eval
