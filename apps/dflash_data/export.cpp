// dflash_data export STEP_DIR OUT_DIR [--dtype bf16|f32] [--target-layer-ids 1,9,17] [--num-target-layers N]
//   [--max-position-embeddings P]
// Writes the drafter of a checkpoint as model.safetensors + config.json in the DFlash naming (docs/export.md).
#include <cstdio>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/dflash_data/commands.h"
#include "lib/core/args.h"
#include "lib/core/error.h"
#include "lib/state/checkpoint.h"
#include "lib/model/drafter_export.h"

namespace dflash::data {

namespace {
constexpr const char* kUsage =
    "usage: dflash_data export STEP_DIR OUT_DIR [--dtype bf16|f32] [--target-layer-ids 1,9,17]\n"
    "                          [--num-target-layers N] [--max-position-embeddings P]\n"
    "  STEP_DIR  a complete checkpoint (out_dir/ckpt/step_XXXXXXXX with DONE)\n"
    "  OUT_DIR   receives model.safetensors and config.json (created if needed)\n"
    "  --dtype   tensor dtype of the export (default bf16, rounded to nearest even)\n"
    "  the target facts default to the checkpoint's state.json extra.export; the options override them\n";

std::vector<int> parse_ids(const std::string& text) {
  std::vector<int> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DFLASH_USER_CHECK(used == item.size() && !item.empty(),
                "--target-layer-ids: '{}' is not a comma-separated list of layer numbers (e.g. 1,9,17,25,33)", text);
    ids.push_back(v);
  }
  return ids;
}
}  // namespace

int run_export(int argc, char** argv) {
  Args args(argc, argv, {"dtype", "target-layer-ids", "num-target-layers", "max-position-embeddings"}, {}, kUsage);
  DFLASH_USER_CHECK(args.positional().size() == 2, "expected STEP_DIR and OUT_DIR, got {} argument(s)\n{}",
              args.positional().size(), kUsage);
  const std::string dtype = args.str("dtype", "bf16");
  DFLASH_USER_CHECK(dtype == "bf16" || dtype == "f32", "--dtype must be bf16 or f32, got '{}'", dtype);
  model::DrafterExportInfo over;
  if (args.has("target-layer-ids")) over.target_layer_ids = parse_ids(args.str("target-layer-ids", ""));
  over.num_target_layers = int(args.integer("num-target-layers", 0));
  over.max_position_embeddings = int(args.integer("max-position-embeddings", 0));
  const std::string step_dir = args.positional()[0], out_dir = args.positional()[1];
  train::export_checkpoint(step_dir, out_dir, dtype == "bf16" ? io::DType::BF16 : io::DType::F32, over);
  model::ExportedDrafter back = model::load_exported_drafter(out_dir);  // proves the files load
  std::printf("exported %s to %s: %zu parameters, %s, %d layers, H %d, block %d, target layers [%s] of %d\n",
              step_dir.c_str(), out_dir.c_str(), back.params.flat.size(), dtype.c_str(), back.config.layers,
              back.config.hidden, back.config.block_size,
              fmt::format("{}", fmt::join(back.info.target_layer_ids, ", ")).c_str(), back.info.num_target_layers);
  return 0;
}

}  // namespace dflash::data
