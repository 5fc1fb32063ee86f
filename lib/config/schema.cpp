#include "lib/config/schema.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace dflash {

const char* key_type_name(KeyType t) {
  switch (t) {
    case KeyType::kInt: return "int";
    case KeyType::kFloat: return "float";
    case KeyType::kBool: return "bool";
    case KeyType::kString: return "string";
    case KeyType::kEnum: return "enum";
    case KeyType::kIntList: return "list of int";
    case KeyType::kEnumList: return "list of enum";
  }
  return "?";
}

bool ValueRange::contains(double v) const {
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  if (hi_open ? !(v < hi) : !(v <= hi)) return false;
  return true;
}

std::string ValueRange::describe() const {
  bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi) return fmt::format("in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  if (has_lo) return fmt::format("{} {}", lo_open ? ">" : ">=", lo);
  if (has_hi) return fmt::format("{} {}", hi_open ? "<" : "<=", hi);
  return "";
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const ValueRange kAny{};
const ValueRange kPositive{0, kInf, true, false};     // > 0
const ValueRange kNonNeg{0, kInf, false, false};      // >= 0
const ValueRange kAtLeast1{1, kInf, false, false};    // >= 1
const ValueRange kUnitOpen{0, 1, false, true};        // [0, 1)
const ValueRange kUnit{0, 1, false, false};           // [0, 1]
const ValueRange kUnitLeftOpen{0, 1, true, false};    // (0, 1]
// [lo, hi]: sizes get a ceiling far above any real model (Qwen3.5-397B: hidden 4096, 64 layers, head_dim 256), so
// a typo like 1e9 is refused by name here instead of overflowing a size or ending in std::bad_alloc
constexpr ValueRange within(double lo, double hi) { return ValueRange{lo, hi, false, false}; }

#define FIELD(member) [](TrainConfig& c) -> FieldRef { return &c.member; }

ConfigKey key(std::string path, KeyType type, FieldRef (*field)(TrainConfig&), ValueRange range, std::string help) {
  ConfigKey k;
  k.path = std::move(path), k.type = type, k.field = field, k.help = std::move(help), k.range = range;
  return k;
}
ConfigKey choice(std::string path, FieldRef (*field)(TrainConfig&), std::vector<std::string> choices,
                 std::string help, KeyType type = KeyType::kEnum) {
  ConfigKey k;
  k.path = std::move(path), k.type = type, k.field = field, k.help = std::move(help), k.choices = std::move(choices);
  return k;
}
// A key that IS an enum: its choices are the enum's names (names_of, written beside the enum).
ConfigKey named(std::string path, FieldRef (*field)(TrainConfig&), std::string help) {
  TrainConfig probe;
  std::vector<std::string> choices = std::visit(
      [](auto* p) -> std::vector<std::string> {
        using V = std::remove_pointer_t<decltype(p)>;
        if constexpr (is_named_enum_v<V>) return choices_of<V>();
        else return {};
      },
      field(probe));
  return choice(std::move(path), field, std::move(choices), std::move(help));
}
ConfigKey required(ConfigKey k) {
  k.required = true;
  return k;
}
ConfigKey unhashed(ConfigKey k) {
  k.hashed = false;
  return k;
}

using T = KeyType;

std::vector<ConfigKey> build_schema() {
  return {
      // run
      unhashed(key("run.name", T::kString, FIELD(run.name), kAny, "run name, shown in logs and the exported config")),
      unhashed(key("run.out_dir", T::kString, FIELD(run.out_dir), kAny,
                   "output folder: logs/, ckpt/, metrics.jsonl, config.resolved.yaml")),
      key("run.seed", T::kInt, FIELD(run.seed), kNonNeg, "seed of every random stream (init, data shuffle, anchors)"),
      named("run.device", FIELD(run.device), "cpu: BLAS + OpenMP; cuda: cuBLASLt + CUDA kernels"),
      named("run.precision", FIELD(run.precision),
             "drafter activations and compute weights, and on cuda the target's weights and activations (fp32 "
             "master weights and AdamW state either way); auto: fp32 on cpu, bf16 on cuda"),
      key("run.steps", T::kInt, FIELD(run.steps), kNonNeg, "optimizer steps; 0 = as many as data.epochs allows"),
      unhashed(key("run.watchdog_seconds", T::kFloat, FIELD(run.watchdog_seconds), kNonNeg,
                   "a rank blocked this long in one wait (message, collective) logs what it waits on and aborts the "
                   "job; 0 = off")),
      unhashed(key("run.watchdog_floor_seconds", T::kFloat, FIELD(run.watchdog_floor_seconds), kNonNeg,
                   "the watchdog's bound never drops below this once it follows the steps")),
      unhashed(key("run.watchdog_step_multiple", T::kFloat, FIELD(run.watchdog_step_multiple), kNonNeg,
                   "after the first steps the watchdog's bound is this x the slowest step seen (at least "
                   "watchdog_floor_seconds, at most watchdog_seconds); 0 = watchdog_seconds throughout")),
      unhashed(key("run.start_over", T::kBool, FIELD(run.start_over), kAny,
                   "a run starting at step 0 over an earlier run in out_dir moves its checkpoints, final weights and "
                   "metrics to out_dir/superseded/<time>/ instead of refusing (nothing is deleted)")),
      // layout
      key("layout.target_tp", T::kInt, FIELD(layout.target_tp), within(1, 4096), "ranks per target tensor-parallel group"),
      key("layout.target_groups", T::kInt, FIELD(layout.target_groups), within(1, 4096),
          "target groups; world size = target_tp * target_groups + drafter_dp"),
      key("layout.drafter_dp", T::kInt, FIELD(layout.drafter_dp), within(1, 4096), "drafter data-parallel ranks"),
      unhashed(named("layout.transport", FIELD(layout.transport),
                      "data plane (packets, TP and DP all-reduce): mpi (anywhere), nccl (one GPU per rank) or "
                      "auto (nccl when run.device is cuda and every rank has its own GPU)")),
      unhashed(named("layout.tp_allreduce", FIELD(layout.tp_allreduce),
                      "a bf16 target's TP all-reduce on the nccl plane: bf16 (the bf16 partials summed as bf16, "
                      "half the bytes) or fp32 (widened, summed in fp32, rounded once); fp32 targets and the mpi "
                      "plane always sum in fp32")),
      unhashed(key("layout.packets_in_flight", T::kInt, FIELD(layout.packets_in_flight), within(1, 64),
                   "packets a target group may run ahead of each drafter rank (back-pressure)")),
      // target
      unhashed(required(key("target.path", T::kString, FIELD(target.path), kAny,
                            "Hugging Face model directory (config.json + *.safetensors)"))),
      key("target.target_layer_ids", T::kIntList, FIELD(target.target_layer_ids), kNonNeg,
          "tapped decoder layers (output of layer l); empty = round(1 + i*(L-4)/(n_taps-1))"),
      key("target.n_taps", T::kInt, FIELD(target.n_taps), within(1, 256), "number of tapped target layers"),
      // drafter
      key("drafter.layers", T::kInt, FIELD(drafter.layers), within(1, 256), "drafter decoder layers"),
      key("drafter.hidden", T::kInt, FIELD(drafter.hidden), within(0, 65536), "hidden size; 0 = the target's"),
      key("drafter.heads", T::kInt, FIELD(drafter.heads), within(0, 1024), "attention (query) heads; 0 = the target's"),
      key("drafter.kv_heads", T::kInt, FIELD(drafter.kv_heads), within(0, 1024), "key/value heads; 0 = the target's"),
      key("drafter.head_dim", T::kInt, FIELD(drafter.head_dim), within(0, 1024), "head dimension; 0 = the target's"),
      key("drafter.intermediate", T::kInt, FIELD(drafter.intermediate), within(0, 1 << 20),
          "MLP intermediate size; 0 = the target's"),
      key("drafter.block_size", T::kInt, FIELD(drafter.block_size), within(2, 1024),
          "block size B: the anchor token + B-1 predicted positions"),
      key("drafter.rope_theta", T::kFloat, FIELD(drafter.rope_theta), kNonNeg, "RoPE base; 0 = the target's"),
      key("drafter.rms_eps", T::kFloat, FIELD(drafter.rms_eps), kNonNeg, "RMSNorm epsilon; 0 = the target's"),
      required(key("drafter.mask_token_id", T::kInt, FIELD(drafter.mask_token_id), kNonNeg,
                   "reserved vocabulary row fed at the B-1 predicted positions (151669 for Qwen3)")),
      key("drafter.sliding_window", T::kInt, FIELD(drafter.sliding_window), kNonNeg,
          "attention window of 'sliding' layers; 0 = none"),
      choice("drafter.layer_types", FIELD(drafter.layer_types), {"full", "sliding"},
             "attention type per layer; empty = all full", T::kEnumList),
      unhashed(key("drafter.init", T::kString, FIELD(drafter.init), kAny,
                   "warm start: an exported drafter (ours or a published DFlash folder), a checkpoint step folder or a "
                   "run folder; its weights start the run (fresh optimizer, step 0); empty = random init")),
      key("drafter.init_std", T::kFloat, FIELD(drafter.init_std), kPositive,
          "std of the normal init of the trained projections"),
      // loss
      key("loss.chunk_size", T::kInt, FIELD(loss.chunk_size), within(1, 1 << 20),
          "positions per vocab chunk; loss memory is O(chunk_size * vocab)"),
      named("loss.mode", FIELD(loss.mode),
             "recompute: logits recomputed in backward (3 vocab GEMMs); fused: d(logits) in forward (2)"),
      key("loss.ce_weight", T::kFloat, FIELD(loss.ce_weight), kNonNeg, "weight of cross-entropy on the data token"),
      key("loss.kl_weight", T::kFloat, FIELD(loss.kl_weight), kNonNeg, "weight of KL(target || drafter)"),
      key("loss.kl_temperature", T::kFloat, FIELD(loss.kl_temperature), kPositive, "temperature of the KL term"),
      key("loss.cap_weight", T::kFloat, FIELD(loss.cap_weight), kNonNeg,
          "weight of the confidence-aware penalty (confident wrong argmax)"),
      key("loss.tv_weight", T::kFloat, FIELD(loss.tv_weight), kNonNeg,
          "weight of total variation 1 - sum_v min(p_v, q_v) (tau = 1)"),
      key("loss.lk_weight", T::kFloat, FIELD(loss.lk_weight), kNonNeg,
          "weight of LK-hybrid lambda*KL + (1-lambda)*TV, lambda = exp(-eta*alpha) (tau = 1)"),
      key("loss.lk_eta", T::kFloat, FIELD(loss.lk_eta), kNonNeg, "eta of LK-hybrid's blend"),
      key("loss.nla_weight", T::kFloat, FIELD(loss.nla_weight), kNonNeg,
          "weight of negative log-acceptance -log(alpha) (tau = 1)"),
      named("loss.position_weight", FIELD(loss.position_weight),
            "decay: exp(-(k-1)/gamma); dpace*: D-PACE factors from the drafter's confidence, per block"),
      key("loss.dpace_alpha", T::kFloat, FIELD(loss.dpace_alpha), kUnitLeftOpen,
          "D-PACE smoothing: confidence alpha + (1 - alpha) p_y"),
      unhashed(key("loss.top_k", T::kInt, FIELD(loss.top_k), within(1, 1024), "k of the top-k hit metric")),
      key("loss.decay_gamma", T::kFloat, FIELD(loss.decay_gamma), kNonNeg,
          "position weight exp(-(k-1)/gamma); 0 = 7 for B=16, 4 for B=8, 7*B/16 otherwise"),
      key("loss.anchors_per_seq", T::kInt, FIELD(loss.anchors_per_seq), within(1, 1 << 20),
          "anchors sampled per sequence per step (fewer when the loss mask allows fewer)"),
      // optim
      key("optim.lr", T::kFloat, FIELD(optim.lr), kPositive, "peak learning rate (AdamW)"),
      key("optim.weight_decay", T::kFloat, FIELD(optim.weight_decay), kNonNeg, "decoupled weight decay"),
      key("optim.beta1", T::kFloat, FIELD(optim.beta1), kUnitOpen, "AdamW beta1"),
      key("optim.beta2", T::kFloat, FIELD(optim.beta2), kUnitOpen, "AdamW beta2"),
      key("optim.eps", T::kFloat, FIELD(optim.eps), kPositive, "AdamW epsilon"),
      key("optim.warmup_ratio", T::kFloat, FIELD(optim.warmup_ratio), kUnit,
          "linear warmup over this fraction of the steps, then cosine decay"),
      key("optim.min_lr_ratio", T::kFloat, FIELD(optim.min_lr_ratio), kUnit, "cosine floor as a fraction of lr"),
      key("optim.grad_clip", T::kFloat, FIELD(optim.grad_clip), kNonNeg, "clip the global gradient norm; 0 = off"),
      key("optim.micro_batches", T::kInt, FIELD(optim.micro_batches), within(1, 1 << 16),
          "sequences per drafter rank per optimizer step"),
      // data
      unhashed(required(key("data.path", T::kString, FIELD(data.path), kAny,
                            "HDF5 dataset: tokens, offsets, loss_mask (data/README.md)"))),
      key("data.shuffle", T::kBool, FIELD(data.shuffle), kAny, "epoch-seeded shuffle; false = file order"),
      key("data.epochs", T::kInt, FIELD(data.epochs), kAtLeast1, "passes over the dataset"),
      key("data.max_seq_len", T::kInt, FIELD(data.max_seq_len), within(0, 1 << 24),
          "truncate longer sequences to this many tokens; 0 = no limit"),
      // ckpt
      unhashed(key("ckpt.every", T::kInt, FIELD(ckpt.every), kNonNeg, "save every N steps and at the end; 0 = off")),
      unhashed(key("ckpt.keep", T::kInt, FIELD(ckpt.keep), kNonNeg, "newest complete checkpoints kept; 0 = all")),
      unhashed(key("ckpt.resume", T::kString, FIELD(ckpt.resume), kAny,
                   "none | auto (newest complete checkpoint in out_dir/ckpt) | a checkpoint directory")),
      // log
      unhashed(key("log.every", T::kInt, FIELD(log.every), kAtLeast1, "progress line and metrics record every N steps")),
      unhashed(choice("log.level", FIELD(log.level), {"debug", "info", "warn", "error"},
                      "per-rank log level; env DFLASH_LOG_LEVEL overrides")),
      // eval (none of it changes the training math)
      unhashed(key("eval.data", T::kString, FIELD(eval.data), kAny,
                   "held-out HDF5 dataset (the format of data.path) for the teacher-forced eval; empty = none")),
      unhashed(key("eval.every", T::kInt, FIELD(eval.every), kNonNeg,
                   "held-out eval (loss, acc, tau; no gradients) after every N steps; 0 = off; needs eval.data")),
      unhashed(key("eval.max_sequences", T::kInt, FIELD(eval.max_sequences), kNonNeg,
                   "held-out sequences evaluated (the first N of eval.data); 0 = all")),
      unhashed(key("eval.prompts", T::kString, FIELD(eval.prompts), kAny,
                   "prompts HDF5 for the speculative eval (as dflash_eval --prompts); empty = none")),
      unhashed(key("eval.spec_every", T::kInt, FIELD(eval.spec_every), kNonNeg,
                   "real speculative decoding tau after every N steps; 0 = off; needs eval.prompts")),
      unhashed(key("eval.spec_prompts", T::kInt, FIELD(eval.spec_prompts), kAtLeast1,
                   "prompts decoded per speculative eval (the first N of eval.prompts)")),
      unhashed(key("eval.max_new_tokens", T::kInt, FIELD(eval.max_new_tokens), within(1, 1 << 20),
                   "tokens generated per prompt in the speculative eval")),
      // report (followers started by the launch scripts; none of it changes the training math)
      unhashed(key("report.tensorboard", T::kString, FIELD(report.tensorboard), kAny,
                   "TensorBoard event folder the launch scripts' follower writes from metrics.jsonl; empty = none")),
      unhashed(key("report.wandb", T::kString, FIELD(report.wandb), kAny,
                   "W&B project the launch scripts' follower logs metrics.jsonl to; empty = none")),
      unhashed(key("report.wandb_offline", T::kBool, FIELD(report.wandb_offline), kAny,
                   "W&B offline mode (no network; `wandb sync` later)")),
  };
}

#undef FIELD

}  // namespace

