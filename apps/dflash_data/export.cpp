// dflash_data export SOURCE OUT_DIR [--best] [--dtype bf16|f32] [--target-layer-ids 1,9,17] [--num-target-layers N]
//   [--max-position-embeddings P]
// The same command as `dflash_mpi --export` (one parser, one implementation: lib/state/export_command.h): a run's
// drafter as model.safetensors + config.json + modeling_dflash.py (docs/export.md).
#include <cstdio>

#include "apps/dflash_data/commands.h"
#include "lib/state/export_command.h"

namespace dflash::data {

int run_export(int argc, char** argv) {
  const auto options = state::parse_export_command(argc, argv, "dflash_data export");
  if (!options) return 0;  // --help
  std::printf("%s\n", state::export_command(*options).c_str());
  return 0;
}

}  // namespace dflash::data
