#pragma once
// What one rank of a job holds, item by item (one GPU with run.device: cuda, host memory on the CPU backend),
// computed from the run plan before anything is allocated: `dflash_mpi --check` prints it next to the cards users
// have (or this machine's memory), and the job checks it on every node before it allocates, so a configuration that
// cannot fit is refused in seconds, naming the numbers, instead of failing with an out-of-memory error (or
// std::bad_alloc) an hour into the job.
#include <cstdint>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/model/drafter_config.h"
#include "lib/model/qwen_config.h"
#include "lib/report/check_item.h"
#include "lib/train/run_plan.h"

namespace dflash::preflight {

struct MemoryItem {
  std::string what;  // "drafter activations (arena)"
  double bytes = 0;
};

struct RankMemory {
  std::string role;  // "target TP rank 0 (largest shard)"
  std::vector<MemoryItem> items;
  double total() const;
};

// The inputs of the plan: the shapes and the few config values memory depends on.
// The activation arena bytes of the target TP rank that needs the most (model::target_activation_bytes over the
// ranks' shards) for one forward of S positions in bf16 or fp32, on the CUDA backend or the CPU.
size_t target_rank_activation_bytes(const model::QwenConfig& c, int tp, int S, bool bf16, bool cuda);

struct MemoryPlanInputs {
  model::QwenConfig target;
  int64_t target_rank_params = 0;  // parameters of the largest target TP shard (weights held on that GPU)
  int target_tp = 1;
  model::DrafterConfig drafter;
  int max_seq_len = 0;             // S: the longest sequence a packet carries
  int anchors_per_seq = 0;         // N: blocks per sequence
  int chunk_size = 0;              // C: vocab-loss rows per chunk
  bool kl = false;                 // the KL term needs the target logits too
  bool bf16 = true;                // run.precision: bf16 activations and target weights (fp32 drafter master
                                   // weights either way) or fp32
  int packets_in_flight = 2;
  bool cuda = true;                // false: the CPU backend (everything fp32 in host memory, no cuBLASLt workspace)
};

// The inputs from a run's config and plan; longest: the longest sequence of the data (before data.max_seq_len).
MemoryPlanInputs memory_plan_inputs(const TrainConfig& cfg, const train::RunPlan& plan, int64_t longest);

struct GpuMemoryPlan {
  RankMemory target, drafter;
};

GpuMemoryPlan gpu_memory_plan(const MemoryPlanInputs& in);

// Linear-weight parameters of the largest target TP shard (dense or hybrid, as lib/model/target_shard splits it;
// the embedding is read from the memory-mapped file per forward and the lm_head lives on the drafter ranks).
int64_t target_rank_params(const model::QwenConfig& c, int tp);

// The plan as a table, then one line per GPU model: "fits on an H200 (141 GB): 62.1 of 141.0 GB, 56 % free".
// gpus: (name, bytes) of the cards to compare with.
std::string format_gpu_memory_plan(const GpuMemoryPlan& plan,
                                   const std::vector<std::pair<std::string, double>>& gpus);

// The cards the seed's run is planned for: RTX PRO 6000 Blackwell (95 GB usable of 96) and H200 (141 GB).
std::vector<std::pair<std::string, double>> default_gpus();

// Physical memory of this machine in bytes (MemTotal of /proc/meminfo; 0 when unknown).
double machine_memory_bytes();

// "" when `ranks` (what each rank on one machine needs, with its name) fit `available` bytes; else the refusal,
// naming each rank's need, the sum, the machine and the fix.
std::string memory_does_not_fit(const std::vector<std::pair<std::string, double>>& ranks, double available,
                                const std::string& machine);

// --check's items of the memory plan, computed before anything would be allocated: on cuda the per-GPU plan against
// the cards, on the CPU the host plan and the whole job on one machine. What cannot fit is DOES NOT FIT on its item
// (the plan is printed, so the user sees which entry is too large). longest: the longest sequence as streamed.
std::vector<report::CheckItem> memory_items(const TrainConfig& cfg, const train::RunPlan& plan, int64_t longest);

}  // namespace dflash::preflight
