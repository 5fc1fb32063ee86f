// dflash_bench SUBCOMMAND [options]: benchmark programs. Each subcommand lives in its own bench_<name>.cpp;
// they print ratios measured in the same run (e.g. against this machine's BLAS GEMM rate), not absolute claims.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "apps/dflash_bench/bench.h"

namespace {

struct Subcommand {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* help;
};

const Subcommand kSubcommands[] = {
    {"drafter", dflash::bench::run_drafter, "drafter forward+backward over one sequence's anchors vs sgemm rate"},
    {"target", dflash::bench::run_target, "TP target forward tokens/s and all-reduce time (mpirun -np K)"},
    {"loss", dflash::bench::run_loss, "chunked vocab loss (recompute|fused|naive) vs its GEMMs alone, and its memory"},
};

void usage() {
  std::fprintf(stderr, "usage: dflash_bench SUBCOMMAND [--help] [options]\n\nsubcommands:\n");
  for (const auto& s : kSubcommands) std::fprintf(stderr, "  %-10s %s\n", s.name, s.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& s : kSubcommands) {
    if (std::string(argv[1]) == s.name) {
      try {
        return s.run(argc - 1, argv + 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "dflash_bench %s: error: %s\n", s.name, e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "dflash_bench: unknown subcommand '%s'\n", argv[1]);
  usage();
  return 2;
}
