#pragma once
// `dflash_mpi CONFIG.yaml --check`: everything that can be validated without the MPI job (the target's tensor
// shapes from the safetensors headers, the data, the tokenizer, the evals' files, the resume checkpoint), and what
// the job would need (ranks, memory, the slurm signal margin), printed as one report: the resolved config, a verdict
// line, then a list of items (lib/report/check_item.h), each built by the code that owns what it checks.
#include <memory>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/eval/evals.h"
#include "lib/io/dataset.h"
#include "lib/model/qwen_config.h"
#include "lib/preflight/target_check.h"
#include "lib/preflight/tokenizer_check.h"
#include "lib/report/check_item.h"
#include "lib/train/data_facts.h"
#include "lib/train/run_plan.h"

namespace dflash::preflight {

// What the items are built from: the config and what --check learned from the files (the checks that throw ran).
struct Preflight {
  const TrainConfig& cfg;
  model::QwenConfig target;         // target.path's config.json
  bool has_weights = false;         // model.safetensors(.index.json) present: checked in full
  TargetWeightsSummary weights;     // has_weights: what the headers hold
  std::unique_ptr<io::Dataset> data;  // data.path
  train::RunPlan plan;
  train::DataFacts facts;           // one pass over data.path
  TokenizerFacts tokenizer;
  TokenizerCheck tokenizer_check;   // no errors (they throw)
  eval::TrainingEvals evals;        // the in-training evals, their files checked as the job checks them
  std::vector<std::string> gpus;    // the GPUs (gpu_specs keys) the pipeline's balance is predicted for (--gpu)

  // Loads and checks everything above; a problem throws dflash::Error naming the file, key and fix.
  explicit Preflight(const TrainConfig& cfg, std::vector<std::string> gpus = {});
};

// The report's items, in order. An item more is its builder (beside what it checks) and one line here.
std::vector<report::CheckItem> preflight_items(const Preflight& p);

// Prints the report; 0 = OK, 2 = INCOMPLETE (config.json without the weights: the plan is printed), 3 = DOES NOT
// FIT (the memory plan is printed, the reason goes to stderr); a problem throws dflash::Error. gpus: the GPUs
// (gpu_specs keys) the pipeline's balance is predicted for; empty = the H200, the RTX PRO 6000 and this machine's
// GPU when it is another of the table's.
int run_check(const TrainConfig& cfg, const std::vector<std::string>& gpus = {});

}  // namespace dflash::preflight
