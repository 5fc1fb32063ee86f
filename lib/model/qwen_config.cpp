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

namespace {

// rope_theta (top level, transformers 4) or rope_parameters.rope_theta (transformers 5); a rope type other than
// the plain one (linear, yarn, dynamic, ...) is refused: this forward would silently compute something else.
void parse_rope(const nlohmann::json& j, const std::string& src, QwenConfig& c, double default_partial) {
  double partial = default_partial;
  if (j.contains("partial_rotary_factor")) partial = get_real(j, "partial_rotary_factor", src);
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const auto& rp = j["rope_parameters"];
    const std::string rsrc = src + " rope_parameters";
    DFLASH_USER_CHECK(rp.is_object(), "{}: key 'rope_parameters' must be an object, got {}", src, rp.dump());
    for (const char* type_key : {"rope_type", "type"}) {
      if (!rp.contains(type_key)) continue;
      DFLASH_USER_CHECK(rp[type_key] == "default",
                        "{}: rope_parameters.{} {} is not supported (plain RoPE only: 'default'); this target would "
                        "compute different positions than the model was trained with",
                        src, type_key, rp[type_key].dump());
    }
    if (rp.contains("partial_rotary_factor")) partial = get_real(rp, "partial_rotary_factor", rsrc);
    if (!j.contains("rope_theta")) c.rope_theta = get_real(rp, "rope_theta", rsrc);
  }
  if (j.contains("rope_theta")) c.rope_theta = get_real(j, "rope_theta", src);
  DFLASH_USER_CHECK(j.contains("rope_theta") || (j.contains("rope_parameters") && j["rope_parameters"].is_object()),
                    "{}: missing key 'rope_theta'", src);
  DFLASH_USER_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(),
                    "{}: rope_scaling {} is not supported (plain RoPE only)", src,
                    j.contains("rope_scaling") ? j["rope_scaling"].dump() : "");
  DFLASH_USER_CHECK(partial > 0 && partial <= 1, "{}: partial_rotary_factor {} must be in (0, 1]", src, partial);
  c.rotary_dim = int(c.head_dim * partial);
  DFLASH_USER_CHECK(c.rotary_dim >= 2 && c.rotary_dim % 2 == 0,
                    "{}: head_dim {} × partial_rotary_factor {} = {} rotary dims: must be even and ≥ 2", src,
                    c.head_dim, partial, c.rotary_dim);
}

// The Qwen3.5 text config: layer_types (or full_attention_interval) and the Gated DeltaNet shape.
void parse_hybrid(const nlohmann::json& t, const std::string& src, QwenConfig& c) {
  c.linear_k_heads = get_int(t, "linear_num_key_heads", src);
  c.linear_v_heads = get_int(t, "linear_num_value_heads", src);
  c.linear_k_dim = get_int(t, "linear_key_head_dim", src);
  c.linear_v_dim = get_int(t, "linear_value_head_dim", src);
  c.conv_kernel = get_int(t, "linear_conv_kernel_dim", src);
  DFLASH_USER_CHECK(c.linear_v_heads % c.linear_k_heads == 0,
                    "{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", src, c.linear_v_heads,
                    c.linear_k_heads);
  c.layer_types.clear();
  if (t.contains("layer_types") && !t["layer_types"].is_null()) {
    const auto& lt = t["layer_types"];
    DFLASH_USER_CHECK(lt.is_array() && int(lt.size()) == c.layers,
                      "{}: layer_types must be a list of num_hidden_layers = {} entries, got {}", src, c.layers,
                      lt.dump());
    for (size_t l = 0; l < lt.size(); ++l) {
      DFLASH_USER_CHECK(lt[l] == "linear_attention" || lt[l] == "full_attention",
                        "{}: layer_types[{}] = {} is not supported (linear_attention or full_attention)", src, l,
                        lt[l].dump());
      c.layer_types.push_back(lt[l] == "linear_attention" ? LayerType::linear_attention : LayerType::full_attention);
    }
  } else {
    const int interval = t.contains("full_attention_interval") ? get_int(t, "full_attention_interval", src) : 4;
    for (int l = 0; l < c.layers; ++l)
      c.layer_types.push_back((l + 1) % interval ? LayerType::linear_attention : LayerType::full_attention);
  }
  if (t.contains("hidden_act")) {
    DFLASH_USER_CHECK(t["hidden_act"] == "silu", "{}: hidden_act {} is not supported (silu only)", src,
                      t["hidden_act"].dump());
  }
  // MoE variants (Qwen3.5-MoE) carry experts instead of one MLP
  DFLASH_USER_CHECK(!t.contains("num_experts") || t["num_experts"].is_null() || t["num_experts"] == 0,
                    "{}: mixture-of-experts models (num_experts {}) are not supported", src,
                    t.contains("num_experts") ? t["num_experts"].dump() : "");
}

}  // namespace

