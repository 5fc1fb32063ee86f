#pragma once
// Drafter export (docs/export.md): `model.safetensors` + `config.json` in the DFlash naming that the DFlash reference
// and serving engines load, from weights in memory (a checkpoint exports through lib/state/checkpoint.h); and the
// loader that reads such a directory back (bf16 or fp32) for tests and tools.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/io/safetensors.h"
#include "lib/model/drafter_config.h"
#include "lib/model/drafter_params.h"

namespace dflash::model {

using io::DType;

// Facts about the target that config.json needs beyond the drafter's shape. The trainer records them in every
// checkpoint as state.extra["export"] = export_info_json(info), so a checkpoint exports on its own.
struct DrafterExportInfo {
  std::vector<int> target_layer_ids;  // [n_taps] tapped target decoder layers (0-based; output of layer l)
  int num_target_layers = 0;          // the target's num_hidden_layers
  int max_position_embeddings = 0;    // the target's max_position_embeddings
};

nlohmann::json export_info_json(const DrafterExportInfo& info);
// Reads {"target_layer_ids", "num_target_layers", "max_position_embeddings"}; `source` names the file in errors.
DrafterExportInfo parse_export_info(const nlohmann::json& j, const std::string& source);
// Throws naming the field unless ids has n_taps entries in [0, num_target_layers) and the sizes are positive.
void validate_export_info(const DrafterExportInfo& info, const DrafterConfig& cfg);

// The config.json object for this drafter (key order as written), with "auto_map" pointing transformers' AutoConfig /
// AutoModel at the modeling_dflash.py the export writes beside it.
nlohmann::ordered_json drafter_config_json(const DrafterConfig& cfg, const DrafterExportInfo& info, DType dtype);

// The files an export writes into its folder, in the order written (config.json last: a folder with a config.json
// has its complete weights and code).
constexpr const char* kExportModelingFile = "modeling_dflash.py";
constexpr const char* kExportWeightsFile = "model.safetensors";
constexpr const char* kExportConfigFile = "config.json";
// lib/model/modeling_dflash.py, embedded at build time: the PyTorch drafter (DFlashConfig, DFlashDraftModel) that
// AutoModel.from_pretrained(dir, trust_remote_code=True) loads; it computes what drafter_forward computes.
std::string_view modeling_dflash_py();

// Refuses (a user error naming the folder and what it holds) an out_dir that exists and holds anything but a previous
// export: only the three files above (and their *.partial temporaries) may be there, config.json one this export
// writes (architectures DFlashDraftModel, no key of its own), modeling_dflash.py ours, model.safetensors beside one
// of them. An export never deletes or overwrites a file it did not write. A missing or empty out_dir passes.
void check_export_out_dir(const std::string& out_dir);

// Refuses weights with a NaN or an infinity, naming `source`, the tensor and the first bad index: a diverged drafter
// is neither exported nor evaluated (its proposals would be garbage, not a measurement).
void require_finite_weights(const DrafterConfig& cfg, const DrafterParams<float>& params, const std::string& source);

// Writes out_dir/modeling_dflash.py, out_dir/model.safetensors (dtype F32 or BF16, bf16 rounded to nearest even)
// and out_dir/config.json, each through a temporary name and a rename; creates out_dir. check_export_out_dir first.
void export_drafter(const DrafterConfig& cfg, const DrafterParams<float>& params, const DrafterExportInfo& info,
                    const std::string& out_dir, DType dtype);

struct ExportedDrafter {
  DrafterConfig config;
  DrafterParams<float> params;  // widened to fp32 (exact for bf16)
  DrafterExportInfo info;
  DType dtype = DType::F32;     // dtype of the stored tensors
};

// Reads an exported directory back: config.json (architecture, keys) and every tensor by name and shape.
ExportedDrafter load_exported_drafter(const std::string& dir);

}  // namespace dflash::model
