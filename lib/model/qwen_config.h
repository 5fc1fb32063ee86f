#pragma once
// The shape of a Qwen target, parsed from a Hugging Face `config.json`: dense Qwen3 (Qwen3ForCausalLM) or the
// Qwen3.5 / Qwen3.6 hybrid family (Qwen3_5ForCausalLM, or Qwen3_5ForConditionalGeneration whose text model sits
// under `text_config` and whose weights carry the `model.language_model.` prefix; vision tower and MTP ignored),
// Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3 attention, routed experts in the layers decoder_sparse_step and
// mlp_only_layers select; softmax router, top-k), and the Qwen3.5 / Qwen3.6 MoE hybrids
// (Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeForCausalLM: routed experts in every layer plus a shared expert
// gated by sigmoid(shared_expert_gate(x))).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash::model {

enum class LayerType { full_attention, linear_attention };

struct QwenConfig {
  std::string architecture = "Qwen3ForCausalLM";
  // Qwen3.5/3.6: RMSNorms scale by (1 + w), full attention has an output gate and partial RoPE, and the
  // layers listed as linear_attention are Gated DeltaNet
  bool hybrid = false;
  std::string weight_prefix = "model.";  // "model.language_model." for the ConditionalGeneration layout
  int hidden = 0;        // hidden_size H
  int layers = 0;        // num_hidden_layers
  int heads = 0;         // num_attention_heads (Q heads)
  int kv_heads = 0;      // num_key_value_heads
  int head_dim = 0;      // head_dim (Qwen3: not hidden/heads in general)
  int intermediate = 0;  // intermediate_size
  int vocab = 0;         // vocab_size V
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  bool tie_word_embeddings = false;  // lm_head = embed_tokens (HF default false)
  int max_position_embeddings = 0;   // informational; 0 when absent
  int rotary_dim = 0;                // head_dim × partial_rotary_factor (Qwen3: head_dim); the first dims rotate
  std::vector<LayerType> layer_types;  // [layers]; all full_attention for Qwen3
  // Gated DeltaNet (linear attention) shape; zero for Qwen3
  int linear_k_heads = 0;  // linear_num_key_heads (q and k heads)
  int linear_v_heads = 0;  // linear_num_value_heads (a multiple of linear_k_heads)
  int linear_k_dim = 0;    // linear_key_head_dim
  int linear_v_dim = 0;    // linear_value_head_dim
  int conv_kernel = 0;     // linear_conv_kernel_dim
  // Mixture of experts (Qwen3-MoE); experts = 0 for the dense families
  int experts = 0;              // num_experts E
  int experts_per_token = 0;    // num_experts_per_tok k (top-k of the router's softmax)
  int moe_intermediate = 0;     // moe_intermediate_size: every expert's SwiGLU width
  bool norm_topk_prob = false;  // renormalise the k chosen probabilities to sum 1
  std::vector<bool> moe_layers;  // [layers]: routed experts (else the dense MLP of intermediate_size)
  int shared_expert_intermediate = 0;  // Qwen3.5/3.6 MoE: the shared expert's width (0: none)

  bool is_linear(int layer) const { return layer_types[size_t(layer)] == LayerType::linear_attention; }
  int linear_conv_dim() const { return 2 * linear_k_heads * linear_k_dim + linear_v_heads * linear_v_dim; }
  int v_per_k() const { return linear_v_heads / linear_k_heads; }  // value heads per key head

  int q_per_kv() const { return heads / kv_heads; }  // GQA group size
  bool is_moe(int layer) const { return !moe_layers.empty() && moe_layers[size_t(layer)]; }
  bool any_dense_mlp() const;  // some layer has the dense MLP (intermediate_size)
};

// Parses and validates a config.json object; `source` (the file path) names the file in every error.
// Unsupported architecture, a missing or mistyped key, or inconsistent sizes are dflash::Error.
QwenConfig parse_qwen_config(const nlohmann::json& j, const std::string& source);
// Reads `path`, or `path/config.json` when path is a directory.
QwenConfig load_qwen_config(const std::string& path);
// The config.json a Hugging Face loader accepts for this shape: Qwen3ForCausalLM, Qwen3_5ForCausalLM when
// c.hybrid (text-only layout, weights under "model."), Qwen3MoeForCausalLM when c.experts > 0 (the MoE layers as
// mlp_only_layers, decoder_sparse_step 1).
nlohmann::json qwen_config_json(const QwenConfig& c);

}  // namespace dflash::model
