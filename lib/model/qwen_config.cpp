#include "lib/model/qwen_config.h"

#include <filesystem>
#include <fstream>

#include "lib/core/error.h"

namespace dflash::model {

namespace {

int get_int(const nlohmann::json& j, const char* key, const std::string& src) {
  DFLASH_USER_CHECK(j.contains(key), "{}: missing key '{}'", src, key);
  const auto& v = j[key];
  DFLASH_USER_CHECK(v.is_number_integer(), "{}: key '{}' must be an integer, got {}", src, key, v.dump());
  const int64_t x = v.get<int64_t>();
  DFLASH_USER_CHECK(x > 0 && x < (int64_t(1) << 31), "{}: key '{}' must be a positive int32, got {}", src, key, x);
  return int(x);
}

double get_real(const nlohmann::json& j, const char* key, const std::string& src) {
  DFLASH_USER_CHECK(j.contains(key), "{}: missing key '{}'", src, key);
  const auto& v = j[key];
  DFLASH_USER_CHECK(v.is_number(), "{}: key '{}' must be a number, got {}", src, key, v.dump());
  const double x = v.get<double>();
  DFLASH_USER_CHECK(x > 0, "{}: key '{}' must be positive, got {}", src, key, x);
  return x;
}

bool flag_is_set(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_boolean() && j[key].get<bool>();
}

}  // namespace

QwenConfig parse_qwen_config(const nlohmann::json& j, const std::string& src) {
  DFLASH_USER_CHECK(j.is_object(), "{}: not a JSON object", src);
  DFLASH_USER_CHECK(j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty(),
               "{}: missing key 'architectures' (expected [\"Qwen3ForCausalLM\"])", src);
  const auto arch = j["architectures"][0].is_string() ? j["architectures"][0].get<std::string>() : "";
  DFLASH_USER_CHECK(arch == "Qwen3ForCausalLM",
               "{}: unsupported architecture '{}': this target supports Qwen3ForCausalLM (dense Qwen3) only",
               src, arch.empty() ? j["architectures"].dump() : arch);

  QwenConfig c;
  c.hidden = get_int(j, "hidden_size", src);
  c.layers = get_int(j, "num_hidden_layers", src);
  c.heads = get_int(j, "num_attention_heads", src);
  c.kv_heads = get_int(j, "num_key_value_heads", src);
  c.head_dim = get_int(j, "head_dim", src);
  c.intermediate = get_int(j, "intermediate_size", src);
  c.vocab = get_int(j, "vocab_size", src);
  c.rms_norm_eps = get_real(j, "rms_norm_eps", src);
  // transformers ≥ 5 moves rope_theta into rope_parameters
  if (j.contains("rope_theta")) {
    c.rope_theta = get_real(j, "rope_theta", src);
  } else if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    c.rope_theta = get_real(j["rope_parameters"], "rope_theta", src + " rope_parameters");
  } else {
    DFLASH_USER_FAIL("{}: missing key 'rope_theta'", src);
  }
  if (j.contains("tie_word_embeddings")) {
    DFLASH_USER_CHECK(j["tie_word_embeddings"].is_boolean(), "{}: key 'tie_word_embeddings' must be true or false", src);
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  if (j.contains("max_position_embeddings")) c.max_position_embeddings = get_int(j, "max_position_embeddings", src);

  // Features of the Qwen3 family this forward does not implement: refuse rather than compute something else.
  DFLASH_USER_CHECK(!flag_is_set(j, "attention_bias"), "{}: attention_bias = true is not supported", src);
  DFLASH_USER_CHECK(!flag_is_set(j, "use_sliding_window"), "{}: use_sliding_window = true is not supported", src);
  DFLASH_USER_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(),
               "{}: rope_scaling {} is not supported (plain RoPE only)", src,
               j.contains("rope_scaling") ? j["rope_scaling"].dump() : "");
  if (j.contains("hidden_act")) {
    DFLASH_USER_CHECK(j["hidden_act"] == "silu", "{}: hidden_act {} is not supported (silu only)", src,
                 j["hidden_act"].dump());
  }

  DFLASH_USER_CHECK(c.heads % c.kv_heads == 0,
               "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", src, c.heads, c.kv_heads);
  DFLASH_USER_CHECK(c.head_dim % 2 == 0, "{}: head_dim {} must be even for RoPE", src, c.head_dim);
  return c;
}

QwenConfig load_qwen_config(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "config.json").string();
  std::ifstream in(file);
  DFLASH_USER_CHECK(in, "cannot read {} (a Hugging Face model directory needs config.json)", file);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    DFLASH_USER_FAIL("{}: not valid JSON: {}", file, e.what());
  }
  return parse_qwen_config(j, file);
}

nlohmann::json qwen_config_json(const QwenConfig& c) {
  return {{"architectures", {"Qwen3ForCausalLM"}},
          {"model_type", "qwen3"},
          {"hidden_size", c.hidden},
          {"num_hidden_layers", c.layers},
          {"num_attention_heads", c.heads},
          {"num_key_value_heads", c.kv_heads},
          {"head_dim", c.head_dim},
          {"intermediate_size", c.intermediate},
          {"vocab_size", c.vocab},
          {"rms_norm_eps", c.rms_norm_eps},
          {"rope_theta", c.rope_theta},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"max_position_embeddings", c.max_position_embeddings > 0 ? c.max_position_embeddings : 40960},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"use_sliding_window", false},
          {"rope_scaling", nullptr},
          {"torch_dtype", "float32"}};
}

}  // namespace dflash::model
