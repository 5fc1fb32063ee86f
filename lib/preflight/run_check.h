#pragma once
// `dflash_mpi CONFIG.yaml --check`: everything that can be validated without the MPI job (the target's tensor
// shapes from the safetensors headers, the data, the tokenizer, the eval files, the resume checkpoint), and what
// the job would need (ranks, memory, the slurm signal margin), printed as one report.
#include <string>

#include "lib/config/config.h"

namespace dflash::preflight {

// An eval file named by the config must exist before the job spends time loading the target: throws a user error
// naming `key` and the switch that turns the eval off.
void check_eval_file(const char* key, const std::string& path, const char* switch_key);

// Prints the report; 0 = OK, 2 = INCOMPLETE (config.json without the weights: the plan is printed); a problem
// throws dflash::Error.
int run_check(const TrainConfig& cfg);

}  // namespace dflash::preflight
