#pragma once
// dflash_mpi's command line, parsed with CLI11 before MPI starts (so --help, --check, --export and a usage error
// need no MPI):
//   [mpirun -np N] dflash_mpi CONFIG.yaml [--set key=value]... [--stop-after-steps K] [--dump-step DIR] [--check]
//   dflash_mpi CONFIG.yaml [--set key=value]... --print-key run.out_dir
//   dflash_mpi --export SOURCE OUT_DIR [--best] [--dtype bf16|f32] [--target-layer-ids ...]   (= dflash_data export,
//   its options beside the export: lib/state/export_command.h)
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

// std::nullopt: --help was asked for, and printed to stdout when print_help.
std::optional<ProgramOptions> parse_program_options(int argc, char** argv, bool print_help = true);

// The rank mpirun / srun gave this process before MPI starts (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK,
// SLURM_PROCID), 0 when launched alone: so that a usage error is printed once, not once per rank.
int launcher_rank();

}  // namespace dflash::job
