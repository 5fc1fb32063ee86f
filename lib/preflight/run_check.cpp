#include "lib/preflight/run_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/backend.h"
#include "lib/core/error.h"
#include "lib/eval/spec_eval.h"
#include "lib/io/dataset.h"
#include "lib/model/drafter_params.h"
#include "lib/model/generate.h"
#include "lib/model/qwen_config.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"
#include "lib/preflight/data_facts.h"
#include "lib/preflight/memory_plan.h"
#include "lib/preflight/pipeline_balance.h"
#include "lib/preflight/signal_margin.h"
#include "lib/preflight/target_check.h"
#include "lib/preflight/target_identity.h"
#include "lib/preflight/tokenizer_check.h"
#include "lib/state/checkpoint.h"
#include "lib/state/checkpointing.h"
#include "lib/state/warm_start.h"
#include "lib/train/run_plan.h"

namespace dflash::preflight {

// An eval file named by the config must exist before the job spends time loading the target.
void check_eval_file(const char* key, const std::string& path, const char* switch_key) {
  DFLASH_USER_CHECK(std::filesystem::is_regular_file(path),
                    "{} = {}: no such file; give an HDF5 dataset (data/README.md) or turn the eval off ({}: 0)", key,
                    path, switch_key);
}

// --check: everything that can be validated without the MPI job, and what the job would need.
int run_check(const TrainConfig& cfg, const std::vector<std::string>& gpus) {
  const int world = cfg.layout.target_tp * cfg.layout.target_groups + cfg.layout.drafter_dp;
  const model::QwenConfig target = model::load_qwen_config(cfg.target.path);
  // a target folder with config.json only (planning a run before downloading the weights): the plan is printed,
  // the result says INCOMPLETE and the exit code is 2; weights present are checked in full
  const bool has_weights = std::filesystem::exists(std::filesystem::path(cfg.target.path) / "model.safetensors") ||
                           std::filesystem::exists(std::filesystem::path(cfg.target.path) / "model.safetensors.index.json");
  TargetWeightsSummary weights;
  if (has_weights) weights = check_target_weights(cfg.target.path, target);
  const io::Dataset data(cfg.data.path, target.vocab, /*scan_tokens=*/false);  // scan_data_facts checks every token
  const train::RunPlan plan = train::make_run_plan(cfg, target, data.size());
  const DataFacts facts = scan_data_facts(data, plan.drafter.mask_token_id, cfg.data.max_seq_len);
  check_data_facts(facts, cfg);
  std::string eval_lines;  // the in-training eval's files, checked as the job checks them
  if (cfg.eval.every > 0) {
    check_eval_file("eval.data", cfg.eval.data, "eval.every");
    const io::Dataset eval(cfg.eval.data, target.vocab);
    TrainConfig as_data = cfg;
    as_data.data.path = cfg.eval.data;
    const DataFacts f = scan_data_facts(eval, plan.drafter.mask_token_id, cfg.data.max_seq_len);
    check_data_facts(f, as_data);
    eval_lines += fmt::format("  eval data      {}: {} of {} sequences every {} steps (held-out loss, acc, tau)\n",
                              cfg.eval.data, cfg.eval.max_sequences > 0 ? std::min<int64_t>(cfg.eval.max_sequences,
                              eval.size()) : eval.size(), eval.size(), cfg.eval.every);
  }
  if (cfg.eval.spec_every > 0) {
    check_eval_file("eval.prompts", cfg.eval.prompts, "eval.spec_every");
    const io::Dataset prompts(cfg.eval.prompts, target.vocab);
    model::check_generation_fits(target, cfg.target.path, prompts, eval::spec_eval_prompt_count(cfg, prompts),
                                 cfg.eval.max_new_tokens, plan.drafter.block_size, "eval.max_new_tokens");
    eval_lines += fmt::format("  eval prompts   {}: {} prompts x {} new tokens every {} steps (speculative tau)\n",
                              cfg.eval.prompts, eval::spec_eval_prompt_count(cfg, prompts), cfg.eval.max_new_tokens,
                              cfg.eval.spec_every);
  }
  const TokenizerFacts tokenizer = read_tokenizer_facts(cfg.target.path);
  const TokenizerCheck tok = check_tokenizer(tokenizer, cfg.target.path, target.vocab, facts.max_token,
                                             plan.drafter.mask_token_id);
  DFLASH_USER_CHECK(tok.errors.empty(), "tokenizer, target and data disagree:\n  {}",
                    fmt::format("{}", fmt::join(tok.errors, "\n  ")));
  const size_t drafter_params = model::drafter_param_count(plan.drafter);  // counted, not allocated
  std::printf("%s\n", format_config_table(cfg).c_str());
  // the memory plan, computed before anything would be allocated: what cannot fit is refused (after the plan is
  // printed, so the user sees which item is too large)
  const MemoryPlanInputs m = memory_plan_inputs(cfg, plan, facts.longest);
  const GpuMemoryPlan mem = gpu_memory_plan(m);
  const double fuller = std::max(mem.target.total(), mem.drafter.total());
  const double here = machine_memory_bytes();
  std::string does_not_fit;
  if (cfg.run.device == "cuda") {
    double largest_card = 0;
    for (const auto& [name, bytes] : default_gpus()) largest_card = std::max(largest_card, bytes);
    if (fuller > largest_card)
      does_not_fit = fmt::format("the fuller GPU needs {:.1f} GB, more than any card listed (the largest has {:.0f} "
                                 "GB): smaller loss.chunk_size / loss.anchors_per_seq / data.max_seq_len, more target "
                                 "TP ranks, or a smaller drafter",
                                 fuller / 1e9, largest_card / 1e9);
  } else if (here > 0 && fuller > here) {
    does_not_fit = memory_does_not_fit({{"one rank (the fuller role)", fuller}}, here, "this machine");
  }

  if (!does_not_fit.empty())
    std::printf("check: DOES NOT FIT (the memory plan below)\n");
  else if (has_weights)
    std::printf("check: OK\n");
  else
    std::printf("check: INCOMPLETE: %s holds config.json but no model.safetensors(.index.json): the plan below comes "
                "from config.json; the job needs the weights\n", cfg.target.path.c_str());
  std::printf("  ranks          mpirun -np %d (%d target TP x %d groups + %d drafter DP)\n", world,
              cfg.layout.target_tp, cfg.layout.target_groups, cfg.layout.drafter_dp);
  std::printf("  target         %s: %d layers, H %d, %d Q / %d KV heads, vocab %d; taps %s\n", cfg.target.path.c_str(),
              target.layers, target.hidden, target.heads, target.kv_heads, target.vocab,
              fmt::format("{}", fmt::join(plan.tap_ids, ",")).c_str());
  if (target.experts > 0) {  // how the routed experts split over the TP ranks (each holds its share, uneven allowed)
    std::vector<int> held;
    for (int r = 0; r < cfg.layout.target_tp; ++r)
      held.push_back(model::plan_target_shard(target, cfg.layout.target_tp, r, model::TargetOptions{}.mlp_grain)
                         .expert_count);
    int moe = 0;
    for (int l = 0; l < target.layers; ++l) moe += target.is_moe(l) ? 1 : 0;
    std::printf("  experts        %d routed (top %d, width %d%s) in %d of %d layers; TP ranks hold %s\n",
                target.experts, target.experts_per_token, target.moe_intermediate,
                target.shared_expert_intermediate > 0
                    ? fmt::format(", shared expert {}", target.shared_expert_intermediate).c_str() : "",
                moe, target.layers, fmt::format("{}", fmt::join(held, ",")).c_str());
  }
  std::string dtypes;
  for (const auto& [dtype, count] : weights.dtypes) dtypes += fmt::format("{}{} x {}", dtypes.empty() ? "" : ", ", count, dtype);
  if (has_weights)
    std::printf("  target weights %lld tensors with the shapes config.json implies (%s), %.3g parameters\n",
                (long long)weights.tensors, dtypes.c_str(), double(weights.parameters));
  else
    std::printf("  target weights NOT CHECKED (none present)\n");
  std::printf("  drafter        %d layers, %d Q / %d KV heads x %d, I %d, block %d: %zu parameters\n",
              plan.drafter.layers, plan.drafter.heads, plan.drafter.kv_heads, plan.drafter.head_dim,
              plan.drafter.intermediate, plan.drafter.block_size, drafter_params);
  std::printf("  data           %s: %lld sequences, %lld tokens; %lld steps per epoch, %lld steps\n",
              cfg.data.path.c_str(), (long long)data.size(), (long long)data.total_tokens(),
              (long long)plan.steps_per_epoch, (long long)plan.total_steps);
  std::printf("  trained        %lld tokens with loss_mask 1 (%.1f%%), %lld anchor candidates; longest sequence %lld "
              "(block %d)\n",
              (long long)facts.trained_tokens, 100.0 * double(facts.trained_tokens) / double(std::max<int64_t>(facts.tokens, 1)),
              (long long)facts.anchor_candidates, (long long)facts.longest, plan.drafter.block_size);
  if (tokenizer.path.empty())
    std::printf("  tokenizer      none in %s (not checked; data/prep/dflash-prep check compares a tokenizer folder)\n",
                cfg.target.path.c_str());
  else
    std::printf("  tokenizer      %s: %lld tokens, %zu special; fits vocab_size %d, the eos/bos ids and the data\n",
                tokenizer.path.c_str(), (long long)tokenizer.tokens, tokenizer.special_ids.size(), target.vocab);
  for (const std::string& n : tok.notes) std::printf("  note           %s\n", n.c_str());
  std::printf("%s", eval_lines.c_str());
  std::printf("  data identity  %s (recorded in checkpoints; a resume on other data is refused)\n",
              facts.identity().c_str());
  if (cfg.run.device == "cuda") {
    std::printf("  per-GPU memory (run.device cuda, %s activations, S = %d):\n%s", m.bf16 ? "bf16" : "fp32",
                m.max_seq_len, format_gpu_memory_plan(mem, default_gpus()).c_str());
  } else {
    // the CPU backend: all ranks in host memory; the single-node launch puts the whole world on one machine
    const int target_ranks = cfg.layout.target_tp * cfg.layout.target_groups;
    const double node = target_ranks * mem.target.total() + cfg.layout.drafter_dp * mem.drafter.total();
    std::printf("  host memory (CPU backend, fp32, S = %d):\n%s", m.max_seq_len,
                format_gpu_memory_plan(mem, {}).c_str());
    std::printf("  one machine    %d target x %.2f GB + %d drafter x %.2f GB = %.2f GB for the whole job on one node "
                "(this machine has %.2f GB); #SBATCH --mem=%.0fG for single_node.sbatch\n",
                target_ranks, mem.target.total() / 1e9, cfg.layout.drafter_dp, mem.drafter.total() / 1e9, node / 1e9,
                here / 1e9, std::ceil(node * 1.15 / (1024.0 * 1024 * 1024)) + 1);
  }
  {  // the balance of the pipeline on GPUs, predicted at the data's mean sequence length (capped by max_seq_len)
    std::vector<std::string> keys = gpus;
    if (keys.empty()) {
      keys = {"h200", "rtx-pro-6000"};
      if (const GpuSpec* here_gpu = kernels::cuda_available() ? gpu_spec_for_device(kernels::cuda_device_name()) : nullptr;
          here_gpu && std::find(keys.begin(), keys.end(), here_gpu->key) == keys.end())
        keys.push_back(here_gpu->key);
    }
    const int64_t mean = facts.tokens / std::max<int64_t>(data.size(), 1);
    const int S = int(cfg.data.max_seq_len > 0 ? std::min<int64_t>(mean, cfg.data.max_seq_len) : mean);
    const BalanceInputs in = balance_inputs(cfg, plan, S);
    std::vector<BalancePrediction> rows;
    for (const std::string& k : keys) rows.push_back(predict_balance(in, gpu_spec(k)));
    // the warnings are for a GPU run: a CPU run's config shows the table as what its GPUs would do
    std::string table = format_balance(in, rows);
    if (cfg.run.device != "cuda" && gpus.empty()) table = table.substr(0, table.find("  warning: "));
    std::printf("%s", table.c_str());
  }
  const SignalMargin margin = recommend_signal_margin(cfg.run.out_dir);
  if (margin.measured) {
    std::printf("  slurm          #SBATCH --signal=USR1@%d (2 x (step %.1f s + checkpoint save %.1f s, measured in "
                "this out_dir) + 60 s)\n",
                margin.margin_seconds, margin.step_seconds, margin.save_seconds);
  } else {
    std::printf("  slurm          #SBATCH --signal=USR1@%d for a start; nothing measured yet in %s: run --check "
                "again after some steps and a checkpoint to size it\n",
                margin.margin_seconds, cfg.run.out_dir.c_str());
  }
  const std::string resume = state::resolve_resume_dir(cfg);
  if (!resume.empty()) {
    const state::LoadedCheckpoint c = state::load_checkpoint(
        resume,
        state::checkpoint_expectation(
            cfg, plan, state::RunIdentity{facts.identity(), has_weights ? target_identity(cfg.target.path) : "", ""}));
    std::printf("  resume         %s (step %lld) verified\n", resume.c_str(), (long long)c.state.step);
  } else {
    std::printf("  resume         %s\n", cfg.ckpt.resume == "auto" ? "auto: no complete checkpoint yet, would start at step 0"
                                                                   : "none: would start at step 0");
  }
  if (!cfg.drafter.init.empty()) {
    if (!resume.empty()) {
      std::printf("  warm start     drafter.init not read: the run resumes from its checkpoint\n");
    } else {
      // every shape and fact checked against the run
      const state::WarmStart w = state::load_warm_start(cfg, plan, state::warm_start_identity(cfg.drafter.init));
      std::printf("  warm start     %s: shapes, block, mask token, vocabulary and taps match\n", w.identity.c_str());
    }
  }
  if (!does_not_fit.empty()) {
    std::fprintf(stderr, "dflash_mpi --check: DOES NOT FIT: %s\n", does_not_fit.c_str());
    return 3;
  }
  return has_weights ? 0 : 2;
}

}  // namespace dflash::preflight
