#include "lib/model/random_target_options.h"

#include <algorithm>

#include "lib/core/cli_app.h"

namespace dflash::model {

RandomTargetOptions::RandomTargetOptions(CLI::App& app) {
  const std::string g = "random target";  // one group in --help
  // --arch keeps its own message (scripts match it), checked in apply()
  app.add_option("--arch", arch_, "qwen3 (dense, default), qwen3_5 (Qwen3.5/3.6 hybrid: Gated DeltaNet + gated "
                 "attention), qwen3_moe (Qwen3-MoE) or qwen3_5_moe (Qwen3.5/3.6 MoE hybrid)")->group(g)->type_name("ARCH");
  app.add_option("--hidden", hidden_, "hidden size")->group(g)->check(positive_number());
  app.add_option("--layers", layers_, "decoder layers")->group(g)->check(positive_number());
  app.add_option("--heads", heads_, "attention heads")->group(g)->check(positive_number());
  app.add_option("--kv-heads", kv_heads_, "key/value heads")->group(g)->check(positive_number());
  app.add_option("--head-dim", head_dim_, "head dimension")->group(g)->check(positive_number());
  app.add_option("--intermediate", intermediate_, "MLP width")->group(g)->check(positive_number());
  app.add_option("--vocab", vocab_, "vocabulary size")->group(g)->check(positive_number());
  app.add_option("--seed", seed_, "the weights' random seed")->group(g);
  app.add_option("--dtype", dtype_, "the stored weights' type")->group(g)->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--files", files_, "split the layers over N files with a model.safetensors.index.json")
      ->group(g)->check(positive_number());
  app.add_option("--rope-theta", rope_theta_, "RoPE base")->group(g)->check(positive_number());
  app.add_flag("--tie", tie_, "tie_word_embeddings: true (no lm_head.weight)")->group(g);
  const std::string h = "random target, qwen3_5 / qwen3_5_moe";
  app.add_option("--linear-k-heads", linear_k_heads_, "Gated DeltaNet key heads")->group(h)->check(positive_number());
  app.add_option("--linear-v-heads", linear_v_heads_, "Gated DeltaNet value heads")->group(h)->check(positive_number());
  app.add_option("--linear-k-dim", linear_k_dim_, "Gated DeltaNet key head dimension")->group(h)->check(positive_number());
  app.add_option("--linear-v-dim", linear_v_dim_, "Gated DeltaNet value head dimension")->group(h)->check(positive_number());
  app.add_option("--conv-kernel", conv_kernel_, "the short convolution's width")->group(h)->check(positive_number());
  app.add_option("--full-attention-interval", full_attention_interval_, "every N-th layer full attention")
      ->group(h)->check(positive_number());
  app.add_option("--partial-rotary", partial_rotary_, "partial_rotary_factor")->group(h)->check(CLI::Range(0.0, 1.0));
  const std::string m = "random target, qwen3_moe / qwen3_5_moe";
  app.add_option("--experts", experts_, "routed experts (default 6)")->group(m)->check(positive_number());
  app.add_option("--experts-per-tok", experts_per_token_, "experts per token")->group(m)->check(positive_number());
  app.add_option("--moe-intermediate", moe_intermediate_, "an expert's width")->group(m)->check(positive_number());
  app.add_option("--norm-topk-prob", norm_topk_prob_, "renormalise the top-k routing weights")
      ->group(m)->check(CLI::IsMember({"1", "0", "true", "false"}));
  app.add_option("--mlp-only-layers", mlp_only_layers_, "layers that keep the dense MLP, e.g. 0,2")
      ->group(m)->type_name("LIST");
  app.add_option("--expert-layout", expert_layout_, "per-expert (mlp.experts.{e}.*) or fused (transformers 5)")
      ->group(m)->check(CLI::IsMember({"per-expert", "fused"}));
  app.add_option("--shared-intermediate", shared_intermediate_, "qwen3_5_moe: the shared expert's width")
      ->group(m)->check(positive_number());
}

void RandomTargetOptions::apply(RandomTargetSpec& s) const {
  if (arch_) {
    const std::string& arch = *arch_;
    if (arch != "qwen3" && arch != "qwen3_5" && arch != "qwen3_moe" && arch != "qwen3_5_moe")
      throw UsageError(fmt::format("--arch must be qwen3 (dense), qwen3_5 (Qwen3.5/3.6 hybrid), qwen3_moe (Qwen3-MoE) "
                                   "or qwen3_5_moe (Qwen3.5/3.6 MoE hybrid), got '{}'", arch));
    const bool moe = arch == "qwen3_moe" || arch == "qwen3_5_moe";
    s.hybrid = arch == "qwen3_5" || arch == "qwen3_5_moe";
    if (moe && s.experts == 0) s.experts = 6;
    if (!moe) s.experts = 0;
  }
  const bool moe_option = experts_ || shared_intermediate_ || experts_per_token_ || moe_intermediate_ ||
                          norm_topk_prob_ || mlp_only_layers_ || expert_layout_;
  if (moe_option && s.experts == 0)
    throw UsageError("--experts, --experts-per-tok, --moe-intermediate, --norm-topk-prob, --mlp-only-layers and "
                     "--expert-layout, --shared-intermediate need --arch qwen3_moe or qwen3_5_moe");
  auto set = [](auto& field, const auto& given) {
    if (given) field = *given;
  };
  set(s.shared_expert_intermediate, shared_intermediate_);
  set(s.experts, experts_);
  set(s.experts_per_token, experts_per_token_);
  set(s.moe_intermediate, moe_intermediate_);
  if (norm_topk_prob_) s.norm_topk_prob = *norm_topk_prob_ == "1" || *norm_topk_prob_ == "true";
  if (mlp_only_layers_) {
    s.mlp_only_layers.clear();
    const std::string& v = *mlp_only_layers_;
    size_t b = 0;
    while (b < v.size()) {
      const size_t e = std::min(v.find(',', b), v.size());
      const std::string item = v.substr(b, e - b);
      if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos)
        throw UsageError(fmt::format("--mlp-only-layers must be layer indices separated by commas (0,2), got '{}'", v));
      s.mlp_only_layers.push_back(std::stoi(item));
      b = e + 1;
    }
  }
  if (expert_layout_) s.fused_experts = *expert_layout_ == "fused";
  set(s.linear_k_heads, linear_k_heads_);
  set(s.linear_v_heads, linear_v_heads_);
  set(s.linear_k_dim, linear_k_dim_);
  set(s.linear_v_dim, linear_v_dim_);
  set(s.conv_kernel, conv_kernel_);
  set(s.full_attention_interval, full_attention_interval_);
  set(s.partial_rotary_factor, partial_rotary_);
  set(s.hidden, hidden_);
  set(s.layers, layers_);
  set(s.heads, heads_);
  set(s.kv_heads, kv_heads_);
  set(s.head_dim, head_dim_);
  set(s.intermediate, intermediate_);
  set(s.vocab, vocab_);
  set(s.seed, seed_);
  set(s.files, files_);
  set(s.rope_theta, rope_theta_);
  if (tie_) s.tie = true;
  if (dtype_) s.dtype = *dtype_ == "bf16" ? io::DType::BF16 : io::DType::F32;
}

}  // namespace dflash::model
