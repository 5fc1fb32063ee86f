#pragma once
// dflash_mpi's command line, parsed with CLI11 before MPI starts (so --help, --check, --export and a usage error
// need no MPI):
//   [mpirun -np N] dflash_mpi CONFIG.yaml [--set key=value]... [--stop-after-steps K] [--dump-step DIR] [--check]
//   dflash_mpi CONFIG.yaml [--set key=value]... --print-key run.out_dir
//   dflash_mpi --export SOURCE OUT_DIR [--best] [--dtype bf16|f32] [--target-layer-ids ...]   (= dflash_data export)
// A usage error is a dflash::Error without source location that names the option and says where --help is.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dflash::job {

struct ProgramOptions {
  std::string config;               // CONFIG.yaml
  std::vector<std::string> sets;    // every --set key=value, in order
  int64_t stop_after = 0;           // --stop-after-steps K (> 0), 0 = not given
  std::string dump_dir;             // --dump-step DIR
  bool check = false;               // --check
  std::vector<std::string> gpus;    // --gpu NAME (repeatable): the GPUs --check predicts the balance for
  std::string print_key;            // --print-key KEY: print the key's resolved value, run nothing (scripts)
};

// The one export (docs/export.md, lib/job/export_command.h): `dflash_mpi --export` and `dflash_data export` parse
// the same options with the same messages.
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

// std::nullopt: --help was asked for, and printed to stdout when print_help.
std::optional<ProgramOptions> parse_program_options(int argc, char** argv, bool print_help = true);
// argv[1] is "--export" (dflash_mpi).
std::optional<ExportOptions> parse_export_options(int argc, char** argv, bool print_help = true);
// argv[0] is the command word ("export" of dflash_data); `program` names the command in help and usage errors.
std::optional<ExportOptions> parse_export_command(int argc, char** argv, const std::string& program,
                                                  bool print_help = true);

// The rank mpirun / srun gave this process before MPI starts (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK,
// SLURM_PROCID), 0 when launched alone: so that a usage error is printed once, not once per rank.
int launcher_rank();

}  // namespace dflash::job
