// qwen_config: parsing a Hugging Face Qwen3 config.json and the errors for what it does not support.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/model/qwen_config.h"

using namespace dflash;
using namespace dflash::model;

namespace {

// Qwen3-8B's config.json (the keys that matter, as published)
nlohmann::json qwen3_8b() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

std::string error_of(const nlohmann::json& j) {
  try {
    parse_qwen_config(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("qwen_config: parses Qwen3-8B") {
  const QwenConfig c = parse_qwen_config(qwen3_8b(), "cfg.json");
  CHECK(c.hidden == 4096);
  CHECK(c.layers == 36);
  CHECK(c.heads == 32);
  CHECK(c.kv_heads == 8);
  CHECK(c.q_per_kv() == 4);
  CHECK(c.head_dim == 128);
  CHECK(c.intermediate == 12288);
  CHECK(c.vocab == 151936);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK(c.rope_theta == 1e6);
  CHECK(c.tie_word_embeddings == false);
  CHECK(c.max_position_embeddings == 40960);
  // what we write parses back to the same shape
  const QwenConfig d = parse_qwen_config(qwen_config_json(c), "written");
  CHECK(d.hidden == c.hidden);
  CHECK(d.kv_heads == c.kv_heads);
  CHECK(d.rope_theta == c.rope_theta);
}

TEST_CASE("qwen_config: rope_theta inside rope_parameters (transformers 5) and tie default") {
  auto j = qwen3_8b();
  j.erase("rope_theta");
  j.erase("tie_word_embeddings");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}};
  const QwenConfig c = parse_qwen_config(j, "cfg.json");
  CHECK(c.rope_theta == 5e6);
  CHECK(c.tie_word_embeddings == false);
}

TEST_CASE("qwen_config: unsupported architectures and bad keys are clear errors") {
  auto j = qwen3_8b();
  j["architectures"] = {"Qwen2MoeForCausalLM"};
  CHECK(error_of(j).find("cfg.json: unsupported architecture 'Qwen2MoeForCausalLM'") != std::string::npos);
  j = qwen3_8b();
  j.erase("architectures");
  CHECK(error_of(j).find("missing key 'architectures'") != std::string::npos);
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                          "head_dim", "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta"}) {
    j = qwen3_8b();
    j.erase(key);
    CHECK_MESSAGE(error_of(j).find(std::string("cfg.json: missing key '") + key + "'") != std::string::npos, key);
  }
  j = qwen3_8b();
  j["hidden_size"] = "4096";
  CHECK(error_of(j).find("'hidden_size' must be an integer") != std::string::npos);
  j = qwen3_8b();
  j["num_key_value_heads"] = 5;
  CHECK(error_of(j).find("num_attention_heads 32 is not a multiple of num_key_value_heads 5") != std::string::npos);
  j = qwen3_8b();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK(error_of(j).find("rope_scaling") != std::string::npos);
  j = qwen3_8b();
  j["attention_bias"] = true;
  CHECK(error_of(j).find("attention_bias") != std::string::npos);
  CHECK_THROWS_WITH_AS(load_qwen_config("/nonexistent/dir/config.json"), doctest::Contains("cannot read"), Error);
}
