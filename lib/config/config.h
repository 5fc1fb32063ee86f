#pragma once
// The training configuration: one typed struct per YAML section (run, layout, target, drafter, loss, optim, data,
// ckpt, log, eval). The member initialisers below ARE the defaults (the loss and optim sections inherit theirs from
// the model's settings structs, so each default is written once); the key table in schema.cpp names every member
// with its dotted path, type, range and help, and drives parsing, validation, printing, hashing and
// docs/config.md. Adding a key = one member here + one row in schema.cpp + one row in docs/config.md.
#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "lib/comm/transport.h"
#include "lib/model/adamw_settings.h"
#include "lib/model/target_settings.h"
#include "lib/model/vocab_loss_settings.h"

namespace dflash {

// run.precision: the drafter's activations and compute weights (and on cuda the target's); auto asks the device's
// default (kernels::default_precision: fp32 on the CPU, bf16 on CUDA).
enum class PrecisionChoice { automatic, fp32, bf16 };
constexpr std::array<const char*, 3> names_of(PrecisionChoice) { return {"auto", "fp32", "bf16"}; }

struct RunSection {
  // The compute type after resolving auto by the device.
  kernels::Precision compute_precision() const {
    if (precision == PrecisionChoice::automatic) return kernels::default_precision(device);
    return precision == PrecisionChoice::bf16 ? kernels::Precision::bf16 : kernels::Precision::fp32;
  }

  std::string name = "dflash";        // run name (logs, exported config)
  std::string out_dir = "runs/dflash";  // logs/, ckpt/, metrics.jsonl, config.resolved.yaml
  int64_t seed = 0;                   // every random stream derives from it (init, shuffle, anchors)
  kernels::Device device = kernels::Device::cpu;           // cpu | cuda
  PrecisionChoice precision = PrecisionChoice::automatic;  // auto (cpu: fp32, cuda: bf16) | fp32 | bf16
  int64_t steps = 0;                  // optimizer steps; 0 = as many as data.epochs allows
  double watchdog_seconds = 1800;     // a rank blocked this long in one wait aborts the job; 0 = off
  double watchdog_floor_seconds = 600;  // the bound never drops below this once it follows the steps
  double watchdog_step_multiple = 20;   // after the first steps: this x the slowest step; 0 = watchdog_seconds fixed
  bool start_over = false;            // a fresh start moves an earlier run's files aside (lib/state/out_dir_guard.h)
};

struct LayoutSection {
  int target_tp = 5;                  // ranks per target tensor-parallel group
  int target_groups = 1;              // target groups; world = target_tp * target_groups + drafter_dp
  int drafter_dp = 3;                 // drafter data-parallel ranks
  comm::TransportChoice transport = comm::TransportChoice::automatic;  // auto | mpi | nccl (lib/comm/data_plane.h)
  model::TpAllreduce tp_allreduce = model::TpAllreduce::bf16;  // how a bf16 target sums its TP partials on NCCL
  int packets_in_flight = 2;          // packets a target group may run ahead of each drafter rank
};

struct TargetSection {
  std::string path;                   // Hugging Face model directory (required)
  std::vector<int> target_layer_ids;  // tapped decoder layers; empty = round(1 + i*(L-4)/(n_taps-1))
  int n_taps = 5;                     // number of tapped layers
};

struct DrafterSection {
  int layers = 5;
  int hidden = 0;                     // 0 = the target's hidden_size (so for every "0 = target's" below)
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int intermediate = 0;
  int block_size = 16;                // B: anchor + B-1 predicted tokens
  double rope_theta = 0;              // 0 = the target's
  double rms_eps = 0;                 // 0 = the target's
  int mask_token_id = -1;             // required: a reserved row of the target vocabulary
  int sliding_window = 0;             // window of "sliding" layers; 0 = none
  std::vector<std::string> layer_types;  // "full" | "sliding" per layer; empty = all full
  double init_std = 0.02;             // std of the normal init of trained projections
  std::string init;                   // warm start: an exported drafter, a checkpoint or a run folder; "" = random
};

// The loss keys ARE the model's loss settings (lib/model/vocab_loss_settings.h: chunk_size, mode, the weights,
// kl_temperature, top_k, with their defaults written there once); the two below only shape the run (anchors and
// position weights, lib/train/anchors.h). block_size is inherited but not a key: the run plan sets it from
// drafter.block_size.
struct LossSection : model::VocabLossSettings {
  double decay_gamma = 0;             // weight exp(-(k-1)/gamma); 0 = default_decay_gamma(B) (train/anchors.h)
  int anchors_per_seq = 512;          // anchors sampled per sequence per step (fewer if the mask allows fewer)
};

// The optimizer keys: AdamW's constants ARE the model's settings (lib/model/adamw_settings.h: lr, weight_decay,
// beta1, beta2, eps, with their defaults written there once), then the schedule, clipping and batching.
struct OptimSection : model::AdamWSettings {
  double warmup_ratio = 0.04;         // linear warmup over this fraction of run.steps, then cosine
  double min_lr_ratio = 0.0;          // cosine floor as a fraction of lr
  double grad_clip = 1.0;             // global-norm clip; 0 = off
  int micro_batches = 1;              // sequences per drafter rank per step
};

struct DataSection {
  std::string path;                   // HDF5 dataset (required; format in data/README.md)
  bool shuffle = true;                // epoch-seeded shuffle; false = file order every epoch
  int epochs = 1;
  int max_seq_len = 0;                // longer sequences are truncated; 0 = no limit
};

struct CkptSection {
  int every = 0;                      // save every N steps (and at the end); 0 = off
  int keep = 2;                       // newest complete checkpoints kept; 0 = keep all
  std::string resume = "none";        // none | auto (newest complete in out_dir/ckpt) | a checkpoint directory
};

struct LogSection {
  int every = 10;                     // progress line + metrics.jsonl record every N steps
  std::string level = "info";         // debug | info | warn | error (env DFLASH_LOG_LEVEL overrides)
};

// In-training evaluation (docs/eval.md "During training"): everything off by default.
struct EvalSection {
  std::string data;                   // held-out HDF5 (the format of data.path); "" = no held-out eval
  int every = 0;                      // held-out eval after every N steps; 0 = off (needs eval.data)
  int max_sequences = 64;             // the first N sequences of eval.data; 0 = all
  std::string prompts;                // prompts HDF5 for the speculative eval; "" = none
  int spec_every = 0;                 // speculative eval after every N steps; 0 = off (needs eval.prompts)
  int spec_prompts = 8;               // the first N prompts of eval.prompts
  int max_new_tokens = 64;            // tokens generated per prompt
};

// Followers that mirror metrics.jsonl into the ecosystem's viewers (docs/reporting.md); the trainer only records the
// settings, the launch scripts start the follower (dflash-prep report) when one is set.
struct ReportSection {
  std::string tensorboard;            // event-file folder for TensorBoard; "" = none
  std::string wandb;                  // W&B project; "" = none
  bool wandb_offline = false;         // W&B offline mode (sync later with `wandb sync`)
};

// Where a key's value came from, for the resolved-config table.
enum class ConfigSource { kDefault, kFile, kSet };

struct TrainConfig {
  RunSection run;
  LayoutSection layout;
  TargetSection target;
  DrafterSection drafter;
  LossSection loss;
  OptimSection optim;
  DataSection data;
  CkptSection ckpt;
  LogSection log;
  EvalSection eval;
  ReportSection report;

