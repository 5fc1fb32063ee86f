// The pipeline-balance prediction of --check (lib/preflight/pipeline_balance.h) at the seed's run: a Qwen3.6-27B
// target (mpi_launch/configs/qwen3_6_27b_target/config.json) on TP 5 feeding three drafters of the published
// shape at 512 anchors × block 16, S 8192. Its figures are predictions; these tests pin the model's arithmetic and
// its conclusions, not a GPU's behaviour.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "lib/core/error.h"
#include "lib/model/qwen_config.h"
#include "lib/preflight/gpu_specs.h"
#include "lib/preflight/pipeline_balance.h"

namespace {

using namespace dflash;

preflight::BalanceInputs seed_inputs() {
  preflight::BalanceInputs in;
  in.target = model::load_qwen_config(std::string(DFLASH_GOLDEN_DIR) + "/../../mpi_launch/configs/qwen3_6_27b_target");
  model::DrafterConfig& d = in.drafter;
  d.hidden = 5120, d.layers = 5, d.heads = 32, d.kv_heads = 8, d.head_dim = 128, d.intermediate = 17408;
  d.block_size = 16, d.n_taps = 5, d.vocab = in.target.vocab, d.mask_token_id = 248070, d.rope_theta = 1e7;
  d.window = {2048, 2048, 2048, 2048, 0};
  in.target_tp = 5, in.target_groups = 1, in.drafter_dp = 3, in.micro_batches = 10;
  in.seq_len = 8192, in.anchors_per_seq = 512, in.fused_loss = true, in.kl = false, in.bf16_allreduce = true;
  return in;
}

double part(const std::vector<preflight::TimePart>& parts, const std::string& what) {
  for (const auto& [name, t] : parts)
    if (name == what) return t;
  FAIL("no part named " << what);
  return 0;
}

}  // namespace

TEST_CASE("pipeline balance: the seed's run on an H200 starves its drafters, by the model") {
  const preflight::BalanceInputs in = seed_inputs();
  const preflight::BalancePrediction p = preflight::predict_balance(in, preflight::gpu_spec("h200"));
  MESSAGE(preflight::format_balance(in, {p}));
  // the target's heaviest TP rank: GEMMs of its shard, the 48 DeltaNet layers' chunk-parallel delta rule
  // (calibrated to an H200's 0.549 ms a layer at 12 value heads, 26.4 ms a forward: docs/benchmarks.md; the
  // state pass is one wave at 9 or 12 heads), the bf16 all-reduce of 2 × 64 layers × [8192, 5120] over 5 ranks
  CHECK(part(p.target, "GEMMs") == doctest::Approx(0.116).epsilon(0.01));
  CHECK(part(p.target, "delta rule") > 0.020);
  CHECK(part(p.target, "delta rule") < 0.030);
  CHECK(part(p.target, "TP all-reduce") == doctest::Approx(128 * (1.6 * 8192 * 5120 * 2 / 450e9 + 10e-6)));
  CHECK(p.delta_kernel.find("chunk-parallel") == 0);
  CHECK(p.drafters_per_group == 3);
  CHECK(p.group_period == doctest::Approx(3 * p.target_seq));
  CHECK(p.drafter_idle > preflight::kIdleWarning);  // the 65 %: one group cannot feed three drafters
  CHECK(p.drafter_idle == doctest::Approx(1 - p.drafter_step / p.group_period));
  CHECK(p.target_idle == 0.0);
  const std::string table = preflight::format_balance(in, {p});
  CHECK(table.find("warning: on h200") != std::string::npos);

  // a group per drafter: each drafter waits for one sequence's forward only where it is longer than its own step;
  // the anchors the warning suggests fill the wait with one group
  preflight::BalanceInputs more_groups = in;
  more_groups.target_groups = 3;
  const preflight::BalancePrediction g = preflight::predict_balance(more_groups, preflight::gpu_spec("h200"));
  CHECK(g.drafter_idle == doctest::Approx(std::max(0.0, 1 - p.drafter_step / p.target_seq)));
  CHECK(g.drafter_idle < p.drafter_idle);
  CHECK(p.balanced_groups == (g.drafter_idle <= preflight::kIdleWarning ? 3 : 0));
  REQUIRE(p.balanced_anchors > in.anchors_per_seq);
  preflight::BalanceInputs more_anchors = in;
  more_anchors.anchors_per_seq = p.balanced_anchors;
  const preflight::BalancePrediction q = preflight::predict_balance(more_anchors, preflight::gpu_spec("h200"));
  CHECK(q.drafter_idle <= preflight::kIdleWarning);
  CHECK(q.target_seq == doctest::Approx(p.target_seq));  // the target's work does not depend on the anchors
}

TEST_CASE("pipeline balance: the RTX PRO 6000: the chunk-parallel delta rule, the all-reduce over PCIe") {
  const preflight::BalanceInputs in = seed_inputs();
  const preflight::BalancePrediction h = preflight::predict_balance(in, preflight::gpu_spec("h200"));
  const preflight::BalancePrediction r = preflight::predict_balance(in, preflight::gpu_spec("rtx-pro-6000"));
  CHECK(r.delta_kernel.find("chunk-parallel") == 0);  // every pass fits 99 KiB (2 stages)
  // the H200's measured efficiencies at the RTX PRO 6000's rates (not measured there)
  CHECK(part(r.target, "delta rule") > part(h.target, "delta rule"));
  CHECK(part(r.target, "delta rule") < 2 * part(h.target, "delta rule"));
  // fp32 (or an odd shape) runs the per-token kernel: ~100–140 ms a forward by the same docs
  preflight::BalanceInputs odd = in;
  odd.target.linear_k_dim = 96;
  const preflight::BalancePrediction o = preflight::predict_balance(odd, preflight::gpu_spec("h200"));
  CHECK(o.delta_kernel == "per token");
  CHECK(part(o.target, "delta rule") > 10 * part(h.target, "delta rule"));
  // PCIe instead of NVLink: the all-reduce an order of magnitude slower
  CHECK(part(r.target, "TP all-reduce") > 5 * part(h.target, "TP all-reduce"));
  // half the tensor rate: the drafter's GEMM-bound parts twice as long
  CHECK(part(r.drafter, "vocab loss") > 1.5 * part(h.drafter, "vocab loss"));
}

TEST_CASE("pipeline balance: one group per drafter, unknown GPUs refused, device names mapped") {
  preflight::BalanceInputs in = seed_inputs();
  in.target_groups = 3;  // one group per drafter
  const preflight::BalancePrediction p = preflight::predict_balance(in, preflight::gpu_spec("b200"));
  CHECK(p.drafters_per_group == 1);
  CHECK(p.group_period == doctest::Approx(p.target_seq));
  CHECK_THROWS_WITH_AS(preflight::gpu_spec("h300"), doctest::Contains("h100, h200, b200, rtx-pro-6000"),
                       dflash::Error);
  CHECK(preflight::gpu_spec_for_device("NVIDIA H200") == &preflight::gpu_spec("h200"));
  CHECK(preflight::gpu_spec_for_device("NVIDIA RTX PRO 6000 Blackwell Server Edition") ==
        &preflight::gpu_spec("rtx-pro-6000"));
  CHECK(preflight::gpu_spec_for_device("dflash emulated GPU (sm_90, H100/H200, on the CPU)") == nullptr);
}
