// dflash_data SUBCOMMAND [options]: make and check the files dflash_mpi reads (HDF5 datasets, tiny models).
// Each subcommand lives in its own <name>.cpp and is declared in commands.h.
#include "apps/dflash_data/commands.h"
#include "lib/core/subcommands.h"

namespace {

using dflash::Subcommand;

const Subcommand kSubcommands[] = {
    {"export", dflash::data::run_export,
     "SOURCE OUT_DIR [--best --dtype --target-layer-ids --num-target-layers --max-position-embeddings]: a run's "
     "drafter for serving (model.safetensors + config.json + modeling_dflash.py); = dflash_mpi --export"},
    {"import-jsonl", dflash::data::run_import_jsonl,
     "IN.jsonl OUT.h5 [--vocab V]: JSONL of {input_ids, loss_mask?} to an HDF5 dataset"},
    {"import-prompts", dflash::data::run_import_prompts,
     "IN.jsonl... --tokenizer DIR --out OUT.h5 [--template-kwargs --target --max-len]: text prompts (prompt / "
     "question / turns / messages) with the target's chat template, for dflash_eval (runs data/prep/dflash-prep "
     "prompts)"},
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

}  // namespace

int main(int argc, char** argv) {
  return dflash::run_subcommand("dflash_data", kSubcommands, argc, argv,
                                "the dataset format is described in data/README.md");
}
