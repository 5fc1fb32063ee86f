#pragma once
// The shape of a Qwen3 target, parsed from a Hugging Face `config.json` (architecture Qwen3ForCausalLM).
#include <string>

#include <nlohmann/json.hpp>

namespace dflash::model {

struct QwenConfig {
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

  int q_per_kv() const { return heads / kv_heads; }  // GQA group size
};

// Parses and validates a config.json object; `source` (the file path) names the file in every error.
// Unsupported architecture, a missing or mistyped key, or inconsistent sizes are dflash::Error.
QwenConfig parse_qwen_config(const nlohmann::json& j, const std::string& source);
// Reads `path`, or `path/config.json` when path is a directory.
QwenConfig load_qwen_config(const std::string& path);
// The config.json a Hugging Face Qwen3ForCausalLM loader accepts for this shape.
nlohmann::json qwen_config_json(const QwenConfig& c);

}  // namespace dflash::model
