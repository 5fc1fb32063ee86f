// The pipeline-balance prediction of --check (lib/preflight/pipeline_balance.h). Each role's time is a sum of
// parts, each part counted work over the GPU's rate at an efficiency written next to it; docs/benchmarks.md says
// where each efficiency comes from and, once a GPU has run, how far the prediction was off.
#include "lib/preflight/pipeline_balance.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/attention_shape.h"
#include "kernels/backend.h"  // cuda_available, cuda_device_name
#include "kernels/gpu_arch.h"
#include "lib/core/error.h"
#include "lib/model/drafter.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"
#include "lib/preflight/memory_plan.h"

namespace dflash::preflight {

namespace {

// Fractions of the data-sheet rates a part reaches (docs/benchmarks.md, "The pipeline-balance model"), measured
// on an H200 on 2026-12-04 where marked (docs/benchmarks.md, "Measured on an H200") and assumed the same on the
// other GPUs.
constexpr double kGemmEfficiency = 0.70;       // cuBLASLt bf16: 0.69 (the loss's GEMMs) to 0.78 measured
constexpr double kAttentionForwardEfficiency = 0.195;   // the tensor-core DFlash forward: 192.6 TFLOP/s measured
constexpr double kAttentionBackwardEfficiency = 0.114;  // its backward: 113 TFLOP/s measured
constexpr double kBandwidthEfficiency = 0.75;  // elementwise passes: streaming (not measured)
constexpr double kLossRowsEfficiency = 0.36;   // the loss's row passes: 57 ms for 6 × [32768, 248320] bf16 measured

// The delta-rule kernels as the dispatcher chooses them (kernels/cuda/deltanet_chunked.cu: dk 64 or 128, dv a
// multiple of 64; every pass fits sm_120's 99 KiB), else the per-token recurrence (kernels/cuda/deltanet.cu).
// The chunk-parallel kernel's model is docs/benchmarks.md's ("GPU model: the chunk-parallel gated delta rule"):
// passes 1 and 3 stream their bytes; pass 2 walks the chunks, each a chain of ~550 cycles (2 barriers, 8
// dependent mma) or its block's mma issue (8192·dk FLOPs at the SM's tensor rate), whichever is longer.
constexpr int kChunk = 64;
// Measured on an H200 at the seed's shard (S 8192, 12 value heads of 128): the state pass 2.8 µs a chunk (the
// model's chain said 550 cycles; 4900 measured), prepare 0.114 ms and output 0.078 ms a layer (0.155 and 0.31 of
// the bandwidth their bytes need), the per-token kernel 1.7 µs a token (bf16).
constexpr double kChainCycles = 4900;
constexpr double kPrepareEfficiency = 0.155, kOutputEfficiency = 0.31;
constexpr double kLaunchGap = 2.5e-6;  // between dependent kernels on one stream
constexpr double kTokenCycles = 2980;

double gemm_seconds(double flops, const GpuSpec& g) { return flops / (kGemmEfficiency * g.bf16_flops); }
double attention_seconds(double flops, const GpuSpec& g) {  // forward
  return flops / (kAttentionForwardEfficiency * g.bf16_flops);
}
double attention_backward_seconds(double flops, const GpuSpec& g) {
  return flops / (kAttentionBackwardEfficiency * g.bf16_flops);
}
double stream_seconds(double bytes, const GpuSpec& g) { return bytes / (kBandwidthEfficiency * g.memory_bw); }
// Ring all-reduce of `bytes` over n GPUs: each sends and receives 2(n−1)/n of it.
double allreduce_seconds(double bytes, int n, const GpuSpec& g) {
  return n <= 1 ? 0.0 : 2.0 * (n - 1) / n * bytes / g.link_bw + g.link_latency;
}

struct DeltaCost {
  double seconds = 0;
  std::string kernel;
};
// One Gated DeltaNet layer's delta rule over S tokens for a rank's key and value heads.
DeltaCost delta_rule_layer(const model::QwenConfig& c, int k_heads, int v_heads, int S, const GpuSpec& g) {
  const double dk = c.linear_k_dim, dv = c.linear_v_dim, KH = k_heads, VH = v_heads, T = S;
  if ((c.linear_k_dim == 64 || c.linear_k_dim == 128) && c.linear_v_dim % 64 == 0 && S >= 2) {
    const double chunks = std::ceil(T / kChunk), states = chunks * VH * dk * dv * 2;
    const double prepare = T * (KH * dk + VH * dv + VH * dk + VH * dv) * 2 / (kPrepareEfficiency * g.memory_bw);
    const double sm_rate = g.bf16_flops / (g.sms * g.clock);  // tensor FLOPs an SM a cycle
    const double blocks = VH * (dv / 32), waves = std::ceil(blocks / g.sms);
    const double chain = waves * chunks * std::max(kChainCycles, 8192.0 * dk / sm_rate) / g.clock;
    const double state = std::max(chain, stream_seconds(T * (VH * (dk + dv) + KH * dk + VH * dv) * 2 + states, g));
    const double output = (T * 2 * KH * dk * 2 + states + T * VH * dv * 2 * 2) / (kOutputEfficiency * g.memory_bw);
    return {prepare + state + output + 3 * kLaunchGap,
            fmt::format("chunk-parallel: {:.0f} state blocks, prepare/state/output {:.0f}/{:.0f}/{:.0f} us a layer",
                        blocks, prepare * 1e6, state * 1e6, output * 1e6)};
  }
  const double blocks = VH * std::ceil(dv / 32.0), waves = std::ceil(blocks / (4.0 * g.sms));
  return {waves * T * kTokenCycles / g.clock, "per token"};
}

struct RankTime {
  std::vector<TimePart> parts;
  std::string delta_kernel;
  double total() const {
    double t = 0;
    for (const auto& p : parts) t += p.second;
    return t;
  }
};

// One sequence's forward on TP rank `rank`.
RankTime target_rank_time(const BalanceInputs& in, int rank, const GpuSpec& g) {
  const model::QwenConfig& c = in.target;
  const model::TargetShard shard =
      model::plan_target_shard(c, in.target_tp, rank, model::TargetOptions{}.mlp_grain);
  const model::ShardCost cost = model::shard_cost(c, shard, in.seq_len);
  const double S = in.seq_len, H = c.hidden, I = double(shard.mlp_end - shard.mlp_begin);
  double attention = 0, delta = 0;
  std::string delta_kernel;
  for (int l = 0; l < c.layers; ++l) {
    if (c.is_linear(l)) {
      const DeltaCost d = delta_rule_layer(c, shard.linear.group_count, shard.linear.member_count, in.seq_len, g);
      delta += d.seconds;
      delta_kernel = d.kernel;
    } else {
      attention += attention_seconds(4.0 * c.head_dim * shard.q_count * S * S / 2, g);  // causal: S²/2 pairs
    }
  }
  // norms, residuals, SwiGLU, RoPE, conv, gates: about 12 [S, H] and 3 [S, I] bf16 passes a layer
  const double elementwise = stream_seconds(c.layers * S * (12 * H + 3 * I) * 2, g);
  // two all-reduces a layer (attention or DeltaNet out, MLP down) of [S, H]
  const double allreduce =
      2.0 * c.layers * allreduce_seconds(S * H * (in.bf16_allreduce ? 2 : 4), in.target_tp, g);
  RankTime t;
  t.parts = {{"GEMMs", gemm_seconds(2 * cost.weight_params * S, g)},
             {"attention", attention},
             {"delta rule", delta},
             {"elementwise", elementwise},
             {"TP all-reduce", allreduce}};
  t.delta_kernel = delta_kernel;
  return t;
}

// Anchors spread evenly over the sequence (what a uniform draw averages to), sorted.
std::vector<int> even_anchors(int S, int n, int block) {
  std::vector<int> a;
  const int span = std::max(1, S - block);
  for (int i = 0; i < n; ++i) a.push_back(int(int64_t(i) * span / std::max(1, n)));
  return a;
}

std::vector<TimePart> drafter_time(const BalanceInputs& in, int anchors, const GpuSpec& g) {
  const model::DrafterConfig& d = in.drafter;
  const int S = in.seq_len, B = d.block_size;
  const std::vector<int> a = even_anchors(S, anchors, B);
  const model::DrafterFlops f = model::drafter_flops(d, S, a);
  double pairs = 0;
  for (int l = 0; l < d.layers; ++l)
    pairs += double(kernels::dflash_attention_pairs(a.data(), model::drafter_attention_shape(d, l, S, int(a.size()))));
  const double attention_forward = 4.0 * d.head_dim * pairs, attention_backward = 10.0 * d.head_dim * pairs;
  const double gemm_flops = f.forward + f.backward - attention_forward - attention_backward;
  const double T = double(anchors) * (B - 1), H = d.hidden, V = d.vocab, F = 2 * T * H * V;
  const double loss_gemm = (in.fused_loss ? 2 : 3) * F + (in.kl ? (in.fused_loss ? 1 : 2) * F : 0.0);
  // the row passes over the chunk's logits (max, Σexp, the gradient; the KL's over the target's): bf16 logits
  const double loss_rows = T * V * 2 * (in.kl ? 6 : 4) / (kLossRowsEfficiency * g.memory_bw);
  const double NB = double(anchors) * B, I = d.intermediate;
  const double elementwise = stream_seconds(3.0 * d.layers * NB * (12 * H + 3 * I) * 2, g);
  // per step, shared by its micro-steps: the fp32 gradient all-reduce over the drafter ranks and AdamW (master
  // weights, moments, gradient, the bf16 copy: ~30 bytes a parameter)
  const double params = double(d.layers) * (H * (2.0 * d.heads * d.head_dim + 2.0 * d.kv_heads * d.head_dim) +
                                            3 * H * I + 4 * H) +
                        double(d.n_taps) * H * H + 2 * H;
  const double step = (allreduce_seconds(params * 4, in.drafter_dp, g) + stream_seconds(params * 30, g)) /
                      std::max(1, in.micro_batches);
  return {{"layers", gemm_seconds(gemm_flops, g) + elementwise},
          {"attention", attention_seconds(attention_forward, g) + attention_backward_seconds(attention_backward, g)},
          {"vocab loss", gemm_seconds(loss_gemm, g) + loss_rows},
          {"step share", step}};
}

double sum(const std::vector<TimePart>& parts) {
  double t = 0;
  for (const auto& p : parts) t += p.second;
  return t;
}

}  // namespace

BalanceInputs balance_inputs(const TrainConfig& cfg, const train::RunPlan& plan, int seq_len) {
  BalanceInputs in;
  in.target = plan.target;
  in.drafter = plan.drafter;
  in.target_tp = cfg.layout.target_tp;
  in.target_groups = cfg.layout.target_groups;
  in.drafter_dp = cfg.layout.drafter_dp;
  in.micro_batches = cfg.optim.micro_batches;
  in.seq_len = std::max(seq_len, plan.drafter.block_size + 1);
  in.anchors_per_seq = std::max(1, std::min(cfg.loss.anchors_per_seq, in.seq_len / 2));
  in.fused_loss = plan.loss.mode == model::VocabLossMode::fused;
  in.kl = plan.loss.kl_weight > 0;
  in.bf16_allreduce = cfg.layout.tp_allreduce == model::TpAllreduce::bf16;
  return in;
}

namespace {
struct Cycle {
  double idle = 0, rate = 0;  // the drafters' idle share; sequences a second
};
// The drafters' idle share and the job's rate alone (no suggestions: what predict_balance compares alternatives by).
Cycle predict_cycle(const BalanceInputs& in, const GpuSpec& gpu) {
  double target = 0;
  for (int r = 0; r < in.target_tp; ++r) target = std::max(target, target_rank_time(in, r, gpu).total());
  const double drafter = sum(drafter_time(in, in.anchors_per_seq, gpu));
  const double period = double((in.drafter_dp + in.target_groups - 1) / in.target_groups) * target;
  const double cycle = std::max(period, drafter);
  return {1.0 - drafter / cycle, in.drafter_dp / cycle};
}
double predict_balance_fixed(const BalanceInputs& in, const GpuSpec& gpu) { return predict_cycle(in, gpu).idle; }
}  // namespace

BalancePrediction predict_balance(const BalanceInputs& in, const GpuSpec& gpu) {
  BalancePrediction p;
  p.gpu = gpu.key;
  RankTime heaviest;
  for (int r = 0; r < in.target_tp; ++r) {
    RankTime t = target_rank_time(in, r, gpu);
    if (r == 0 || t.total() > heaviest.total()) heaviest = std::move(t);
  }
  p.target = heaviest.parts;
  p.delta_kernel = heaviest.delta_kernel;
  p.drafter = drafter_time(in, in.anchors_per_seq, gpu);
  p.target_seq = heaviest.total();
  p.drafter_step = sum(p.drafter);
  p.drafters_per_group = (in.drafter_dp + in.target_groups - 1) / in.target_groups;
  p.group_period = p.drafters_per_group * p.target_seq;
  const double cycle = std::max(p.group_period, p.drafter_step);
  p.drafter_idle = cycle > 0 ? 1.0 - p.drafter_step / cycle : 0.0;
  p.rate = cycle > 0 ? in.drafter_dp / cycle : 0.0;
  p.target_idle = cycle > 0 ? 1.0 - p.group_period / cycle : 0.0;
  if (p.drafter_idle > 0) {
    for (int g = in.target_groups + 1; g <= in.drafter_dp; ++g)
      if (1.0 - p.drafter_step / std::max((in.drafter_dp + g - 1) / g * p.target_seq, p.drafter_step) <=
          kIdleWarning) {
        p.balanced_groups = g;
        break;
      }
    // the same target GPUs in other TP groups: fewer ranks a group, more groups (a target that fits fewer GPUs)
    const int gpus = in.target_tp * in.target_groups;
    for (int tp = 1; tp <= gpus; ++tp) {
      if (gpus % tp != 0 || tp == in.target_tp) continue;
      if (2.0 * double(target_rank_params(in.target, tp)) > 0.8 * gpu.memory) continue;
      BalanceInputs other = in;
      other.target_tp = tp;
      other.target_groups = gpus / tp;
      double idle = 1;
      try {
        idle = predict_balance_fixed(other, gpu);
      } catch (const Error&) {
        continue;  // a split the target's heads do not allow
      }
      if (idle <= kIdleWarning && (p.regrouped_tp == 0 || idle < p.regrouped_idle)) {
        p.regrouped_tp = tp;
        p.regrouped_groups = gpus / tp;
        p.regrouped_idle = idle;
      }
    }
    // the best split of the whole world by the model: every target_tp × target_groups + drafter_dp = world
    const int world = in.target_tp * in.target_groups + in.drafter_dp;
    for (int tp = 1; tp < world; ++tp) {
      if (2.0 * double(target_rank_params(in.target, tp)) > 0.8 * gpu.memory) continue;
      for (int groups = 1; tp * groups < world; ++groups) {
        BalanceInputs other = in;
        other.target_tp = tp;
        other.target_groups = groups;
        other.drafter_dp = world - tp * groups;
        Cycle c;
        try {
          c = predict_cycle(other, gpu);
        } catch (const Error&) {
          continue;  // a split the target's heads do not allow
        }
        if (c.rate > p.best_rate) {
          p.best_rate = c.rate;
          p.best_tp = tp;
          p.best_groups = groups;
          p.best_dp = other.drafter_dp;
        }
      }
    }
    // the drafter's time is affine in the anchors: a + b·N; N' fills the group's period
    const int n0 = in.anchors_per_seq, n1 = std::max(1, n0 / 2);
    const double t0 = p.drafter_step, t1 = sum(drafter_time(in, n1, gpu));
    const double b = n0 > n1 ? (t0 - t1) / (n0 - n1) : 0;
    if (b > 0) p.balanced_anchors = int((p.group_period - (t0 - b * n0)) / b) / 64 * 64;
  }
  return p;
}

std::string format_balance(const BalanceInputs& in, const std::vector<BalancePrediction>& rows, bool with_warnings) {
  auto parts = [](const std::vector<TimePart>& ps) {
    std::string s;
    for (const auto& [what, t] : ps) s += fmt::format("{}{} {:.3f}", s.empty() ? "" : ", ", what, t);
    return s;
  };
  std::string out = fmt::format(
      "(predicted from counted work at data-sheet rates, docs/benchmarks.md; unverified on GPU):\n"
      "                 S {} tokens a sequence, {} anchors x block {}, {} loss{}; TP {} x {} group(s) feeding {} "
      "drafter rank(s), {} micro-batch(es) a step\n",
      in.seq_len, in.anchors_per_seq, in.drafter.block_size, in.fused_loss ? "fused" : "recompute",
      in.kl ? " + KL" : "", in.target_tp, in.target_groups, in.drafter_dp, in.micro_batches);
  std::string warnings;
  for (const BalancePrediction& p : rows) {
    const GpuSpec& g = gpu_spec(p.gpu);
    out += fmt::format("    {:<13} target {:.3f} s a sequence [{}]{}\n", p.gpu, p.target_seq, parts(p.target),
                       p.delta_kernel.empty() ? "" : fmt::format("; delta rule {}", p.delta_kernel));
    out += fmt::format("    {:<13} drafter {:.3f} s a micro-step [{}]; the group needs {} x {:.3f} = {:.3f} s: "
                       "drafters idle {:.0f} %, target idle {:.0f} %; {:.2f} sequences a second\n",
                       "", p.drafter_step, parts(p.drafter), p.drafters_per_group, p.target_seq, p.group_period,
                       100 * p.drafter_idle, 100 * p.target_idle, p.rate);
    if (p.drafter_idle > kIdleWarning) {
      std::string fix;
      if (p.balanced_groups > 0)
        fix = fmt::format("layout.target_groups {} ({} ranks)", p.balanced_groups,
                          in.target_tp * p.balanced_groups + in.drafter_dp);
      else if (in.target_groups < in.drafter_dp)  // even a group per drafter leaves them waiting: say how much
        fix = fmt::format("layout.target_groups {} ({} ranks: still {:.0f} % idle)", in.drafter_dp,
                          in.target_tp * in.drafter_dp + in.drafter_dp, 100 * (1 - p.drafter_step / p.target_seq));
      if (p.regrouped_tp > 0)
        fix += fmt::format("{}layout.target_tp {} x target_groups {} (the same {} target GPUs: {:.0f} % idle)",
                           fix.empty() ? "" : ", or ", p.regrouped_tp, p.regrouped_groups,
                           in.target_tp * in.target_groups, 100 * p.regrouped_idle);
      if (p.balanced_anchors > in.anchors_per_seq && p.balanced_anchors <= in.seq_len / 2)
        fix += fmt::format("{}loss.anchors_per_seq {} (more drafter work a sequence; check its memory with --set)",
                           fix.empty() ? "" : ", or ", p.balanced_anchors);
      if (fix.empty()) fix = "a faster target (more TP ranks per group) or a larger drafter.block_size";
      warnings += fmt::format("  warning: on {} ({}) the drafters would wait {:.0f} % of the time for features: {} "
                              "would balance it\n",
                              p.gpu, g.name, 100 * p.drafter_idle, fix);
      if (p.best_rate > 1.1 * p.rate && (p.best_tp != in.target_tp || p.best_groups != in.target_groups))
        warnings += fmt::format("           the same {} ranks train the most sequences a second, by the model, as "
                                "layout.target_tp {} x target_groups {} + drafter_dp {}: {:.2f} against {:.2f} now\n",
                                in.target_tp * in.target_groups + in.drafter_dp, p.best_tp, p.best_groups, p.best_dp,
                                p.best_rate, p.rate);
    }
  }
  return with_warnings ? out + warnings : out;
}

report::CheckItem balance_item(const TrainConfig& cfg, const train::RunPlan& plan, int64_t mean_seq_len,
                               const std::vector<std::string>& gpus) {
  std::vector<std::string> keys = gpus;
  if (keys.empty()) {
    keys = {"h200", "rtx-pro-6000"};
    const GpuSpec* here = kernels::cuda_available() ? gpu_spec_for_device(kernels::cuda_device_name()) : nullptr;
    if (here && std::find(keys.begin(), keys.end(), here->key) == keys.end()) keys.push_back(here->key);
  }
  const int S = int(cfg.data.max_seq_len > 0 ? std::min<int64_t>(mean_seq_len, cfg.data.max_seq_len) : mean_seq_len);
  const BalanceInputs in = balance_inputs(cfg, plan, S);
  std::vector<BalancePrediction> rows;
  for (const std::string& k : keys) rows.push_back(predict_balance(in, gpu_spec(k)));
  const bool warnings = cfg.run.device == kernels::Device::cuda || !gpus.empty();
  return {"pipeline balance", report::lines_of(format_balance(in, rows, warnings))};
}

}  // namespace dflash::preflight
