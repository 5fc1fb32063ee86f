// dflash_data SUBCOMMAND [options]: make and check the files dflash_mpi reads (HDF5 datasets, tiny models).
// Each subcommand lives in its own <name>.cpp and is declared in commands.h.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "apps/dflash_data/commands.h"

namespace {

struct Subcommand {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* help;
};

const Subcommand kSubcommands[] = {
    {"export", dflash::data::run_export,
     "STEP_DIR OUT_DIR [--dtype bf16|f32]: a checkpoint's drafter as model.safetensors + config.json"},
    {"import-jsonl", dflash::data::run_import_jsonl,
     "IN.jsonl OUT.h5 [--vocab V]: JSONL of {input_ids, loss_mask?} to an HDF5 dataset"},
    {"inspect", dflash::data::run_inspect, "FILE.h5 [--vocab V] [--seq I]: validate a dataset and print its statistics"},
    {"make-target", dflash::data::run_make_target,
     "--out DIR [--hidden --layers --heads --kv-heads --head-dim --intermediate --vocab --seed --dtype --tie]: "
     "write a random Qwen3 model"},
    {"make-prompts", dflash::data::run_make_prompts,
     "--out OUT.h5 --vocab V [--count --min-len --max-len --reserve --seed]: random prompts (loss_mask 0)"},
    {"regenerate", dflash::data::run_regenerate,
     "--target DIR --prompts IN.h5 --out OUT.h5 [--max-new-tokens --eos --limit --vocab-limit]: "
     "prompts + the target's greedy continuations (mpirun -np K: TP K)"},
};

void usage() {
  std::fprintf(stderr, "usage: dflash_data SUBCOMMAND [--help] [options]\n\nsubcommands:\n");
  for (const auto& s : kSubcommands) std::fprintf(stderr, "  %-14s %s\n", s.name, s.help);
  std::fprintf(stderr, "\nthe dataset format is described in data/README.md\n");
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
        std::fprintf(stderr, "dflash_data %s: error: %s\n", s.name, e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "dflash_data: unknown subcommand '%s'\n", argv[1]);
  usage();
  return 2;
}