const std::vector<ConfigKey>& config_schema() {
  static const std::vector<ConfigKey> schema = build_schema();
  return schema;
}

const std::vector<std::string>& config_sections() {
  static const std::vector<std::string> sections = {"run",  "layout", "target", "drafter", "loss",
                                                    "optim", "data",  "ckpt",   "log", "eval", "report"};
  return sections;
}

const ConfigKey* find_config_key(const std::string& path) {
  for (const auto& k : config_schema())
    if (k.path == path) return &k;
  return nullptr;
}

std::string suggest_config_key(const std::string& unknown) {
  auto dot = unknown.rfind('.');
  std::string leaf = dot == std::string::npos ? unknown : unknown.substr(dot + 1);
  for (const auto& k : config_schema())  // the right key in the wrong section ("optim.block_size")
    if (k.leaf() == leaf) return k.path;
  std::string best;
  if (dot == std::string::npos) {  // a section name
    for (const auto& sec : config_sections())
      if (unknown.rfind(sec, 0) == 0 || sec.rfind(unknown, 0) == 0 ||  // "optimizer", "opt"
          edit_distance(unknown, sec) <= std::max<size_t>(2, unknown.size() / 3))
        return sec;
  }
  size_t best_d = std::max<size_t>(2, unknown.size() / 4) + 1;  // farther than this is not a typo
  for (const auto& k : config_schema()) {
    size_t d = edit_distance(unknown, k.path);
    if (d < best_d) best_d = d, best = k.path;
  }
  return best;
}

}  // namespace dflash
