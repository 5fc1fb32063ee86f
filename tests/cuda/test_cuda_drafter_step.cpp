// The trainer's drafter step (lib/train/drafter_step.h) on the CUDA backend, fed packets the two ways a GPU rank
// gets them (lib/train/packet.h): host packets (the MPI data plane: uploaded by the step) and device packets (the
// NCCL data plane: read in place, or converted on the device for bf16). Test-case names start with
// "cuda twin drafter_step:" (tests/cuda/CMakeLists.txt).
//
// Bounds: a device packet holds the same floats as the host one, and the step runs the same kernels on them, so
// host vs device packets agree bit for bit (losses, gradient norm, weights after AdamW), in fp32 and in bf16. CUDA
// fp32 vs the CPU: 1e-4 relative on the loss and the gradient norm (the bound gpu_check.sh uses for the tiny run).
#include <doctest/doctest.h>

#if DFLASH_WITH_CUDA
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "lib/comm/transport.h"
#include "lib/core/rng.h"
#include "lib/train/drafter_step.h"
#include "lib/train/packet.h"
#include "tests/unit/test_util.h"

using namespace dflash;

namespace {

struct Run {
  std::vector<double> losses, grad_norms;
  std::vector<float> weights;  // after the last step
};

// Two steps of two micro-batches each on one rank; the packets' tensors in `memory`.
Run run_steps(kernels::Device device, PrecisionChoice precision, MemoryKind memory) {
  const model::DrafterConfig c = test::small_drafter_config();
  TrainConfig cfg;
  cfg.run.device = device;
  cfg.run.precision = precision;
  cfg.run.seed = 11;
  cfg.layout.drafter_dp = 1;
  cfg.loss.anchors_per_seq = 3;
  cfg.optim.micro_batches = 2;
  cfg.optim.lr = 1e-3;
  train::RunPlan plan;
  plan.drafter = c;
  plan.loss.chunk_size = 7;
  plan.loss.kl_weight = 0.5;  // reads the final hidden too
  plan.loss.cap_weight = 0.1;
  plan.loss.block_size = c.block_size;
  plan.decay_gamma = 4;
  plan.total_steps = 2;
  const std::vector<float> embed = test::random_floats(size_t(c.vocab) * c.hidden, 1, 0.5);
  const std::vector<float> head = test::random_floats(size_t(c.vocab) * c.hidden, 2, 0.5);
  comm::SelfTransport dp;
  train::DrafterStep step(cfg, plan, embed.data(), head.data(), 0, dp);

  train::FeaturePacket pk;
  auto next_packet = [&](int micro, double*) -> const train::FeaturePacket& {
    const int S = 24 + 5 * micro;
    train::PacketHeader h;
    h.seq_index = micro;
    h.micro = micro;
    h.seq_len = S;
    h.tap_width = c.n_taps * c.hidden;
    h.hidden = c.hidden;
    pk.allocate(h, memory);
    Rng rng(uint64_t(100 + micro));
    for (int i = 0; i < S; ++i) {
      pk.tokens[size_t(i)] = int32_t(rng.below(uint64_t(c.vocab - 1)));
      pk.loss_mask[size_t(i)] = i >= 4;
    }
    const std::vector<float> taps = test::random_floats(pk.taps.size(), 200 + micro, 1.0);
    const std::vector<float> fin = test::random_floats(pk.final_hidden.size(), 300 + micro, 1.0);
    pk.taps.assign(taps.data(), taps.size());
    pk.final_hidden.assign(fin.data(), fin.size());
    return pk;
  };
  Run out;
  for (int k = 0; k < 2; ++k) {
    const train::StepResult r = step.run(k, next_packet);
    REQUIRE_FALSE(r.skipped);
    out.losses.push_back(r.sums.loss / r.sums.weight);
    out.grad_norms.push_back(r.grad_norm);
  }
  out.weights = step.params().flat;
  return out;
}

bool same_bits(const Run& a, const Run& b) {
  return a.losses == b.losses && a.grad_norms == b.grad_norms && a.weights.size() == b.weights.size() &&
         std::memcmp(a.weights.data(), b.weights.data(), a.weights.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("cuda twin drafter_step: fp32 and bf16 steps from host and from device packets") {
  const Run cpu = run_steps(kernels::Device::cpu, PrecisionChoice::fp32, MemoryKind::host);
  const Run host32 = run_steps(kernels::Device::cuda, PrecisionChoice::fp32, MemoryKind::host);
  const Run dev32 = run_steps(kernels::Device::cuda, PrecisionChoice::fp32, MemoryKind::device);
  CHECK_MESSAGE(same_bits(host32, dev32), "fp32: a device packet must give the host packet's step bit for bit");
  for (size_t k = 0; k < cpu.losses.size(); ++k) {
    CAPTURE(k);
    CHECK(std::abs(host32.losses[k] - cpu.losses[k]) <= 1e-4 * std::abs(cpu.losses[k]));
    CHECK(std::abs(host32.grad_norms[k] - cpu.grad_norms[k]) <= 1e-4 * std::abs(cpu.grad_norms[k]));
  }
  CHECK(test::max_rel_diff(host32.weights, cpu.weights) <= 1e-4);
  const Run host16 = run_steps(kernels::Device::cuda, PrecisionChoice::bf16, MemoryKind::host);
  const Run dev16 = run_steps(kernels::Device::cuda, PrecisionChoice::bf16, MemoryKind::device);
  CHECK_MESSAGE(same_bits(host16, dev16), "bf16: a device packet must give the host packet's step bit for bit");
  CHECK(std::isfinite(host16.losses.back()));
}

TEST_CASE("cuda twin drafter_step: a packet tensor in device memory round-trips and keeps its allocation") {
  train::PacketTensor t;
  t.reshape(MemoryKind::device, 1000);
  const float* first = t.data();
  const std::vector<float> v = test::random_floats(600, 5, 1.0);
  t.assign(v.data(), v.size());
  CHECK(t.memory() == MemoryKind::device);
  CHECK(t.data() == first);
  CHECK(t.to_host() == v);
}
#endif
