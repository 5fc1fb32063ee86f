#pragma once
// Random Qwen targets (dense Qwen3, or Qwen3.5 hybrids in the text-only Qwen3_5ForCausalLM layout) in the Hugging
// Face format (config.json + model.safetensors, or an index over several
// files), seeded, any size: the models of the tests, the benchmarks and the embedded default.
#include <cstdint>
#include <string>
#include <vector>

#include "lib/io/safetensors.h"
#include "lib/model/qwen_config.h"

namespace dflash::model {

struct RandomTargetSpec {
  int hidden = 64;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 16;
  int intermediate = 128;
  int vocab = 256;
  uint64_t seed = 1;
  io::DType dtype = io::DType::F32;
  bool tie = false;  // tie_word_embeddings: no lm_head.weight written
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  int files = 1;  // > 1: model-0000i-of-0000n.safetensors + model.safetensors.index.json, layers split over files
  // Qwen3.5 hybrid (--arch qwen3_5): every full_attention_interval-th layer full attention, the rest Gated DeltaNet
  bool hybrid = false;
  int full_attention_interval = 4;
  double partial_rotary_factor = 0.25;
  int linear_k_heads = 2, linear_v_heads = 4, linear_k_dim = 16, linear_v_dim = 16, conv_kernel = 4;
  // Qwen3-MoE (--arch qwen3_moe; experts > 0): routed experts in every layer but mlp_only_layers (which keep the dense
  // MLP of `intermediate`); fused_experts: written as transformers 5 holds them (mlp.experts.gate_up_proj
  // [E, 2I, H], mlp.experts.down_proj [E, H, I]) instead of per expert (mlp.experts.{e}.gate_proj.weight, ...)
  int experts = 0, experts_per_token = 2, moe_intermediate = 40;
  bool norm_topk_prob = true;
  std::vector<int> mlp_only_layers;
  bool fused_experts = false;
  // Qwen3.5/3.6 MoE hybrid (--arch qwen3_5_moe: hybrid and experts > 0): every layer has experts and a shared
  // expert of this width (mlp.shared_expert.*, gated by mlp.shared_expert_gate.weight [1, H]); no dense MLP
  int shared_expert_intermediate = 32;

  QwenConfig config() const;
};

// Creates `dir` if needed and writes the model. Every tensor is drawn from its own Rng stream (seed, tensor
// index): linear weights N(0, 1/in), embedding and lm_head N(0, 1), norm weights 1 + N(0, 0.1²) (so that a wrong
// norm weight shows; hybrids store N(0, 0.1²), which Qwen3.5's RMSNorm applies as 1 + w). MoE: the router
// mlp.gate.weight [E, H] and each expert's projections N(0, 1/in). Hybrid DeltaNet extras:
// conv1d N(0, 1/K), A_log and dt_bias N(0, 0.5²), the gated norm 1 + N(0, 0.1²). Throws on an invalid shape (via the config checks) or an unwritable directory.
void write_random_target(const std::string& dir, const RandomTargetSpec& spec);

// The command-line options that fill a spec: lib/model/random_target_options.h.

}  // namespace dflash::model