QwenConfig parse_qwen_config(const nlohmann::json& j, const std::string& src) {
  DFLASH_USER_CHECK(j.is_object(), "{}: not a JSON object", src);
  DFLASH_USER_CHECK(j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty(),
               "{}: missing key 'architectures' (expected [\"Qwen3ForCausalLM\"])", src);
  const auto arch = j["architectures"][0].is_string() ? j["architectures"][0].get<std::string>() : "";
  const bool dense = arch == "Qwen3ForCausalLM", causal35 = arch == "Qwen3_5ForCausalLM",
             cond35 = arch == "Qwen3_5ForConditionalGeneration";
  DFLASH_USER_CHECK(dense || causal35 || cond35,
               "{}: unsupported architecture '{}': this target supports Qwen3ForCausalLM (dense Qwen3), "
               "Qwen3_5ForCausalLM and Qwen3_5ForConditionalGeneration (Qwen3.5 / Qwen3.6 hybrids)",
               src, arch.empty() ? j["architectures"].dump() : arch);

  QwenConfig c;
  c.architecture = arch;
  c.hybrid = !dense;
  // the ConditionalGeneration layout nests the text model; its weights live under model.language_model.
  std::string tsrc = src;
  const nlohmann::json* tp = &j;
  if (cond35) {
    DFLASH_USER_CHECK(j.contains("text_config") && j["text_config"].is_object(),
                      "{}: missing key 'text_config' (Qwen3_5ForConditionalGeneration keeps the text model there)",
                      src);
    tp = &j["text_config"];
    tsrc = src + " text_config";
    c.weight_prefix = "model.language_model.";
  }
  const nlohmann::json& t = *tp;
  c.hidden = get_int(t, "hidden_size", tsrc);
  c.layers = get_int(t, "num_hidden_layers", tsrc);
  c.heads = get_int(t, "num_attention_heads", tsrc);
  c.kv_heads = get_int(t, "num_key_value_heads", tsrc);
  c.head_dim = get_int(t, "head_dim", tsrc);
  c.intermediate = get_int(t, "intermediate_size", tsrc);
  c.vocab = get_int(t, "vocab_size", tsrc);
  c.rms_norm_eps = get_real(t, "rms_norm_eps", tsrc);
  // Qwen3.5's text config defaults partial_rotary_factor to 0.25 when the file does not say it
  parse_rope(t, tsrc, c, c.hybrid ? 0.25 : 1.0);
  for (const nlohmann::json* o : {&t, &j}) {  // the outer config's value wins (HF reads it there for VLMs)
    if (!o->contains("tie_word_embeddings")) continue;
    DFLASH_USER_CHECK((*o)["tie_word_embeddings"].is_boolean(), "{}: key 'tie_word_embeddings' must be true or false",
                      src);
    c.tie_word_embeddings = (*o)["tie_word_embeddings"].get<bool>();
  }
  if (t.contains("max_position_embeddings")) c.max_position_embeddings = get_int(t, "max_position_embeddings", tsrc);

  // Features of the family this forward does not implement: refuse rather than compute something else.
  DFLASH_USER_CHECK(!flag_is_set(t, "attention_bias"), "{}: attention_bias = true is not supported", tsrc);
  DFLASH_USER_CHECK(!flag_is_set(t, "use_sliding_window"), "{}: use_sliding_window = true is not supported", tsrc);
  if (t.contains("hidden_act")) {
    DFLASH_USER_CHECK(t["hidden_act"] == "silu", "{}: hidden_act {} is not supported (silu only)", tsrc,
                 t["hidden_act"].dump());
  }
  if (c.hybrid) {
    parse_hybrid(t, tsrc, c);
  } else {
    c.layer_types.assign(size_t(c.layers), LayerType::full_attention);
  }

  DFLASH_USER_CHECK(c.heads % c.kv_heads == 0,
               "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", tsrc, c.heads, c.kv_heads);
  DFLASH_USER_CHECK(c.head_dim % 2 == 0, "{}: head_dim {} must be even for RoPE", tsrc, c.head_dim);
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
  nlohmann::json j = {{"architectures", {c.hybrid ? "Qwen3_5ForCausalLM" : "Qwen3ForCausalLM"}},
                      {"model_type", c.hybrid ? "qwen3_5_text" : "qwen3"},
                      {"hidden_size", c.hidden},
                      {"num_hidden_layers", c.layers},
                      {"num_attention_heads", c.heads},
                      {"num_key_value_heads", c.kv_heads},
                      {"head_dim", c.head_dim},
                      {"intermediate_size", c.intermediate},
                      {"vocab_size", c.vocab},
                      {"rms_norm_eps", c.rms_norm_eps},
                      {"tie_word_embeddings", c.tie_word_embeddings},
                      {"max_position_embeddings", c.max_position_embeddings > 0 ? c.max_position_embeddings : 40960},
                      {"hidden_act", "silu"},
                      {"attention_bias", false},
                      {"attention_dropout", 0.0},
                      {"torch_dtype", "float32"}};
  if (!c.hybrid) {
    j["rope_theta"] = c.rope_theta;
    j["use_sliding_window"] = false;
    j["rope_scaling"] = nullptr;
    return j;
  }
  const int rot = c.rotary_dim > 0 ? c.rotary_dim : c.head_dim / 4;
  j["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", c.rope_theta},
                          {"partial_rotary_factor", double(rot) / c.head_dim}};
  nlohmann::json types = nlohmann::json::array();
  for (LayerType t : c.layer_types) types.push_back(t == LayerType::linear_attention ? "linear_attention" : "full_attention");
  j["layer_types"] = types;
  j["linear_num_key_heads"] = c.linear_k_heads;
  j["linear_num_value_heads"] = c.linear_v_heads;
  j["linear_key_head_dim"] = c.linear_k_dim;
  j["linear_value_head_dim"] = c.linear_v_dim;
  j["linear_conv_kernel_dim"] = c.conv_kernel;
  return j;
}

}  // namespace dflash::model
