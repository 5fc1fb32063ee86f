#pragma once
// The random-target options (--arch qwen3|qwen3_5|qwen3_moe|qwen3_5_moe --hidden --layers --heads --kv-heads
// --head-dim --intermediate --vocab --seed --files --rope-theta --dtype f32|bf16 --tie; hybrids also --linear-k-heads
// --linear-v-heads --linear-k-dim --linear-v-dim --conv-kernel --full-attention-interval --partial-rotary; qwen3_moe:
// --experts --experts-per-tok --moe-intermediate --norm-topk-prob 1|0 --mlp-only-layers 0,2 --expert-layout
// per-expert|fused; qwen3_5_moe: the hybrid options, the MoE ones and --shared-intermediate) on a CLI::App, for the
// programs that write random targets (dflash_data make-target, dflash_bench target, tests/integration/target_tp_check).
// Beside the spec it fills (lib/model/random_target.h), so every program that writes one takes the same options.
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "lib/model/random_target.h"

namespace dflash::model {

class RandomTargetOptions {
 public:
  explicit RandomTargetOptions(CLI::App& app);  // adds the options to app (app must outlive this object's use)
  // The options given override spec's values (a program's own defaults stay where nothing was given); throws
  // UsageError for a combination no target has (an MoE option without an MoE --arch).
  void apply(RandomTargetSpec& spec) const;
  const std::optional<std::string>& arch() const { return arch_; }

 private:
  std::optional<std::string> arch_, dtype_, norm_topk_prob_, mlp_only_layers_, expert_layout_;
  std::optional<int> hidden_, layers_, heads_, kv_heads_, head_dim_, intermediate_, vocab_, files_;
  std::optional<int> linear_k_heads_, linear_v_heads_, linear_k_dim_, linear_v_dim_, conv_kernel_,
      full_attention_interval_;
  std::optional<int> experts_, experts_per_token_, moe_intermediate_, shared_intermediate_;
  std::optional<uint64_t> seed_;
  std::optional<double> rope_theta_, partial_rotary_;
  bool tie_ = false;
};

}  // namespace dflash::model