  std::string file;                              // YAML file it was loaded from ("" when none)
  std::map<std::string, ConfigSource> source;    // per dotted key; absent = default
};

// Loads `file` (may be "" for defaults only), then applies `sets` ("key=value", dotted keys, in order), then
// validates. Every user error throws dflash::Error naming the file (or the --set), the key and the fix.
// Relative paths written in the file (run.out_dir, target.path, data.path, a ckpt.resume directory) resolve
// against the file's folder (so a job finds them whatever its working directory); --set paths against the
// working directory, as typed on the command line.
TrainConfig load_config(const std::string& file, const std::vector<std::string>& sets = {});
// The path resolution load_config applies: relative path keys whose source is the file become absolute paths
// under config_dir.
void resolve_paths_against(TrainConfig& cfg, const std::filesystem::path& config_dir);
// The same from YAML text; `name` stands for the file in messages (tests, embedded configs).
TrainConfig load_config_text(const std::string& yaml_text, const std::vector<std::string>& sets = {},
                             const std::string& name = "<config>");
// Applies one "key=value" override with the same parsing and range checks as the file (no cross-key checks).
void apply_override(TrainConfig& cfg, const std::string& set);
// Required keys present and cross-key rules (layer_types length, heads divisible, ...). load_config calls it.
void validate_config(const TrainConfig& cfg);

// The command line of dflash_mpi (CONFIG.yaml, --set key=value, ...) is parsed in lib/job/cli.h.

// The resolved config as an aligned table: key, value, source (default | file | --set).
std::string format_config_table(const TrainConfig& cfg);
// The resolved config as YAML (loads back to the same config and hash).
std::string config_to_yaml(const TrainConfig& cfg);
// Writes config_to_yaml to <run.out_dir>/config.resolved.yaml (creating the folder); returns the path.
// `trailer`: comment lines appended (facts the keys do not hold, e.g. the warm start's content identity).
std::string write_resolved_config(const TrainConfig& cfg, const std::string& trailer = "");
// Stable 64-bit hash (FNV-1a) of the keys that change the training math; excluded keys are marked in the
// schema (names, paths, transport tuning, ckpt.*, log.*): see docs/config.md.
uint64_t config_hash(const TrainConfig& cfg);
std::string config_hash_hex(const TrainConfig& cfg);  // "0x" + 16 hex digits

// Value of one key as text ("6e-4" -> "0.0006", lists "[1, 16, 31]"); throws on an unknown key.
std::string config_value(const TrainConfig& cfg, const std::string& key);

// Derived default (pure, documented in docs/config.md).
// target_layer_ids when empty: round(1 + i*(L-4)/(n_taps-1)), i = 0..n_taps-1 (one tap: L/2).
std::vector<int> default_target_layer_ids(int num_target_layers, int n_taps);

}  // namespace dflash
