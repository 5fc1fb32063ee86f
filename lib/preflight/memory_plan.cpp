#include "lib/preflight/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "kernels/backend.h"
#include "lib/comm/shard.h"
#include "lib/config/config.h"
#include "lib/model/drafter.h"
#include "lib/model/drafter_params.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"
#include "lib/train/run_plan.h"

namespace dflash::preflight {

double RankMemory::total() const {
  double t = 0;
  for (const MemoryItem& i : items) t += i.bytes;
  return t;
}

int64_t target_rank_params(const model::QwenConfig& c, int tp) {
  double best = 0;
  // the weights a rank stores: what a token multiplies, where MoE layers count only the k / E share of the held
  // experts, plus the rest of the experts it holds (all of them sit in memory)
  const double unused_share = c.experts > 0 ? 1.0 - double(c.experts_per_token) / c.experts : 0.0;
  for (int r = 0; r < tp; ++r) {
    const model::ShardCost cost =
        model::shard_cost(c, model::plan_target_shard(c, tp, r, model::TargetOptions{}.mlp_grain), 1);
    best = std::max(best, cost.weight_params + cost.expert_params * unused_share);
  }
  return int64_t(best);
}

size_t target_rank_activation_bytes(const model::QwenConfig& c, int tp, int S, bool bf16, bool cuda) {
  size_t most = 0;
  for (int r = 0; r < tp; ++r)
    most = std::max(
        most, model::target_activation_bytes(c, model::plan_target_shard(c, tp, r, model::TargetOptions{}.mlp_grain), S,
                                             bf16 ? kernels::Precision::bf16 : kernels::Precision::fp32, cuda));
  return most;
}

MemoryPlanInputs memory_plan_inputs(const TrainConfig& cfg, const train::RunPlan& plan, int64_t longest) {
  MemoryPlanInputs m;
  m.target = plan.target;
  m.target_rank_params = target_rank_params(plan.target, cfg.layout.target_tp);
  m.target_tp = cfg.layout.target_tp;
  m.drafter = plan.drafter;
  m.max_seq_len = int(cfg.data.max_seq_len > 0 ? std::min<int64_t>(cfg.data.max_seq_len, longest) : longest);
  m.anchors_per_seq = cfg.loss.anchors_per_seq;
  m.chunk_size = cfg.loss.chunk_size;
  m.kl = cfg.loss.uses_target();  // KL, TV, LK and NLA all need the target's logits
  m.cuda = cfg.run.device == kernels::Device::cuda;
  m.bf16 = cfg.run.compute_precision() == kernels::Precision::bf16;
  m.packets_in_flight = cfg.layout.packets_in_flight;
  return m;
}

GpuMemoryPlan gpu_memory_plan(const MemoryPlanInputs& in) {
  const double act = in.bf16 ? 2 : 4;  // bytes of an activation / compute weight (drafter and target alike)
  const double S = in.max_seq_len, H = in.drafter.hidden, V = in.drafter.vocab;
  const model::DrafterConfig& d = in.drafter;
  GpuMemoryPlan p;

  // target rank, as lib/model/target.cpp allocates it: the weights in the compute precision (run.precision: bf16
  // on cuda by default, 2 bytes; fp32 4); one activation arena, sized by the target's own bind lists
  // (model::target_activation_bytes: residual stream, normed input, partial sum, MLP gate/up, the largest token
  // mixer's scratch — flash attention: nothing S × S — and with bf16 an fp32 [S, H] array). Packets (taps + final
  // hidden, fp32) stay on the GPU with the NCCL data plane (the multi-GPU default): packets_in_flight of them in
  // flight plus the one being filled (lib/train/packet.h). On a GPU the whole embedding table sits in device memory
  // in the compute precision (uploaded once at load, rows gathered there); the CPU reads it from the mmap. The CUDA
  // backend keeps a RoPE cos/sin table per (rotary dim, θ).
  const model::QwenConfig& t = in.target;
  const double th = t.hidden;
  const char* tp_name = in.bf16 ? "bf16" : "fp32";
  const int target_rot = t.rotary_dim > 0 ? t.rotary_dim : t.head_dim;
  p.target.role = "target TP rank (largest shard)";
  p.target.items = {
      {fmt::format("weights ({})", tp_name), double(in.target_rank_params) * act},
      {fmt::format("embedding table ({}, gathered on the GPU)", tp_name), in.cuda ? double(t.vocab) * th * act : 0.0},
      {fmt::format("activations (arena: forward + token-mixer scratch, {})", tp_name),
       double(target_rank_activation_bytes(t, in.target_tp, in.max_seq_len, in.bf16, in.cuda))},
      {fmt::format("packets: taps + final hidden (fp32) x {}", in.packets_in_flight + 1),
       S * th * (d.n_taps + 1) * 4 * (in.packets_in_flight + 1)},
      {"RoPE cos/sin table (fp32)", in.cuda ? double(kernels::rope_table_bytes(target_rot)) : 0.0},
      {"cuBLASLt workspace", in.cuda ? 32.0 * (1 << 20) : 0.0},
  };

  // drafter rank
  const double P = double(model::drafter_param_count(d));
  const double N = in.anchors_per_seq, T = N * (d.block_size - 1), C = in.chunk_size;
  p.drafter.role = "drafter DP rank";
  p.drafter.items = {
      // the CUDA backend holds both frozen matrices in bf16; the CPU backend in fp32, one when they are tied
      in.cuda ? MemoryItem{"target embedding + lm_head (frozen, bf16)", 2 * V * H * 2}
              : MemoryItem{"target embedding + lm_head (frozen, fp32)", V * H * 4 * (t.tie_word_embeddings ? 1 : 2)},
      {"weights: compute copy + fp32 master", P * (in.bf16 ? 2 : 0) + P * 4},
      {"gradients (fp32)", P * 4},
      {"AdamW moments (fp32)", P * 8},
      {"activations (arena: forward + backward peak)",
       double(model::drafter_arena_bytes(d, in.max_seq_len, in.anchors_per_seq, size_t(act), in.bf16 ? 4 : 4))},
      {"vocab loss: logits scratch (C x V, fp32) x (KL ? 2 : 1)", C * V * 4 * (in.kl ? 2 : 1)},
      {"vocab loss: scored rows X, Y, dX and d_out", T * H * act * (in.kl ? 3 : 2) + N * d.block_size * H * act},
      // a GPU drafter holds its packets on the device (NCCL: received there; MPI: uploaded from page-locked host
      // staging): packets_in_flight posted plus the one computed on; bf16 converts the one computed on
      {fmt::format("packets: taps + final hidden (fp32) x {}", in.packets_in_flight + 1),
       S * H * (d.n_taps + 1) * 4 * (in.packets_in_flight + 1)},
      {"packet in the compute type (bf16 only)", in.bf16 ? S * H * (d.n_taps + 1) * 2 : 0.0},
      {"RoPE cos/sin table (fp32)", in.cuda ? double(kernels::rope_table_bytes(d.head_dim)) : 0.0},
      {"cuBLASLt workspace", in.cuda ? 32.0 * (1 << 20) : 0.0},
  };
  return p;
}

std::string format_gpu_memory_plan(const GpuMemoryPlan& plan,
                                   const std::vector<std::pair<std::string, double>>& gpus) {
  auto gb = [](double b) { return fmt::format("{:7.2f} GB", b / 1e9); };
  std::string out;
  for (const RankMemory* r : {&plan.target, &plan.drafter}) {
    out += fmt::format("  {}\n", r->role);
    for (const MemoryItem& i : r->items)
      if (i.bytes > 0) out += fmt::format("    {:<56} {}\n", i.what, gb(i.bytes));  // none: not on this backend
    out += fmt::format("    {:<56} {}\n", "total", gb(r->total()));
  }
  const double worst = std::max(plan.target.total(), plan.drafter.total());
  for (const auto& [name, bytes] : gpus)
    out += fmt::format("  {} on {} ({:.0f} GB): the fuller GPU holds {:.1f} GB, {:.0f} % free\n",
                       worst <= bytes ? "fits" : "DOES NOT FIT", name, bytes / 1e9, worst / 1e9,
                       100.0 * (bytes - worst) / bytes);
  return out;
}

std::vector<std::pair<std::string, double>> default_gpus() {
  return {{"RTX PRO 6000 Blackwell", 95e9}, {"H200", 141e9}};
}

double machine_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    double kib = 0;
    if (fields >> key >> kib && key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

std::string memory_does_not_fit(const std::vector<std::pair<std::string, double>>& ranks, double available,
                                const std::string& machine) {
  double sum = 0;
  std::string each;
  for (const auto& [who, bytes] : ranks) {
    sum += bytes;
    each += fmt::format("\n  {:<44} {:10.2f} GB", who, bytes / 1e9);
  }
  if (available <= 0 || sum <= available) return "";
  return fmt::format("the memory plan does not fit {}: its ranks need {:.2f} GB, it has {:.2f} GB (dflash_mpi CONFIG "
                     "--check prints the plan item by item):{}\n  fix: smaller drafter or loss sizes "
                     "(loss.chunk_size, loss.anchors_per_seq, data.max_seq_len), fewer ranks on this machine, more "
                     "target TP ranks, or run.device: cuda",
                     machine, sum / 1e9, available / 1e9, each);
}

std::vector<report::CheckItem> memory_items(const TrainConfig& cfg, const train::RunPlan& plan, int64_t longest) {
  const MemoryPlanInputs m = memory_plan_inputs(cfg, plan, longest);
  const GpuMemoryPlan mem = gpu_memory_plan(m);
  const double fuller = std::max(mem.target.total(), mem.drafter.total());
  if (cfg.run.device == kernels::Device::cuda) {
    report::CheckItem gpu{"per-GPU memory", {fmt::format("(run.device cuda, {} activations, S = {}):",
                                                         m.bf16 ? "bf16" : "fp32", m.max_seq_len)}};
    for (std::string& line : report::lines_of(format_gpu_memory_plan(mem, default_gpus()))) gpu.lines.push_back(line);
    double largest_card = 0;
    for (const auto& [name, bytes] : default_gpus()) largest_card = std::max(largest_card, bytes);
    if (fuller > largest_card) {
      gpu.verdict = report::Verdict::does_not_fit;
      gpu.why = fmt::format("the fuller GPU needs {:.1f} GB, more than any card listed (the largest has {:.0f} GB): "
                            "smaller loss.chunk_size / loss.anchors_per_seq / data.max_seq_len, more target TP "
                            "ranks, or a smaller drafter", fuller / 1e9, largest_card / 1e9);
    }
    return {gpu};
  }
  // the CPU backend: all ranks in host memory; the single-node launch puts the whole world on one machine
  report::CheckItem host{fmt::format("host memory (CPU backend, fp32, S = {}):", m.max_seq_len), {""}};
  for (std::string& line : report::lines_of(format_gpu_memory_plan(mem, {}))) host.lines.push_back(line);
  const double here = machine_memory_bytes();
  if (here > 0 && fuller > here) {
    host.verdict = report::Verdict::does_not_fit;
    host.why = memory_does_not_fit({{"one rank (the fuller role)", fuller}}, here, "this machine");
  }
  const int target_ranks = cfg.layout.target_tp * cfg.layout.target_groups;
  const double node = target_ranks * mem.target.total() + cfg.layout.drafter_dp * mem.drafter.total();
  report::CheckItem machine{
      "one machine",
      {fmt::format("{} target x {:.2f} GB + {} drafter x {:.2f} GB = {:.2f} GB for the whole job on one node (this "
                   "machine has {:.2f} GB); #SBATCH --mem={:.0f}G for single_node.sbatch",
                   target_ranks, mem.target.total() / 1e9, cfg.layout.drafter_dp, mem.drafter.total() / 1e9,
                   node / 1e9, here / 1e9, std::ceil(node * 1.15 / (1024.0 * 1024 * 1024)) + 1)}};
  return {host, machine};
}
}  // namespace dflash::preflight
