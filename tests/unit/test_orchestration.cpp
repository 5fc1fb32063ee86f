// The trainer's components (issue 21): each decides its own cadence. due() at the boundaries (every N, the last
// step, a stop, N = 0 off), the stream plan both workers iterate, the evals' registration, the reporter's sinks.
#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "lib/comm/layout.h"
#include "lib/comm/transport.h"
#include "lib/core/error.h"
#include "lib/eval/evals.h"
#include "lib/eval/heldout_eval.h"
#include "lib/eval/spec_eval.h"
#include "lib/io/dataset.h"
#include "lib/report/reporter.h"
#include "lib/state/checkpointer.h"
#include "lib/train/stream_plan.h"
#include "test_util.h"

namespace dflash {
namespace {

using report::Reporter;
using state::Checkpointer;
using train::PacketPlan;

// n sequences, sequence i of length 3 + i with tokens 100 i + t (so a read names its sequence).
std::string write_numbered_dataset(const std::string& name, int n) {
  const std::string path = (test::scratch_dir(name) / "data.h5").string();
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets{0};
  std::vector<uint8_t> mask;
  for (int i = 0; i < n; ++i) {
    for (int t = 0; t < 3 + i; ++t) {
      tokens.push_back(100 * i + t);
      mask.push_back(t > 0 ? 1 : 0);
    }
    offsets.push_back(int64_t(tokens.size()));
  }
  io::write_dataset(path, tokens, offsets, mask);
  return path;
}

struct CollectingSink : report::MetricsSink {
  std::vector<nlohmann::ordered_json>* out;
  explicit CollectingSink(std::vector<nlohmann::ordered_json>* o) : out(o) {}
  void write(const nlohmann::ordered_json& r) override { out->push_back(r); }
};

}  // namespace

TEST_CASE("orchestration: checkpointer due every N steps, at the last step, on a stop, never with N = 0") {
  // every 5
  CHECK(Checkpointer::due(5, 5, false, false, true));
  CHECK(Checkpointer::due(5, 10, false, false, true));
  CHECK_FALSE(Checkpointer::due(5, 4, false, false, true));
  CHECK_FALSE(Checkpointer::due(5, 6, false, false, true));
  CHECK(Checkpointer::due(5, 7, /*last=*/true, false, true));  // the end is saved although 7 % 5 != 0
  // a stop saves (signal, --stop-after-steps), a --dump-step stop does not
  CHECK(Checkpointer::due(5, 3, false, /*stop=*/true, true));
  CHECK_FALSE(Checkpointer::due(5, 3, false, true, /*save_on_stop=*/false));
  CHECK(Checkpointer::due(5, 5, false, true, false));  // ...but a periodic step still is
  // ckpt.every 0: no periodic save, not even the last step; a stop still saves
  CHECK_FALSE(Checkpointer::due(0, 5, false, false, true));
  CHECK_FALSE(Checkpointer::due(0, 7, true, false, true));
  CHECK(Checkpointer::due(0, 7, false, true, true));

  // the member: this run's ckpt.every, and only the writing rank
  TrainConfig cfg;
  cfg.ckpt.every = 4;
  train::RunPlan plan;
  state::CheckpointerSettings writer;
  writer.writer = true;
  const Checkpointer rank0(cfg, plan, writer);
  CHECK(rank0.due(8, false, false));
  CHECK_FALSE(rank0.due(9, false, false));
  CHECK(rank0.due(9, true, false));
  CHECK(rank0.best_notice().empty());  // no best metric: no best checkpoint
  const Checkpointer rank1(cfg, plan, state::CheckpointerSettings{});
  CHECK_FALSE(rank1.due(8, false, false));
  CHECK_FALSE(rank1.due(9, true, true));
}

TEST_CASE("orchestration: progress interval due every log.every steps, at the last step and on a stop") {
  CHECK(Reporter::due(10, 10, false, false));
  CHECK(Reporter::due(10, 30, false, false));
  CHECK_FALSE(Reporter::due(10, 9, false, false));
  CHECK_FALSE(Reporter::due(10, 11, false, false));
  CHECK(Reporter::due(10, 13, true, false));
  CHECK(Reporter::due(10, 13, false, true));
  CHECK(Reporter::due(1, 1, false, false));
  CHECK_FALSE(Reporter::due(0, 10, false, false));  // 0: only the last step and a stop
  CHECK(Reporter::due(0, 10, true, false));
}

TEST_CASE("orchestration: held-out eval due every eval.every steps, not on a stop, off with 0") {
  const std::string path = write_numbered_dataset("orch_heldout_due", 5);
  const io::Dataset eval(path, 1000);
  TrainConfig cfg;
  cfg.layout.drafter_dp = 2;
  cfg.eval.every = 4;
  const eval::HeldoutEval e(cfg, eval, 4, 0);
  CHECK(e.name() == "held-out eval");
  CHECK(e.due(4, false));
  CHECK(e.due(8, false));
  CHECK_FALSE(e.due(3, false));
  CHECK_FALSE(e.due(5, false));
  CHECK_FALSE(e.due(0, false));
  CHECK_FALSE(e.due(4, /*stop=*/true));  // its packets are dropped with the step's
  cfg.eval.every = 0;
  CHECK_FALSE(e.due(4, false));
  CHECK_FALSE(e.due(0, false));
}

TEST_CASE("orchestration: speculative eval due every eval.spec_every steps, also on a stop, off with 0") {
  TrainConfig cfg;
  cfg.eval.spec_every = 3;
  const eval::SpecEval e(cfg, 0);
  CHECK(e.name() == "speculative eval");
  CHECK(e.due(3, false));
  CHECK(e.due(6, false));
  CHECK_FALSE(e.due(4, false));
  CHECK_FALSE(e.due(0, false));
  CHECK(e.due(3, /*stop=*/true));  // its target group waits for the weights
  CHECK_FALSE(e.due(4, true));
  cfg.eval.spec_every = 0;
  CHECK_FALSE(e.due(3, false));
}

TEST_CASE("orchestration: the evals registered per rank and the best checkpoint's metric") {
  TrainConfig cfg;
  cfg.layout.target_tp = 1;
  cfg.layout.target_groups = 1;
  cfg.layout.drafter_dp = 2;
  cfg.eval.data = write_numbered_dataset("orch_registry", 5);
  cfg.eval.prompts = cfg.eval.data;  // every sequence has a prompt: its first token (loss_mask 0)
  train::RunPlan plan;
  plan.drafter.block_size = 4;
  plan.target.vocab = 1000;
  auto names = [&](int dp_rank) {
    const eval::TrainingEvals evals = eval::make_training_evals(cfg, plan, /*scan_tokens=*/false);
    const comm::RankLayout layout = comm::make_rank_layout(1, 1, 2, 3, 1 + dp_rank);
    std::vector<std::string> out;
    for (const auto& e : eval::make_drafter_evals(evals, layout)) out.push_back(e->name());
    return out;
  };
  auto metric = [&] { return eval::best_checkpoint_metric(eval::make_training_evals(cfg, plan, false)); };
  CHECK(names(0).empty());
  CHECK_FALSE(metric().has_value());
  cfg.eval.every = 2;
  CHECK(names(0) == std::vector<std::string>{"held-out eval"});
  CHECK(metric() == state::TauMetric::eval_tau);
  cfg.eval.spec_every = 5;
  CHECK(names(0) == std::vector<std::string>{"held-out eval", "speculative eval"});
  CHECK(names(1) == std::vector<std::string>{"held-out eval"});  // only drafter rank 0 talks to the target
  CHECK(metric() == state::TauMetric::spec_tau);  // the speculative τ, whatever the registration order
  // each says what --check prints of it
  const eval::TrainingEvals evals = eval::make_training_evals(cfg, plan, false);
  REQUIRE(evals.size() == 2);
  CHECK(evals[0]->check_item().name == "eval data");
  CHECK(evals[0]->check_item().lines[0] == cfg.eval.data + ": 5 of 5 sequences every 2 steps (held-out loss, acc, tau)");
  CHECK(evals[1]->check_item().lines[0] == cfg.eval.prompts + ": 5 prompts x 64 new tokens every 5 steps (speculative tau)");
  // an input file that is not there is refused by name, with the switch that turns the eval off
  cfg.eval.prompts = cfg.eval.data + ".missing";
  CHECK_THROWS_WITH_AS(eval::make_training_evals(cfg, plan, false), doctest::Contains("eval.prompts = "), dflash::Error);
}

TEST_CASE("orchestration: the stream plan gives each drafter its training packets, then the held-out ones") {
  const std::string train_path = write_numbered_dataset("orch_stream_train", 12);
  const std::string eval_path = write_numbered_dataset("orch_stream_eval", 5);
  const io::Dataset data(train_path, 10000);
  TrainConfig cfg;
  cfg.layout.drafter_dp = 2;
  cfg.optim.micro_batches = 2;
  cfg.data.shuffle = false;
  cfg.data.max_seq_len = 6;
  cfg.eval.every = 2;
  train::RunPlan plan;
  plan.num_sequences = data.size();
  plan.total_steps = 3;
  plan.target.vocab = 10000;
  cfg.eval.data = eval_path;
  const eval::TrainingEvals evals = eval::make_training_evals(cfg, plan, /*scan_tokens=*/false);
  const train::StreamPlan stream = eval::make_stream_plan(cfg, plan, data, evals);
  const io::SequenceSchedule schedule(12, 2, 2, uint64_t(cfg.run.seed), false);

  // drafter rank 1 from step 0: steps 0, 1 (then held-out 1, 3: eval after 2 steps), 2, end
  train::StreamCursor cursor(stream, 1, 0);
  std::vector<PacketPlan> got;
  while (auto p = cursor.next()) got.push_back(*p);
  REQUIRE(got.size() == 8);
  const int64_t want_step[] = {0, 0, 1, 1, 1, 1, 2, 2};
  const int want_micro[] = {0, 1, 0, 1, 1, 3, 0, 1};
  for (size_t k = 0; k < got.size(); ++k) {
    INFO("packet " << k);
    CHECK(got[k].step == want_step[k]);
    CHECK(got[k].micro == want_micro[k]);
    const bool heldout = k == 4 || k == 5;
    CHECK(got[k].kind == (heldout ? train::kEvalPacket : train::kTrainPacket));
    if (!heldout) CHECK(got[k].seq_index == schedule.sequence(got[k].step, got[k].micro, 1));
  }
  CHECK(got[4].seq_index == 1);
  CHECK(got[5].seq_index == 3);
  CHECK(got[4].seq_len == 4);  // eval sequence 1: 3 + 1 tokens
  CHECK(got[5].seq_len == 6);  // eval sequence 3: 6 tokens, at data.max_seq_len
  CHECK(got[0].seq_len == std::min<int>(6, 3 + int(got[0].seq_index)));

  // resumed at step 2: the last step's packets only (no eval after 3 steps)
  train::StreamCursor resumed(stream, 1, 2);
  int n = 0;
  while (auto p = resumed.next()) {
    CHECK(p->step == 2);
    CHECK(p->kind == train::kTrainPacket);
    ++n;
  }
  CHECK(n == 2);

  // the target side: drafter 0's extras after step 1 are held-out 0, 2, 4; read gives their sequences
  const std::vector<PacketPlan> extras = stream.extras(1, 0);
  REQUIRE(extras.size() == 3);
  CHECK(extras[0].seq_index == 0);
  CHECK(extras[1].seq_index == 2);
  CHECK(extras[2].seq_index == 4);
  CHECK(stream.extras(0, 0).empty());
  CHECK(stream.extras(2, 0).empty());
  const io::Sequence s = stream.read(extras[1]);
  REQUIRE(s.tokens.size() == 5);
  CHECK(s.tokens[0] == 200);  // eval.data's sequence 2, not data.path's
  const io::Sequence t = stream.read(stream.train_packet(0, 1, 1));
  CHECK(t.tokens[0] == 100 * int(schedule.sequence(0, 1, 1)));

  // without eval.data: no extras at all
  const train::StreamPlan plain = eval::make_stream_plan(cfg, plan, data, eval::TrainingEvals{});
  CHECK(plain.extras(1, 0).empty());
  train::StreamCursor c(plain, 0, 0);
  int m = 0;
  while (c.next()) ++m;
  CHECK(m == 6);
}

TEST_CASE("orchestration: the reporter sends a progress record to every sink when due, eval records from rank 0") {
  const auto dir = test::scratch_dir("orch_reporter");
  report::Logger log(dir.string(), {5, "drafter", 0}, report::LogLevel::kWarn, false);
  comm::SelfTransport dp;
  int hashes = 0;
  std::vector<nlohmann::ordered_json> a, b;
  report::ReporterSettings s;
  s.log_every = 3;
  s.total_steps = 7;
  s.block_size = 4;
  s.reporting = true;
  Reporter reporter(s, log, dp, [&] { return uint64_t(++hashes); });
  reporter.add_sink(std::make_unique<CollectingSink>(&a));
  reporter.add_sink(std::make_unique<CollectingSink>(&b));
  for (int64_t next = 1; next <= 7; ++next) {
    train::StepResult r;
    r.step = next - 1;
    r.metrics.correct.assign(4, 0);
    r.metrics.scored.assign(4, 0);
    reporter.after_step(r, next, next == 7, false);
  }
  REQUIRE(a.size() == 3);  // after steps 3, 6 and the last, 7
  CHECK(a[0]["step"] == 3);
  CHECK(a[1]["step"] == 6);
  CHECK(a[2]["step"] == 7);
  CHECK(b.size() == 3);
  CHECK(hashes == 3);  // the weights are compared at each progress line
  reporter.report({"eval step 7 | ...", {{"step", 7}, {"kind", "eval"}}});
  REQUIRE(a.size() == 4);
  CHECK(a[3]["kind"] == "eval");

  // a rank that does not report: the check still runs (it is collective), no record goes out
  std::vector<nlohmann::ordered_json> c;
  s.reporting = false;
  Reporter quiet(s, log, dp, [&] { return uint64_t(++hashes); });
  quiet.add_sink(std::make_unique<CollectingSink>(&c));
  train::StepResult r;
  r.metrics.correct.assign(4, 0);
  r.metrics.scored.assign(4, 0);
  quiet.after_step(r, 1, false, /*stop=*/true);
  quiet.report({"eval", {{"step", 1}}});
  CHECK(c.empty());
  CHECK(hashes == 4);
}

}  // namespace dflash
