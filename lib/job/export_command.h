#pragma once
// The one export (docs/export.md): `dflash_mpi --export` and `dflash_data export` parse the same options
// (parse_export_options / parse_export_command, lib/job/cli.h) and both run export_command.
//
//   SOURCE = a run folder      -> its newest complete checkpoint (find_latest_checkpoint: ckpt/step_* with DONE)
//            a run folder + --best -> SOURCE/ckpt/best
//            a checkpoint step folder (ckpt/step_XXXXXXXX, ckpt/best) or an exported drafter folder -> itself
// The folder is read by load_drafter_source (lib/state/drafter_source.h), as dflash_eval --drafter reads it; a
// checkpoint that does not record the target facts (state.json extra.export) takes them from the options.
#include <cstdint>
#include <string>

#include "lib/job/cli.h"

namespace dflash::job {

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

}  // namespace dflash::job
