#include "lib/preflight/run_check.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lib/core/error.h"
#include "lib/model/drafter_params.h"
#include "lib/model/target_identity.h"
#include "lib/preflight/memory_plan.h"
#include "lib/preflight/pipeline_balance.h"
#include "lib/preflight/signal_margin.h"
#include "lib/state/checkpoint.h"
#include "lib/state/checkpointing.h"
#include "lib/state/warm_start.h"

namespace dflash::preflight {

namespace {

bool has_target_weights(const std::string& dir) {
  namespace fs = std::filesystem;
  return fs::exists(fs::path(dir) / "model.safetensors") || fs::exists(fs::path(dir) / "model.safetensors.index.json");
}

report::CheckItem ranks_item(const TrainConfig& cfg) {
  const int world = cfg.layout.target_tp * cfg.layout.target_groups + cfg.layout.drafter_dp;
  return {"ranks", {fmt::format("mpirun -np {} ({} target TP x {} groups + {} drafter DP)", world, cfg.layout.target_tp,
                                cfg.layout.target_groups, cfg.layout.drafter_dp)}};
}

report::CheckItem drafter_item(const train::RunPlan& plan) {
  const model::DrafterConfig& d = plan.drafter;
  return {"drafter", {fmt::format("{} layers, {} Q / {} KV heads x {}, I {}, block {}: {} parameters", d.layers,
                                  d.heads, d.kv_heads, d.head_dim, d.intermediate, d.block_size,
                                  model::drafter_param_count(d))}};  // counted, not allocated
}

std::vector<report::CheckItem> data_items(const Preflight& p) {
  const train::DataFacts& f = p.facts;
  return {{"data", {fmt::format("{}: {} sequences, {} tokens; {} steps per epoch, {} steps", p.cfg.data.path,
                                p.data->size(), p.data->total_tokens(), p.plan.steps_per_epoch, p.plan.total_steps)}},
          {"trained", {fmt::format("{} tokens with loss_mask 1 ({:.1f}%), {} anchor candidates; longest sequence {} "
                                   "(block {})", f.trained_tokens,
                                   100.0 * double(f.trained_tokens) / double(std::max<int64_t>(f.tokens, 1)),
                                   f.anchor_candidates, f.longest, p.plan.drafter.block_size)}}};
}

report::CheckItem data_identity_item(const train::DataFacts& facts) {
  return {"data identity", {facts.identity() + " (recorded in checkpoints; a resume on other data is refused)"}};
}

// Where the job would start: the resume checkpoint verified against this run, or the warm start's weights checked.
std::vector<report::CheckItem> start_items(const Preflight& p) {
  const TrainConfig& cfg = p.cfg;
  std::vector<report::CheckItem> items;
  const std::string resume = state::resolve_resume_dir(cfg);
  if (!resume.empty()) {
    const state::RunIdentity identity{p.facts.identity(),
                                      p.has_weights ? model::target_identity(cfg.target.path) : "", ""};
    const state::LoadedCheckpoint c =
        state::load_checkpoint(resume, state::checkpoint_expectation(cfg, p.plan, identity));
    items.push_back({"resume", {fmt::format("{} (step {}) verified", resume, c.state.step)}});
  } else {
    items.push_back({"resume", {cfg.ckpt.resume == "auto" ? "auto: no complete checkpoint yet, would start at step 0"
                                                          : "none: would start at step 0"}});
  }
  if (cfg.drafter.init.empty()) return items;
  if (!resume.empty()) {
    items.push_back({"warm start", {"drafter.init not read: the run resumes from its checkpoint"}});
  } else {
    // every shape and fact checked against the run
    const state::WarmStart w = state::load_warm_start(cfg, p.plan, state::warm_start_identity(cfg.drafter.init));
    items.push_back({"warm start", {w.identity + ": shapes, block, mask token, vocabulary and taps match"}});
  }
  return items;
}

}  // namespace

Preflight::Preflight(const TrainConfig& c, std::vector<std::string> g)
    : cfg(c),
      target(model::load_qwen_config(c.target.path)),
      has_weights(has_target_weights(c.target.path)),
      gpus(std::move(g)) {
  // a target folder with config.json only (planning a run before downloading the weights): the plan is printed,
  // the result says INCOMPLETE and the exit code is 2; weights present are checked in full
  if (has_weights) weights = check_target_weights(cfg.target.path, target);
  data = std::make_unique<io::Dataset>(cfg.data.path, target.vocab, /*scan_tokens=*/false);  // the scan below reads all
  plan = train::make_run_plan(cfg, target, data->size());
  facts = train::scan_data_facts(*data, plan.drafter.mask_token_id, cfg.data.max_seq_len);
  train::check_data_facts(facts, cfg);
  evals = eval::make_training_evals(cfg, plan, /*scan_tokens=*/true);  // their files, as the job checks them
  for (const auto& e : evals) e->check_on_start();
  tokenizer = read_tokenizer_facts(cfg.target.path);
  tokenizer_check =
      check_tokenizer(tokenizer, cfg.target.path, target.vocab, facts.max_token, plan.drafter.mask_token_id);
  DFLASH_USER_CHECK(tokenizer_check.errors.empty(), "tokenizer, target and data disagree:\n  {}",
                    fmt::format("{}", fmt::join(tokenizer_check.errors, "\n  ")));
}

std::vector<report::CheckItem> preflight_items(const Preflight& p) {
  std::vector<report::CheckItem> items;
  const auto add = [&](std::vector<report::CheckItem> more) {
    for (report::CheckItem& item : more) items.push_back(std::move(item));
  };
  add({ranks_item(p.cfg)});
  add(target_items(p.cfg.target.path, p.target, p.plan.tap_ids, p.cfg.layout.target_tp, p.has_weights, p.weights));
  add({drafter_item(p.plan)});
  add(data_items(p));
  add(tokenizer_items(p.tokenizer, p.tokenizer_check, p.cfg.target.path, p.target.vocab));
  for (const auto& e : p.evals) add({e->check_item()});
  add({data_identity_item(p.facts)});
  add(memory_items(p.cfg, p.plan, p.facts.longest));
  add({balance_item(p.cfg, p.plan, p.facts.tokens / std::max<int64_t>(p.data->size(), 1), p.gpus)});
  add({slurm_item(p.cfg.run.out_dir)});
  add(start_items(p));
  return items;
}

int run_check(const TrainConfig& cfg, const std::vector<std::string>& gpus) {
  const Preflight p(cfg, gpus);
  const std::vector<report::CheckItem> items = preflight_items(p);
  const report::CheckItem* worst = nullptr;  // the first item of the worst verdict
  for (const report::CheckItem& item : items)
    if (item.verdict != report::Verdict::ok && (!worst || item.verdict > worst->verdict)) worst = &item;
  std::printf("%s\n", format_config_table(cfg).c_str());
  if (!worst)
    std::printf("check: OK\n");
  else if (worst->verdict == report::Verdict::does_not_fit)
    std::printf("check: DOES NOT FIT (the memory plan below)\n");
  else
    std::printf("check: INCOMPLETE: %s\n", worst->why.c_str());
  std::fputs(report::format_check_items(items).c_str(), stdout);
  if (worst && worst->verdict == report::Verdict::does_not_fit) {
    std::fprintf(stderr, "dflash_mpi --check: DOES NOT FIT: %s\n", worst->why.c_str());
    return 3;
  }
  return worst ? 2 : 0;
}

}  // namespace dflash::preflight
