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
void parse_hybrid(const nlohmann::json& t, const std::string& src, QwenConfig& c, bool moe) {
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
  // the dense architectures carry one MLP: experts there mean a config of another architecture
  DFLASH_USER_CHECK(moe || !t.contains("num_experts") || t["num_experts"].is_null() || t["num_experts"] == 0,
                    "{}: num_experts {} in a dense Qwen3_5 architecture; a MoE hybrid names "
                    "Qwen3_5MoeForConditionalGeneration or Qwen3_5MoeForCausalLM", src,
                    t.contains("num_experts") ? t["num_experts"].dump() : "");
}

// The Qwen3-MoE keys (transformers' Qwen3MoeConfig and Qwen3MoeDecoderLayer): layer l has routed experts when it is
// not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0, else the dense MLP of intermediate_size.
// hybrid: the Qwen3.5/3.6 MoE keys (Qwen3_5MoeTextConfig, Qwen3_5MoeSparseMoeBlock): every layer has experts and
// a shared expert of shared_expert_intermediate_size; the router always renormalises its top k.
void parse_moe(const nlohmann::json& t, const std::string& src, QwenConfig& c, bool hybrid) {
  // the published configs say num_experts; transformers 5 writes it as num_local_experts (its attribute_map)
  const bool local = t.contains("num_local_experts") && !t["num_local_experts"].is_null();
  c.experts = get_int(t, local && !t.contains("num_experts") ? "num_local_experts" : "num_experts", src);
  DFLASH_USER_CHECK(!local || !t.contains("num_experts") || get_int(t, "num_local_experts", src) == c.experts,
                    "{}: num_experts {} and num_local_experts {} disagree", src, c.experts,
                    local ? t["num_local_experts"].dump() : "");
  c.experts_per_token = get_int(t, "num_experts_per_tok", src);
  c.moe_intermediate = get_int(t, "moe_intermediate_size", src);
  DFLASH_USER_CHECK(c.experts_per_token <= c.experts, "{}: num_experts_per_tok {} exceeds num_experts {}", src,
                    c.experts_per_token, c.experts);
  c.norm_topk_prob = hybrid;  // Qwen3MoeConfig's default false; Qwen3_5MoeTopKRouter always renormalises
  if (hybrid) {
    c.shared_expert_intermediate = get_int(t, "shared_expert_intermediate_size", src);
    // transformers' Qwen3.5 MoE layer reads none of these: a config that sets them asks for something else
    DFLASH_USER_CHECK(!t.contains("norm_topk_prob") || t["norm_topk_prob"].is_null() || t["norm_topk_prob"] == true,
                      "{}: norm_topk_prob {} is not supported (the Qwen3.5/3.6 MoE router always renormalises)", src,
                      t.contains("norm_topk_prob") ? t["norm_topk_prob"].dump() : "");
    DFLASH_USER_CHECK(!t.contains("mlp_only_layers") || t["mlp_only_layers"].is_null() ||
                          t["mlp_only_layers"].empty(),
                      "{}: mlp_only_layers is not supported for a Qwen3.5/3.6 MoE (every layer has experts)", src);
    DFLASH_USER_CHECK(!t.contains("decoder_sparse_step") || t["decoder_sparse_step"] == 1,
                      "{}: decoder_sparse_step is not supported for a Qwen3.5/3.6 MoE (every layer has experts)", src);
    c.moe_layers.assign(size_t(c.layers), true);
    return;
  }
  if (t.contains("norm_topk_prob") && !t["norm_topk_prob"].is_null()) {
    DFLASH_USER_CHECK(t["norm_topk_prob"].is_boolean(), "{}: key 'norm_topk_prob' must be true or false, got {}", src,
                      t["norm_topk_prob"].dump());
    c.norm_topk_prob = t["norm_topk_prob"].get<bool>();
  }
  const int step = t.contains("decoder_sparse_step") ? get_int(t, "decoder_sparse_step", src) : 1;
  std::vector<bool> dense(size_t(c.layers), false);
  if (t.contains("mlp_only_layers") && !t["mlp_only_layers"].is_null()) {
    const auto& m = t["mlp_only_layers"];
    DFLASH_USER_CHECK(m.is_array(), "{}: key 'mlp_only_layers' must be a list of layer indices, got {}", src, m.dump());
    for (const auto& v : m) {
      DFLASH_USER_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.layers,
                        "{}: mlp_only_layers entry {} is not a layer index in [0, {})", src, v.dump(), c.layers);
      dense[size_t(v.get<int64_t>())] = true;
    }
  }
  c.moe_layers.assign(size_t(c.layers), false);
  for (int l = 0; l < c.layers; ++l) c.moe_layers[size_t(l)] = !dense[size_t(l)] && (l + 1) % step == 0;
  // what this forward does not implement: a shared expert (Qwen2-MoE's; Qwen3.5/3.6 MoE are not accepted yet)
  for (const char* key : {"shared_expert_intermediate_size"}) {
    DFLASH_USER_CHECK(!t.contains(key) || t[key].is_null() || t[key] == 0,
                      "{}: {} {} is not supported (a shared expert; Qwen3-MoE has none)", src, key, t[key].dump());
  }
}

}  // namespace

