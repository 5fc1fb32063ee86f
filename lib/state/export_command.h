#pragma once
// The one export (docs/export.md), beside the checkpoints it reads: `dflash_mpi --export` and `dflash_data export`
// parse the same options (parse_export_options / parse_export_command below) and both run export_command.
//
//   SOURCE = a run folder      -> its newest complete checkpoint (find_latest_checkpoint: ckpt/step_* with DONE)
//            a run folder + --best -> SOURCE/ckpt/best
//            a checkpoint step folder (ckpt/step_XXXXXXXX, ckpt/best) or an exported drafter folder -> itself
// The folder is read by load_drafter_source (lib/state/drafter_source.h), as dflash_eval --drafter reads it; a
// checkpoint that does not record the target facts (state.json extra.export) takes them from the options.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dflash::state {

// The export's options: `dflash_mpi --export` and `dflash_data export` parse the same options with the same
// messages.
struct ExportOptions {
  std::string source;               // SOURCE: a run folder, a checkpoint step folder or an exported drafter folder
  std::string out_dir;              // OUT_DIR
  bool best = false;                // --best: SOURCE/ckpt/best instead of the run's newest complete checkpoint
  std::string dtype = "bf16";       // --dtype bf16 | f32
  // the target facts, for checkpoints that do not record them (state.json extra.export); empty / 0 = recorded
  std::vector<int> target_layer_ids;  // --target-layer-ids 1,9,17
  int num_target_layers = 0;          // --num-target-layers N
  int max_position_embeddings = 0;    // --max-position-embeddings P
};

// argv[1] is "--export" (dflash_mpi).
std::optional<ExportOptions> parse_export_options(int argc, char** argv, bool print_help = true);
// argv[0] is the command word ("export" of dflash_data); `program` names the command in help and usage errors.
std::optional<ExportOptions> parse_export_command(int argc, char** argv, const std::string& program,
                                                  bool print_help = true);

struct ExportSource {
  std::string kind;  // "run" (its newest complete checkpoint), "best", "checkpoint" or "export"
  std::string dir;   // the folder read: a step folder, ckpt/best or an exported folder
};

// Resolves SOURCE (and --best) as above; a folder that is none of them, a run folder without a complete
// checkpoint and --best without ckpt/best are user errors naming the folder, what it holds and the way out.
ExportSource resolve_export_source(const std::string& source, bool best);

// Exports: checks OUT_DIR (model::check_export_out_dir; never SOURCE itself or a folder inside a checkpoint), reads
// the drafter, writes OUT_DIR (model::export_drafter), reads it back; returns the summary both commands print.
std::string export_command(const ExportOptions& o);

}  // namespace dflash::state
