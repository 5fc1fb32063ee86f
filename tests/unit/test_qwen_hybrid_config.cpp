// qwen_config for the Qwen3.5 / Qwen3.6 hybrids: the released ConditionalGeneration layout (text_config, weight
// prefix), the text-only causal LM, transformers-5 rope_parameters, and refusing rope types it does not implement.
#include <doctest/doctest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/model/qwen_config.h"

using namespace dflash;
using namespace dflash::model;

namespace {

// the text part of the Qwen3.6-27B config.json, with the published shapes
nlohmann::json text_27b() {
  nlohmann::json t = nlohmann::json::parse(R"({
    "attention_bias": false, "attention_dropout": 0.0, "full_attention_interval": 4, "head_dim": 256,
    "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 17408, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
    "linear_value_head_dim": 128, "max_position_embeddings": 262144, "model_type": "qwen3_5_text",
    "num_attention_heads": 24, "num_hidden_layers": 64, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "vocab_size": 248320, "mtp_num_hidden_layers": 1,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25}})");
  return t;
}

nlohmann::json conditional_27b() {
  return {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"},
          {"tie_word_embeddings", false}, {"text_config", text_27b()},
          {"vision_config", {{"depth", 27}, {"hidden_size", 1152}}}};
}

// tests/golden_hybrid/<name>, found from this file's path (CMake compiles it with an absolute path)
std::string golden_dir(const char* name) {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "golden_hybrid" / name).string();
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

TEST_CASE("qwen_config: Qwen3.6-27B ConditionalGeneration layout") {
  const QwenConfig c = parse_qwen_config(conditional_27b(), "cfg.json");
  CHECK(c.hybrid);
  CHECK(c.weight_prefix == "model.language_model.");
  CHECK(c.hidden == 5120);
  CHECK(c.layers == 64);
  CHECK(c.heads == 24);
  CHECK(c.kv_heads == 4);
  CHECK(c.head_dim == 256);
  CHECK(c.rotary_dim == 64);
  CHECK(c.rope_theta == 1e7);
  CHECK(c.linear_k_heads == 16);
  CHECK(c.linear_v_heads == 48);
  CHECK(c.v_per_k() == 3);
  CHECK(c.linear_conv_dim() == 2 * 16 * 128 + 48 * 128);
  CHECK(c.conv_kernel == 4);
  int full = 0;
  for (int l = 0; l < c.layers; ++l) full += !c.is_linear(l);
  CHECK(full == 16);
  CHECK(!c.is_linear(3));
  CHECK(c.is_linear(0));
  CHECK(!c.is_linear(63));
}

TEST_CASE("qwen_config: text-only Qwen3_5ForCausalLM, explicit layer_types, written config parses back") {
  nlohmann::json j = text_27b();
  j["architectures"] = {"Qwen3_5ForCausalLM"};
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"full_attention", "linear_attention", "linear_attention"};
  j["rope_parameters"].erase("partial_rotary_factor");  // Qwen3.5 defaults it to 0.25
  const QwenConfig c = parse_qwen_config(j, "cfg.json");
  CHECK(c.weight_prefix == "model.");
  CHECK(c.rotary_dim == 64);
  CHECK(!c.is_linear(0));
  CHECK(c.is_linear(2));
  const QwenConfig d = parse_qwen_config(qwen_config_json(c), "written");
  CHECK(d.hybrid);
  CHECK(d.layer_types == c.layer_types);
  CHECK(d.rotary_dim == c.rotary_dim);
  CHECK(d.linear_v_heads == c.linear_v_heads);
  CHECK(d.linear_v_dim == c.linear_v_dim);
  CHECK(d.rope_theta == c.rope_theta);
}

TEST_CASE("qwen_config: rope types other than default are refused, dense and hybrid") {
  nlohmann::json dense = nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288,
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "vocab_size": 151936,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000, "factor": 4.0}})");
  CHECK(error_of(dense).find("cfg.json: rope_parameters.rope_type \"yarn\" is not supported") != std::string::npos);
  dense["rope_parameters"]["rope_type"] = "linear";
  CHECK(error_of(dense).find("rope_type \"linear\" is not supported") != std::string::npos);
  dense["rope_parameters"] = {{"type", "dynamic"}, {"rope_theta", 1e6}};
  CHECK(error_of(dense).find("rope_parameters.type \"dynamic\" is not supported") != std::string::npos);
  dense["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  CHECK(parse_qwen_config(dense, "cfg.json").rotary_dim == 128);

  auto hy = conditional_27b();
  hy["text_config"]["rope_parameters"]["rope_type"] = "yarn";
  CHECK(error_of(hy).find("cfg.json text_config: rope_parameters.rope_type \"yarn\" is not supported") !=
        std::string::npos);
}

TEST_CASE("qwen_config: hybrid configs with missing or wrong keys are clear errors") {
  auto j = conditional_27b();
  j.erase("text_config");
  CHECK(error_of(j).find("missing key 'text_config'") != std::string::npos);
  for (const char* key : {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                          "linear_value_head_dim", "linear_conv_kernel_dim", "head_dim"}) {
    j = conditional_27b();
    j["text_config"].erase(key);
    CHECK_MESSAGE(error_of(j).find(std::string("cfg.json text_config: missing key '") + key + "'") !=
                      std::string::npos,
                  key);
  }
  j = conditional_27b();
  j["text_config"]["linear_num_value_heads"] = 20;
  CHECK(error_of(j).find("linear_num_value_heads 20 is not a multiple of linear_num_key_heads 16") !=
        std::string::npos);
  j = conditional_27b();
  j["text_config"]["layer_types"] = {"full_attention"};
  CHECK(error_of(j).find("layer_types must be a list of num_hidden_layers = 64 entries") != std::string::npos);
  j = conditional_27b();
  j["text_config"]["num_hidden_layers"] = 2;
  j["text_config"]["layer_types"] = {"full_attention", "sliding_attention"};
  CHECK(error_of(j).find("layer_types[1] = \"sliding_attention\" is not supported") != std::string::npos);
  j = conditional_27b();
  // the MoE form of the architecture needs its expert keys (a dense text_config has none)
  j["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
  CHECK(error_of(j).find("missing key 'num_experts'") != std::string::npos);
}

TEST_CASE("qwen_config: the committed transformers fixtures parse") {
  const QwenConfig a = load_qwen_config(golden_dir("causal_lm"));
  CHECK(a.weight_prefix == "model.");
  CHECK(a.layers == 4);
  CHECK(a.rotary_dim == 4);
  CHECK(!a.is_linear(3));
  const QwenConfig b = load_qwen_config(golden_dir("conditional"));
  CHECK(b.weight_prefix == "model.language_model.");
  CHECK(b.layers == 6);
  CHECK(!b.is_linear(1));
  CHECK(b.linear_k_dim == 8);
  CHECK(b.linear_v_dim == 16);
}