bool QwenConfig::any_dense_mlp() const {
  for (int l = 0; l < layers; ++l)
    if (!is_moe(l)) return true;
  return false;
}

QwenConfig parse_qwen_config(const nlohmann::json& j, const std::string& src) {
  DFLASH_USER_CHECK(j.is_object(), "{}: not a JSON object", src);
  DFLASH_USER_CHECK(j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty(),
               "{}: missing key 'architectures' (expected [\"Qwen3ForCausalLM\"])", src);
  const auto arch = j["architectures"][0].is_string() ? j["architectures"][0].get<std::string>() : "";
  const bool moe35 = arch == "Qwen3_5MoeForCausalLM" || arch == "Qwen3_5MoeForConditionalGeneration";
  const bool qwen3 = arch == "Qwen3ForCausalLM", moe = arch == "Qwen3MoeForCausalLM" || moe35,
             causal35 = arch == "Qwen3_5ForCausalLM" || arch == "Qwen3_5MoeForCausalLM",
             cond35 = arch == "Qwen3_5ForConditionalGeneration" || arch == "Qwen3_5MoeForConditionalGeneration";
  DFLASH_USER_CHECK(qwen3 || moe || causal35 || cond35,
               "{}: unsupported architecture '{}': this target supports Qwen3ForCausalLM (dense Qwen3), "
               "Qwen3MoeForCausalLM (Qwen3-MoE), Qwen3_5ForCausalLM and Qwen3_5ForConditionalGeneration (Qwen3.5 / "
               "Qwen3.6 dense hybrids), Qwen3_5MoeForCausalLM and Qwen3_5MoeForConditionalGeneration (Qwen3.5 / "
               "Qwen3.6 MoE hybrids)",
               src, arch.empty() ? j["architectures"].dump() : arch);

  QwenConfig c;
  c.architecture = arch;
  c.hybrid = causal35 || cond35;
  // the ConditionalGeneration layout nests the text model; its weights live under model.language_model.
  std::string tsrc = src;
  const nlohmann::json* tp = &j;
  if (cond35) {
    DFLASH_USER_CHECK(j.contains("text_config") && j["text_config"].is_object(),
                      "{}: missing key 'text_config' ({} keeps the text model there)", src, arch);
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
  // a MoE model whose every layer has experts needs no intermediate_size (checked after parse_moe)
  if (!moe || t.contains("intermediate_size")) c.intermediate = get_int(t, "intermediate_size", tsrc);
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
    parse_hybrid(t, tsrc, c, moe);
  } else {
    c.layer_types.assign(size_t(c.layers), LayerType::full_attention);
  }
  if (moe) {
    parse_moe(t, tsrc, c, c.hybrid);
    DFLASH_USER_CHECK(c.intermediate > 0 || !c.any_dense_mlp(),
                      "{}: missing key 'intermediate_size' (the dense MLP of the layers without experts)", tsrc);
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
  const bool moe = c.experts > 0;
  const char* arch = c.hybrid ? (moe ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM")
                               : (moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM");
  const char* type = c.hybrid ? (moe ? "qwen3_5_moe_text" : "qwen3_5_text") : (moe ? "qwen3_moe" : "qwen3");
  nlohmann::json j = {{"architectures", {arch}},
                      {"model_type", type},
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
    if (moe) {
      DFLASH_CHECK(c.moe_layers.size() == size_t(c.layers), "qwen_config_json: moe_layers has {} entries for {} layers",
                   c.moe_layers.size(), c.layers);
      nlohmann::json dense = nlohmann::json::array();
      for (int l = 0; l < c.layers; ++l)
        if (!c.is_moe(l)) dense.push_back(l);
      j["num_experts"] = c.experts;
      j["num_experts_per_tok"] = c.experts_per_token;
      j["moe_intermediate_size"] = c.moe_intermediate;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = dense;
      j["router_aux_loss_coef"] = 0.001;
      j["output_router_logits"] = false;
    }
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
  if (moe) {
    j.erase("intermediate_size");  // every layer has experts: no dense MLP
    j["num_experts"] = c.experts;
    j["num_experts_per_tok"] = c.experts_per_token;
    j["moe_intermediate_size"] = c.moe_intermediate;
    j["shared_expert_intermediate_size"] = c.shared_expert_intermediate;
    j["router_aux_loss_coef"] = 0.001;
    j["output_router_logits"] = false;
  }
  return j;
}

}  // namespace dflash::model
