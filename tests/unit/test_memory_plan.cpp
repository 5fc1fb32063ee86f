// The per-GPU memory plan of a cuda run: the seed's configuration (a 27B-class target on 5 GPUs, the drafter with
// 1024 anchors × block 32, H 5120, V 248320, chunk 2048) must fit on 95 GB and 141 GB cards in bf16 (the target's
// weights and activations in the compute precision too).
#include <doctest/doctest.h>

#include "lib/model/drafter.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"
#include "lib/preflight/memory_plan.h"

using namespace dflash;
using namespace dflash::preflight;

namespace {

MemoryPlanInputs seed_inputs(bool bf16) {
  MemoryPlanInputs in;
  // Qwen3-32B as the stand-in for the 27B hybrid target's size (it is the larger of the two)
  in.target.hidden = 5120;
  in.target.layers = 64;
  in.target.heads = 64;
  in.target.kv_heads = 8;
  in.target.head_dim = 128;
  in.target.intermediate = 25600;
  in.target.vocab = 248320;
  in.target_tp = 5;
  in.target.layer_types.assign(64, model::LayerType::full_attention);
  in.target_rank_params = target_rank_params(in.target, 5);
  model::DrafterConfig& d = in.drafter;
  d.hidden = 5120;
  d.layers = 5;
  d.heads = 32;
  d.kv_heads = 8;
  d.head_dim = 128;
  d.intermediate = 17408;
  d.block_size = 32;
  d.n_taps = 5;
  d.vocab = 248320;
  d.mask_token_id = 248070;
  d.window = {2048, 2048, 2048, 2048, 0};
  in.max_seq_len = 8192;
  in.anchors_per_seq = 1024;
  in.chunk_size = 2048;
  in.kl = false;
  in.bf16 = bf16;
  return in;
}

}  // namespace

TEST_CASE("memory plan: the seed's configuration fits on 95 GB and 141 GB GPUs in bf16") {
  const GpuMemoryPlan plan = gpu_memory_plan(seed_inputs(true));
  const std::string table = preflight::format_gpu_memory_plan(plan, preflight::default_gpus());
  MESSAGE(table);
  // the largest shard of a 64-layer 5120-wide target over 5 ranks: about a fifth of the layers' weights
  CHECK(plan.target.total() > 10e9);
  CHECK(plan.target.total() < 40e9);
  CHECK(plan.drafter.total() > 40e9);  // activations of 32768 positions and 1.7 B parameters with AdamW
  CHECK(plan.drafter.total() < 95e9);
  CHECK(table.find("fits on RTX PRO 6000 Blackwell") != std::string::npos);
  CHECK(table.find("fits on H200") != std::string::npos);
  CHECK(table.find("DOES NOT FIT") == std::string::npos);
}

TEST_CASE("memory plan: the activation item is the drafter's arena formula, and fp32 activations do not fit 95 GB") {
  const MemoryPlanInputs in = seed_inputs(false);
  const GpuMemoryPlan plan = gpu_memory_plan(in);
  bool found = false;
  for (const MemoryItem& i : plan.drafter.items)
    if (i.what.rfind("activations", 0) == 0) {
      found = true;
      CHECK(i.bytes == double(model::drafter_arena_bytes(in.drafter, 8192, 1024, 4, 4)));
    }
  CHECK(found);
  CHECK(plan.drafter.total() > 95e9);
  CHECK(preflight::format_gpu_memory_plan(plan, preflight::default_gpus()).find("DOES NOT FIT on RTX PRO 6000") !=
        std::string::npos);
}

TEST_CASE("memory plan: the target's weights and activations are counted in the compute precision") {
  for (bool bf16 : {true, false}) {
    CAPTURE(bf16);
    const MemoryPlanInputs in = seed_inputs(bf16);
    const GpuMemoryPlan plan = gpu_memory_plan(in);
    double weights = -1, activations = -1;
    for (const MemoryItem& i : plan.target.items) {
      if (i.what.rfind("weights", 0) == 0) weights = i.bytes;
      if (i.what.rfind("activations", 0) == 0) activations = i.bytes;
    }
    CHECK(weights == double(in.target_rank_params) * (bf16 ? 2 : 4));
    // the arena of the target's own bind lists (model::target_activation_bytes), for the rank that needs the most
    CHECK(activations == double(target_rank_activation_bytes(in.target, 5, 8192, bf16, true)));
    // the arena holds at least rank 0's residual stream, normed input, partial sum [S, H], MLP gate/up [S, ic] and
    // its attention's q, k, v, output [S, heads·D]; with its alignment and the norm statistics, not much more
    const model::TargetShard r0 = model::plan_target_shard(in.target, 5, 0, model::TargetOptions{}.mlp_grain);
    const double act = bf16 ? 2 : 4, S = 8192, H = 5120, D = 128, ic = double(r0.mlp_end - r0.mlp_begin);
    const double floor = S * act * (3 * H + 2 * ic + D * (2 * r0.q_count + 2 * r0.kv_count));
    MESSAGE("target arena " << activations / 1e9 << " GB, arrays " << floor / 1e9 << " GB");
    CHECK(activations >= floor);
    CHECK(activations <= floor * 1.1 + S * H * 4);  // + the fp32 [S, H] scratch of bf16
  }
  // bf16 halves the target rank's weights: the seed's largest shard (about a fifth of 32 B parameters) in ~13 GB
  const GpuMemoryPlan b = gpu_memory_plan(seed_inputs(true)), f = gpu_memory_plan(seed_inputs(false));
  CHECK(b.target.total() < 0.6 * f.target.total());
  CHECK(b.target.total() < 20e9);
}
