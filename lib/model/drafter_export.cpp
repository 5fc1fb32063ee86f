#include "lib/model/drafter_export.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/core/json_field.h"

namespace dflash::model {

using io::dtype_name;
using io::SafetensorsFile;
using io::tensor_from;
using io::TensorInfo;
using io::TensorToWrite;
using io::write_safetensors;

namespace fs = std::filesystem;

namespace {

constexpr const char* kFull = "full_attention";
constexpr const char* kSliding = "sliding_attention";

}  // namespace

nlohmann::json export_info_json(const DrafterExportInfo& info) {
  return {{"target_layer_ids", info.target_layer_ids},
          {"num_target_layers", info.num_target_layers},
          {"max_position_embeddings", info.max_position_embeddings}};
}

DrafterExportInfo parse_export_info(const nlohmann::json& j, const std::string& source) {
  DrafterExportInfo info;
  info.target_layer_ids = json_field<std::vector<int>>(j, "target_layer_ids", source);
  info.num_target_layers = json_field<int>(j, "num_target_layers", source);
  info.max_position_embeddings = json_field<int>(j, "max_position_embeddings", source);
  return info;
}

void validate_export_info(const DrafterExportInfo& info, const DrafterConfig& cfg) {
  DFLASH_USER_CHECK(info.num_target_layers > 0,
               "export: num_target_layers must be positive, got {} (the target's num_hidden_layers; "
               "dflash_data export takes --num-target-layers)",
               info.num_target_layers);
  DFLASH_USER_CHECK(info.max_position_embeddings > 0,
               "export: max_position_embeddings must be positive, got {} (the target's max_position_embeddings; "
               "dflash_data export takes --max-position-embeddings)",
               info.max_position_embeddings);
  DFLASH_USER_CHECK(int(info.target_layer_ids.size()) == cfg.n_taps,
               "export: {} target_layer_ids [{}] for a drafter with n_taps={} (give one tapped layer per tap)",
               info.target_layer_ids.size(), fmt::join(info.target_layer_ids, ", "), cfg.n_taps);
  for (int id : info.target_layer_ids)
    DFLASH_USER_CHECK(id >= 0 && id < info.num_target_layers,
                 "export: target_layer_ids [{}] has {}, outside the target's layers [0, {})",
                 fmt::join(info.target_layer_ids, ", "), id, info.num_target_layers);
}

nlohmann::ordered_json drafter_config_json(const DrafterConfig& cfg, const DrafterExportInfo& info, DType dtype) {
  cfg.validate();
  validate_export_info(info, cfg);
  // Qwen3 configs carry one sliding_window for every "sliding_attention" layer.
  int window = 0;
  std::vector<std::string> layer_types;
  for (int l = 0; l < cfg.layers; ++l) {
    const int w = cfg.window.empty() ? 0 : cfg.window[size_t(l)];
    layer_types.push_back(w > 0 ? kSliding : kFull);
    if (w == 0) continue;
    DFLASH_USER_CHECK(window == 0 || window == w,
                 "export: sliding layers have windows {} and {}; config.json holds one sliding_window for all",
                 window, w);
    window = w;
  }
  nlohmann::ordered_json j;
  j["architectures"] = {"DFlashDraftModel"};
  j["model_type"] = "qwen3";
  j["hidden_size"] = cfg.hidden;
  j["intermediate_size"] = cfg.intermediate;
  j["num_attention_heads"] = cfg.heads;
  j["num_key_value_heads"] = cfg.kv_heads;
  j["head_dim"] = cfg.head_dim;
  j["num_hidden_layers"] = cfg.layers;
  j["rms_norm_eps"] = cfg.rms_eps;
  j["rope_theta"] = cfg.rope_theta;
  j["vocab_size"] = cfg.vocab;
  j["max_position_embeddings"] = info.max_position_embeddings;
  j["tie_word_embeddings"] = false;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["use_sliding_window"] = window > 0;  // Qwen3Config drops sliding_window unless this is true
  j["sliding_window"] = window > 0 ? nlohmann::ordered_json(window) : nlohmann::ordered_json(nullptr);
  j["layer_types"] = layer_types;
  j["block_size"] = cfg.block_size;
  j["num_target_layers"] = info.num_target_layers;
  j["dflash_config"] = {{"mask_token_id", cfg.mask_token_id}, {"target_layer_ids", info.target_layer_ids}};
  j["torch_dtype"] = dtype == DType::BF16 ? "bfloat16" : "float32";
  return j;
}

void require_finite_weights(const DrafterConfig& cfg, const DrafterParams<float>& params, const std::string& source) {
  for (const ParamInfo& p : drafter_param_layout(cfg)) {
    const float* w = params.flat.data() + p.offset;
    for (size_t i = 0; i < p.numel; ++i)
      DFLASH_USER_CHECK(std::isfinite(w[i]),
                        "{}: tensor {} has {} at flat index {} (of {}): the weights diverged; use an earlier "
                        "checkpoint (ckpt/step_*) or ckpt/best", source, p.name, w[i], i, p.numel);
  }
}

void export_drafter(const DrafterConfig& cfg, const DrafterParams<float>& params, const DrafterExportInfo& info,
                    const std::string& out_dir, DType dtype) {
  require_finite_weights(cfg, params, "export");
  DFLASH_USER_CHECK(dtype == DType::F32 || dtype == DType::BF16, "export: dtype must be F32 or BF16, got {}",
               dtype_name(dtype));
  const nlohmann::ordered_json config = drafter_config_json(cfg, info, dtype);
  const std::vector<ParamInfo> layout = drafter_param_layout(cfg);
  DFLASH_CHECK(params.flat.size() == param_count(layout), "export: {} parameters, the drafter shape has {}",
               params.flat.size(), param_count(layout));
  const fs::path dir(out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  DFLASH_USER_CHECK(!ec, "export: cannot create {}: {}", out_dir, ec.message());
  std::vector<TensorToWrite> tensors;
  for (const auto& p : layout) tensors.push_back(tensor_from(p.name, dtype, p.shape, params.flat.data() + p.offset));
  // weights first, config.json last: a directory with a config.json always has its complete weights
  AtomicOutput model((dir / "model.safetensors").string());
  write_safetensors(model.partial(), tensors, {{"format", "pt"}});
  model.commit();
  write_file_atomic((dir / "config.json").string(), config.dump(2) + "\n");
}

ExportedDrafter load_exported_drafter(const std::string& dir) {
  const fs::path cfg_path = fs::path(dir) / "config.json";
  const std::string src = cfg_path.string();
  std::ifstream f(cfg_path);
  DFLASH_USER_CHECK(f, "{}: cannot read (an exported drafter directory holds config.json and model.safetensors)", src);
  nlohmann::json j;
  try {
    std::stringstream ss;
    ss << f.rdbuf();
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    DFLASH_USER_CHECK(false, "{}: not valid JSON ({})", src, e.what());
  }
  const auto archs = json_field<std::vector<std::string>>(j, "architectures", src);
  DFLASH_USER_CHECK(archs.size() == 1 && archs[0] == "DFlashDraftModel",
               "{}: architectures is [{}], expected [\"DFlashDraftModel\"]", src, fmt::join(archs, ", "));
  DrafterConfig c;
  c.hidden = json_field<int>(j, "hidden_size", src);
  c.intermediate = json_field<int>(j, "intermediate_size", src);
  c.heads = json_field<int>(j, "num_attention_heads", src);
  c.kv_heads = json_field<int>(j, "num_key_value_heads", src);
  c.head_dim = json_field<int>(j, "head_dim", src);
  c.layers = json_field<int>(j, "num_hidden_layers", src);
  c.rms_eps = json_field<double>(j, "rms_norm_eps", src);
  c.rope_theta = json_field<double>(j, "rope_theta", src);
  c.vocab = json_field<int>(j, "vocab_size", src);
  c.block_size = json_field<int>(j, "block_size", src);
  DFLASH_USER_CHECK(j.contains("dflash_config"), "{}: missing key 'dflash_config'", src);
  const auto& dc = j.at("dflash_config");
  c.mask_token_id = json_field<int>(dc, "mask_token_id", src + " dflash_config");
  DrafterExportInfo info;
  info.target_layer_ids = json_field<std::vector<int>>(dc, "target_layer_ids", src + " dflash_config");
  info.num_target_layers = json_field<int>(j, "num_target_layers", src);
  info.max_position_embeddings = json_field<int>(j, "max_position_embeddings", src);
  c.n_taps = int(info.target_layer_ids.size());
  const bool any_sliding = j.value("use_sliding_window", false);
  if (j.contains("layer_types")) {
    const auto types = json_field<std::vector<std::string>>(j, "layer_types", src);
    DFLASH_USER_CHECK(int(types.size()) == c.layers, "{}: {} layer_types for num_hidden_layers={}", src, types.size(),
                 c.layers);
    for (const auto& t : types) {
      DFLASH_USER_CHECK(t == kFull || t == kSliding, "{}: layer_types has '{}', expected '{}' or '{}'", src, t, kFull,
                   kSliding);
      if (t == kFull) {
        c.window.push_back(0);
        continue;
      }
      DFLASH_USER_CHECK(any_sliding && j.contains("sliding_window") && j.at("sliding_window").is_number_integer(),
                   "{}: a sliding_attention layer needs use_sliding_window true and an integer sliding_window", src);
      c.window.push_back(j.at("sliding_window").get<int>());
    }
  }
  try {
    c.validate();
    validate_export_info(info, c);
  } catch (const Error& e) {
    DFLASH_USER_CHECK(false, "{}: {}", src, e.what());
  }

  ExportedDrafter out{c, DrafterParams<float>(c), info, DType::F32};
  SafetensorsFile st((fs::path(dir) / "model.safetensors").string());
  bool first = true;
  for (const auto& p : out.params.layout) {
    DFLASH_USER_CHECK(st.has(p.name), "{}: missing tensor '{}'", st.path(), p.name);
    const TensorInfo& t = st.info(p.name);
    DFLASH_USER_CHECK(t.shape == p.shape, "{}: tensor '{}' has shape {}, config.json implies {}", st.path(), p.name,
                 t.shape_str(), TensorInfo{"", DType::F32, p.shape}.shape_str());
    if (first) out.dtype = t.dtype;
    first = false;
    DFLASH_USER_CHECK(t.dtype == out.dtype, "{}: tensor '{}' is {}, the others are {}", st.path(), p.name,
                 dtype_name(t.dtype), dtype_name(out.dtype));
    st.read_rows(p.name, 0, t.rows(), out.params.flat.data() + p.offset);
  }
  DFLASH_USER_CHECK(st.names().size() == out.params.layout.size(), "{}: {} tensors, config.json implies {}", st.path(),
               st.names().size(), out.params.layout.size());
  return out;
}

}  // namespace dflash::model
