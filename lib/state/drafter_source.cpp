#include "lib/state/drafter_source.h"

#include <filesystem>

#include "lib/core/error.h"
#include "lib/state/checkpoint.h"

namespace dflash::state {

namespace fs = std::filesystem;

namespace {
bool is_export(const std::string& path) {
  return fs::exists(fs::path(path) / "config.json") && fs::exists(fs::path(path) / "model.safetensors");
}
}  // namespace

std::string drafter_source_dir(const std::string& path) {
  DFLASH_USER_CHECK(fs::is_directory(path),
                    "--drafter {}: not a directory (give a run folder, a checkpoint step_* folder or an exported "
                    "drafter folder)", path);
  if (is_export(path) || fs::exists(fs::path(path) / "state.json")) return path;
  const std::string step_dir = state::find_latest_checkpoint(path);
  DFLASH_USER_CHECK(!step_dir.empty(),
                    "--drafter {}: no config.json + model.safetensors (an exported drafter), no state.json (a "
                    "checkpoint step folder) and no complete checkpoint under {}/ckpt (a run folder)", path, path);
  return step_dir;
}

DrafterSource load_drafter_source(const std::string& path) {
  const std::string step_dir = drafter_source_dir(path);
  if (is_export(step_dir)) {
    model::ExportedDrafter d = model::load_exported_drafter(step_dir);
    model::require_finite_weights(d.config, d.params, (fs::path(step_dir) / "model.safetensors").string());
    return DrafterSource{"export", step_dir, -1, std::move(d), ""};
  }
  state::LoadedCheckpoint ck = state::read_checkpoint(step_dir, /*with_optimizer=*/false);
  const std::string source = (fs::path(step_dir) / "state.json").string() + " extra.export";
  DFLASH_USER_CHECK(ck.state.extra.is_object() && ck.state.extra.contains("export"),
                    "{}: missing (the checkpoint does not record its target_layer_ids); export it with "
                    "`dflash_data export --target-layer-ids ...` and evaluate the exported folder", source);
  const model::DrafterExportInfo info = model::parse_export_info(ck.state.extra.at("export"), source);
  model::validate_export_info(info, ck.drafter);
  model::require_finite_weights(ck.drafter, ck.params, (fs::path(step_dir) / "model.safetensors").string());
  return DrafterSource{"checkpoint", step_dir, ck.state.step,
                       model::ExportedDrafter{ck.drafter, std::move(ck.params), info, io::DType::F32},
                       ck.state.target};
}

}  // namespace dflash::state
