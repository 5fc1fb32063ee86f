#pragma once
// `dflash_mpi CONFIG.yaml --check`: everything that can be validated without the MPI job (the target's tensor
// shapes from the safetensors headers, the data, the tokenizer, the eval files, the resume checkpoint), and what
// the job would need (ranks, memory, the slurm signal margin), printed as one report.
#include <string>
#include <vector>

#include "lib/config/config.h"

namespace dflash::preflight {

// An eval file named by the config must exist before the job spends time loading the target: throws a user error
// naming `key` and the switch that turns the eval off.
void check_eval_file(const char* key, const std::string& path, const char* switch_key);

// Prints the report; 0 = OK, 2 = INCOMPLETE (config.json without the weights: the plan is printed); a problem
// throws dflash::Error. gpus: the GPUs (gpu_specs keys) the pipeline's balance is predicted for; empty = the
// H200, the RTX PRO 6000 and this machine's GPU when it is another of the table's.
int run_check(const TrainConfig& cfg, const std::vector<std::string>& gpus = {});

}  // namespace dflash::preflight
