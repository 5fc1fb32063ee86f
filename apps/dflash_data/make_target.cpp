// dflash_data make-target --out DIR [--arch qwen3|qwen3_5 --hidden 64 --layers 2 --heads 4 --kv-heads 2
//   --head-dim 16 --intermediate 128 --vocab 256 --seed 1 --dtype f32|bf16 --files 1 --tie
//   qwen3_5 only: --linear-k-heads 2 --linear-v-heads 4 --linear-k-dim 16 --linear-v-dim 16 --conv-kernel 4
//   --full-attention-interval 4 --partial-rotary 0.25
//   qwen3_moe only: --experts 6 --experts-per-tok 2 --moe-intermediate 40 --norm-topk-prob 1|0
//   --mlp-only-layers 0,2 --expert-layout per-expert|fused]
// Writes a random Qwen3 target, a Qwen3-MoE (Qwen3MoeForCausalLM), or a Qwen3.5 hybrid (Gated DeltaNet + gated
// attention, Qwen3_5ForCausalLM layout),
// as config.json + model.safetensors in the Hugging Face format.
#include <cstdio>

#include "lib/core/cli_app.h"
#include "lib/model/random_target_options.h"
#include "lib/model/random_target.h"

namespace dflash::data {

int run_make_target(int argc, char** argv) {
  CliApp app("Writes a random Qwen3 (dense), Qwen3-MoE or Qwen3.5 (hybrid Gated DeltaNet + attention) target "
             "(config.json + model.safetensors) in the Hugging Face format.", "dflash_data make-target");
  std::string out;
  app.add_option("--out", out, "the model directory to write")->required()->type_name("DIR");
  const model::RandomTargetOptions target_options(app);
  if (!parse_command_line(app, argc, argv)) return 0;
  model::RandomTargetSpec s;
  target_options.apply(s);
  model::write_random_target(out, s);
  std::printf("wrote random %s target to %s: H %d, %d layers, %d/%d heads × %d, intermediate %d, vocab %d, %s%s\n",
              s.hybrid ? "Qwen3.5 hybrid" : s.experts > 0 ? "Qwen3-MoE" : "Qwen3", out.c_str(), s.hidden, s.layers, s.heads, s.kv_heads,
              s.head_dim, s.intermediate, s.vocab, s.dtype == io::DType::BF16 ? "bf16" : "f32", s.tie ? ", tied" : "");
  if (s.hybrid) {
    std::printf("  Gated DeltaNet: %d key heads × %d, %d value heads × %d, conv %d; full attention every %d layers\n",
                s.linear_k_heads, s.linear_k_dim, s.linear_v_heads, s.linear_v_dim, s.conv_kernel,
                s.full_attention_interval);
  }
  if (s.experts > 0) {
    std::string dense;
    for (int l : s.mlp_only_layers) dense += (dense.empty() ? "" : ",") + std::to_string(l);
    std::printf("  experts: %d, top-%d, width %d, norm_topk_prob %s, dense MLP layers [%s], %s layout\n", s.experts,
                s.experts_per_token, s.moe_intermediate, s.norm_topk_prob ? "true" : "false", dense.c_str(),
                s.fused_experts ? "fused" : "per-expert");
  }
  return 0;
}

}  // namespace dflash::data
