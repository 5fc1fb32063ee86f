#pragma once
// Subcommands of dflash_data (one <name>.cpp each): datasets and tiny models for dflash_mpi.
// Each takes (argc, argv) with argv[0] = the subcommand name and returns the exit code; user errors are
// thrown as dflash::Error and printed by main.

namespace dflash::data {

// export SOURCE OUT_DIR [--best] [--dtype bf16|f32] [target facts]: = dflash_mpi --export (lib/state/export_command.h,
// docs/export.md).
int run_export(int argc, char** argv);
// import-jsonl IN.jsonl OUT.h5 [--vocab V]: one JSON object per line with input_ids and optional loss_mask.
int run_import_jsonl(int argc, char** argv);
// import-prompts IN.jsonl... --tokenizer DIR --out OUT.h5: runs data/prep/dflash-prep prompts (text prompt sets).
int run_import_prompts(int argc, char** argv);
// inspect FILE.h5 [--vocab V] [--seq I]: validates the dataset and prints its statistics.
int run_inspect(int argc, char** argv);
// make-target --out DIR [sizes...]: a random Qwen3 model (config.json + safetensors) for tests and the quickstart.
int run_make_target(int argc, char** argv);
// make-prompts --out OUT.h5 --vocab V [--count --min-len --max-len --reserve --seed]: random prompts (loss_mask 0).
int run_make_prompts(int argc, char** argv);
// regenerate --target DIR --prompts IN.h5 --out OUT.h5 [...]: prompts + the target's greedy continuations.
int run_regenerate(int argc, char** argv);

}  // namespace dflash::data
