#pragma once
// dflash_mpi's command line, parsed with CLI11 before MPI starts (so --help, --check, --export and a usage error
// need no MPI):
//   [mpirun -np N] dflash_mpi CONFIG.yaml [--set key=value]... [--stop-after-steps K] [--dump-step DIR] [--check]
//   dflash_mpi CONFIG.yaml [--set key=value]... --print-key run.out_dir
//   dflash_mpi --export STEP_DIR OUT_DIR [--dtype bf16|f32]
// A usage error is a dflash::Error without source location that names the option and says where --help is.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dflash::train {

struct ProgramOptions {
  std::string config;               // CONFIG.yaml
  std::vector<std::string> sets;    // every --set key=value, in order
  int64_t stop_after = 0;           // --stop-after-steps K (> 0), 0 = not given
  std::string dump_dir;             // --dump-step DIR
  bool check = false;               // --check
  std::string print_key;            // --print-key KEY: print the key's resolved value, run nothing (scripts)
};

struct ExportOptions {
  std::string step_dir, out_dir;
  std::string dtype = "bf16";       // bf16 | f32
};

// std::nullopt: --help was asked for, and printed to stdout when print_help.
std::optional<ProgramOptions> parse_program_options(int argc, char** argv, bool print_help = true);
// argv[1] is "--export".
std::optional<ExportOptions> parse_export_options(int argc, char** argv, bool print_help = true);

// The rank mpirun / srun gave this process before MPI starts (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK,
// SLURM_PROCID), 0 when launched alone: so that a usage error is printed once, not once per rank.
int launcher_rank();

}  // namespace dflash::train
