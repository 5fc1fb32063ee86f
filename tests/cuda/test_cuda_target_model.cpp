// The whole target forward (lib/model/target.h) on the CUDA backend against the same model on the CPU backend:
// weights in device Buffers, activations in the device arena, the incremental-decoding cache in device Buffers.
// Dense Qwen3 and a Qwen3.5 hybrid, a plain forward (taps + final hidden), a cached forward in pieces (every cache
// array read back), and the speculative decoders' cache operations on the device cache: a hybrid rollback
// (truncate + restore_recurrent + re-run), copy_cache, and keep_cache_path's row compaction. Then the bf16 target
// (TargetOptions::precision bf16: bf16 weights and activations on CUDA) against the CPU fp32 target, and the
// forward whose outputs stay in device memory against the host-output one; the RoPE angles of the backend's cos/sin
// table against the CPU's, bit for bit; split-K of the CUDA-core cached attention. Test-case names start with
// "cuda twin target_model:" (tests/cuda/CMakeLists.txt).
//
// Tolerance: max |gpu − cpu| / max |cpu| ≤ 1e-4 over each output, the bound gpu_check.sh uses for the tiny run's
// losses. Every kernel on the way is checked against its CPU twin with a per-element bound (test_cuda_twins.cpp);
// here 4 layers of H = 32 compound those (fp32 GEMMs over ≤ 48 terms, RMSNorm over 32) far below 1e-4.
#include <doctest/doctest.h>

#if DFLASH_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/launch.h"
#include "lib/comm/transport.h"
#include "lib/core/buffer.h"
#include "lib/core/error.h"
#include "lib/core/named_enum.h"
#include "lib/core/rng.h"
#include "lib/model/random_target.h"
#include "lib/model/target.h"
#include "tests/unit/test_util.h"

using namespace dflash;

namespace {

model::RandomTargetSpec tiny_target(bool hybrid) { return test::small_random_target(hybrid, 4, 4); }

// A tiny random target written to the scratch folder `name`, opened twice: on the CPU (fp32) and on CUDA in
// `precision`. Not movable: the models keep references to their transports.
struct TargetPair {
  model::RandomTargetSpec spec;
  std::string dir;
  comm::SelfTransport self_cpu, self_gpu;
  model::TargetModel cpu, gpu;

  TargetPair(bool hybrid, const std::string& name, kernels::Precision precision)
      : spec(tiny_target(hybrid)), dir(written(spec, name)), cpu(dir, self_cpu), gpu(dir, self_gpu, on_cuda(precision)) {}
  static std::string written(const model::RandomTargetSpec& spec, const std::string& name) {
    const std::string dir = test::scratch_dir(name).string();
    model::write_random_target(dir, spec);
    return dir;
  }
  static model::TargetOptions on_cuda(kernels::Precision precision) {
    model::TargetOptions options;
    options.device = kernels::Device::cuda;
    options.precision = precision;
    return options;
  }
};

}  // namespace

TEST_CASE("cuda twin target_model: forward and cached forward on CUDA match the CPU target (dense and hybrid)") {
  for (bool hybrid : {false, true}) {
    CAPTURE(hybrid);
    TargetPair pair(hybrid, hybrid ? "cuda_target_hybrid" : "cuda_target_dense", kernels::Precision::fp32);
    const model::RandomTargetSpec& spec = pair.spec;
    model::TargetModel &cpu = pair.cpu, &gpu = pair.gpu;
    REQUIRE(std::string(gpu.backend_name()) == "cuda");
    REQUIRE(std::string(gpu.precision()) == "fp32");
    REQUIRE(gpu.memory() == MemoryKind::device);
    CHECK(gpu.weight_bytes() == cpu.weight_bytes());

    const int S = 140, H = spec.hidden;
    const std::vector<int> tap_ids = {0, 2, 3};
    const int n_taps = int(tap_ids.size());
    std::vector<int32_t> tokens(static_cast<size_t>(S));
    Rng rng(12);
    for (auto& t : tokens) t = int32_t(rng.below(uint64_t(spec.vocab)));
    std::vector<float> taps_c(size_t(S) * n_taps * H), fh_c(size_t(S) * H), taps_g(taps_c.size()), fh_g(fh_c.size());
    cpu.forward(tokens.data(), S, tap_ids, taps_c.data(), fh_c.data());
    gpu.forward(tokens.data(), S, tap_ids, taps_g.data(), fh_g.data());
    CHECK(test::max_rel_diff(taps_g, taps_c) < 1e-4);
    CHECK(test::max_rel_diff(fh_g, fh_c) < 1e-4);

    // the same sequence in pieces through the (device) cache: pieces shorter than the conv kernel and across the
    // delta rule's chunk of 64; the buffers grow several times on the way
    model::TargetCache cache_c, cache_g;
    std::vector<float> pieces_c(fh_c.size()), pieces_g(fh_c.size());
    int b = 0;
    for (int n : {1, 2, 70, 1, 66}) {
      cpu.forward_cached(&tokens[size_t(b)], n, cache_c, &pieces_c[size_t(b) * H]);
      gpu.forward_cached(&tokens[size_t(b)], n, cache_g, &pieces_g[size_t(b) * H]);
      b += n;
    }
    CHECK(cache_g.length == S);
    CHECK(test::max_rel_diff(pieces_g, pieces_c) < 1e-4);
    CHECK(cache_g.keys[size_t(hybrid ? 3 : 0)].kind() == MemoryKind::device);
    using Part = model::TargetCachePart;
    auto check_cache = [&](const model::TargetCache& g, const model::TargetCache& c) {
      for (int l = 0; l < spec.layers; ++l) {
        CAPTURE(l);
        for (Part part : {Part::keys, Part::values, Part::conv_tail, Part::delta_state}) {
          const std::vector<float> want = cpu.read_cache(c, l, part), got = gpu.read_cache(g, l, part);
          REQUIRE(got.size() == want.size());
          if (!want.empty()) CHECK(test::max_rel_diff(got, want) < 1e-4);
        }
      }
    };
    check_cache(cache_g, cache_c);

    // a speculative rollback on both: snapshot the recurrent part, verify 4 positions, keep 2 (truncate, restore,
    // re-run the 2 kept inputs: hybrids) — then the next position must match
    const int32_t block[4] = {5, 9, 2, 7};
    model::TargetRecurrentState before_c, before_g;
    std::vector<float> block_c(4 * size_t(H)), block_g(block_c.size());
    for (auto [target, cache, before, out] : {std::tuple{&cpu, &cache_c, &before_c, &block_c},
                                              std::tuple{&gpu, &cache_g, &before_g, &block_g}}) {
      target->save_recurrent(*cache, *before);
      CHECK(before->conv_tail.empty() == !hybrid);
      target->forward_cached(block, 4, *cache, out->data());
      cache->truncate(S + 2);
      if (hybrid) {
        cache->truncate(S);
        target->restore_recurrent(*cache, *before);
        target->forward_cached(block, 2, *cache, out->data());
      }
      CHECK(cache->length == S + 2);
    }
    CHECK(test::max_rel_diff(block_g, block_c) < 1e-4);
    check_cache(cache_g, cache_c);
    const int32_t next = 11;
    std::vector<float> next_c(static_cast<size_t>(H)), next_g(static_cast<size_t>(H));
    cpu.forward_cached(&next, 1, cache_c, next_c.data());
    gpu.forward_cached(&next, 1, cache_g, next_g.data());
    CHECK(test::max_rel_diff(next_g, next_c) < 1e-4);

    // copy_cache, then keep_cache_path's compaction of the last 5 positions to rows {0, 2, 4} of them (device
    // copies on CUDA, host ones on the CPU): the same rows on both, and the copies' originals untouched
    model::TargetCache kept_c = cpu.copy_cache(cache_c), kept_g = gpu.copy_cache(cache_g);
    const int past = cache_c.length - 5;
    cpu.keep_cache_path(kept_c, past, {0, 2, 4});
    gpu.keep_cache_path(kept_g, past, {0, 2, 4});
    CHECK(kept_g.length == past + 3);
    check_cache(kept_g, kept_c);
    check_cache(cache_g, cache_c);
    if (!hybrid) {  // row past + 1 of the kept cache is row past + 2 of the original
      const size_t row = size_t(spec.kv_heads * spec.head_dim);
      const std::vector<float> orig = gpu.read_cache(cache_g, 0, Part::keys), kept = gpu.read_cache(kept_g, 0, Part::keys);
      CHECK(std::equal(kept.begin() + long((past + 1) * row), kept.begin() + long((past + 2) * row),
                       orig.begin() + long((past + 2) * row)));
    }

    // tree verification is a CPU kernel on host memory: a CUDA target refuses it with an error naming the backend
    if (!hybrid) {
      model::TargetCache tree_cache;
      const int parents[2] = {-1, 0};
      std::vector<float> tree_hidden(size_t(2) * H);
      CHECK_THROWS_WITH_AS(gpu.forward_tree(tokens.data(), parents, 2, tree_cache, {}, nullptr, tree_hidden.data()),
                           doctest::Contains("cuda backend"), Error);
    }
  }
}

// bf16 against the CPU fp32 target. Tolerance, from bf16's relative rounding 2^-9 (round to nearest; the twins'
// per-kernel bound counts 2^-8 per rounding): on the way from the embedding to an output each decoder layer rounds a
// value to bf16 at most ~16 times (the weights it reads, the normed input, the projections, q/k norm and RoPE, the
// attention or delta-rule output, the gate, SwiGLU, the down projection, each residual add); the statistics, the
// DeltaNet gates and state and every GEMM's accumulation are fp32. RMSNorm re-normalises each sub-block's input, so
// the relative errors add over the layers instead of compounding, and independent roundings add in quadrature:
// sqrt(16 · 4 layers) · 2^-9 ≈ 0.016 expected for the dense target, which the bound 1/16 covers 4×. The hybrid's
// Gated DeltaNet layers integrate every position's rounded k, v, q into their state (decayed by exp(g) per step), so
// their error grows with the position before the decay caps it: measured on the emulated GPU (the same bf16
// conversions and fp32 accumulation as a GPU), 0.005–0.012 for sequences of 1–4 tokens, saturating at 0.065–0.072
// from 16 tokens on (layer 0 alone: 0.059 at 64 tokens); the hybrid's bound is 1/8. A wrong layout, a missing
// rounding back from fp32 or a state kept in bf16 across 140 steps gives errors of order 1.
TEST_CASE("cuda twin target_model: the bf16 target on CUDA matches the CPU fp32 target (dense and hybrid)") {
  for (bool hybrid : {false, true}) {
    CAPTURE(hybrid);
    const double kBf16Bound = hybrid ? 1.0 / 8 : 1.0 / 16;
    TargetPair pair(hybrid, hybrid ? "cuda_bf16_target_hybrid" : "cuda_bf16_target_dense", kernels::Precision::bf16);
    const model::RandomTargetSpec& spec = pair.spec;
    model::TargetModel &cpu = pair.cpu, &gpu = pair.gpu;
    REQUIRE(std::string(gpu.precision()) == "bf16");
    CHECK(2 * gpu.weight_bytes() == cpu.weight_bytes());

    const int S = 140, H = spec.hidden;
    const std::vector<int> tap_ids = {0, 2, 3};
    std::vector<int32_t> tokens(static_cast<size_t>(S));
    Rng rng(12);
    for (auto& t : tokens) t = int32_t(rng.below(uint64_t(spec.vocab)));
    std::vector<float> taps_c(size_t(S) * 3 * H), fh_c(size_t(S) * H), taps_g(taps_c.size()), fh_g(fh_c.size());
    cpu.forward(tokens.data(), S, tap_ids, taps_c.data(), fh_c.data());
    gpu.forward(tokens.data(), S, tap_ids, taps_g.data(), fh_g.data());
    const double taps_err = test::max_rel_diff(taps_g, taps_c), fh_err = test::max_rel_diff(fh_g, fh_c);
    MESSAGE("bf16 vs fp32: taps ", taps_err, ", final hidden ", fh_err);
    CHECK(taps_err < kBf16Bound);
    CHECK(fh_err < kBf16Bound);
    CHECK(taps_err > 0);  // bf16 really ran: its rounding shows

    model::TargetCache cache_c, cache_g;
    std::vector<float> pieces_c(fh_c.size()), pieces_g(fh_c.size());
    int b = 0;
    for (int n : {1, 2, 70, 1, 66}) {
      cpu.forward_cached(&tokens[size_t(b)], n, cache_c, &pieces_c[size_t(b) * H]);
      gpu.forward_cached(&tokens[size_t(b)], n, cache_g, &pieces_g[size_t(b) * H]);
      b += n;
    }
    CHECK(test::max_rel_diff(pieces_g, pieces_c) < kBf16Bound);
    using Part = model::TargetCachePart;
    for (int l = 0; l < spec.layers; ++l) {
      CAPTURE(l);
      for (Part part : {Part::keys, Part::values, Part::conv_tail, Part::delta_state}) {
        const std::vector<float> want = cpu.read_cache(cache_c, l, part), got = gpu.read_cache(cache_g, l, part);
        REQUIRE(got.size() == want.size());
        if (!want.empty()) CHECK(test::max_rel_diff(got, want) < kBf16Bound);
      }
    }
  }
}

// The forward whose taps and final hidden stay in device memory (what the packet streaming calls) against the
// host-output forward on the same GPU target: the same kernels on the same inputs, then either a device conversion
// into the tap's columns or a download: bit for bit, fp32 and bf16.
TEST_CASE("cuda twin target_model: outputs in device memory equal the host outputs bit for bit (fp32 and bf16)") {
  for (bool hybrid : {false, true}) {
    const model::RandomTargetSpec spec = tiny_target(hybrid);
    const auto dir = test::scratch_dir(hybrid ? "cuda_outputs_hybrid" : "cuda_outputs_dense");
    model::write_random_target(dir.string(), spec);
    for (const kernels::Precision precision : {kernels::Precision::fp32, kernels::Precision::bf16}) {
      CAPTURE(hybrid);
      CAPTURE(name_of(precision));
      comm::SelfTransport self;
      model::TargetOptions options;
      options.device = kernels::Device::cuda;
      options.precision = precision;
      model::TargetModel gpu(dir.string(), self, options);
      const int S = 77, H = spec.hidden;
      const std::vector<int> tap_ids = {3, 1};
      std::vector<int32_t> tokens(static_cast<size_t>(S));
      Rng rng(4);
      for (auto& t : tokens) t = int32_t(rng.below(uint64_t(spec.vocab)));
      std::vector<float> taps(size_t(S) * 2 * H), fh(size_t(S) * H);
      gpu.forward(tokens.data(), S, tap_ids, taps.data(), fh.data());
      Buffer d_taps(MemoryKind::device, taps.size() * sizeof(float)), d_fh(MemoryKind::device, fh.size() * sizeof(float));
      gpu.forward(tokens.data(), S, tap_ids, d_taps.as<float>(), d_fh.as<float>(), MemoryKind::device);
      std::vector<float> got_taps(taps.size()), got_fh(fh.size());
      auto be = kernels::make_cuda_backend<float>();  // a plain device → host copy
      be->download(be->context(), got_taps.data(), d_taps.data(), taps.size() * sizeof(float));
      be->download(be->context(), got_fh.data(), d_fh.data(), fh.size() * sizeof(float));
      CHECK(std::memcmp(got_taps.data(), taps.data(), taps.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(got_fh.data(), fh.data(), fh.size() * sizeof(float)) == 0);
    }
  }
}


// The RoPE angles of the target's (and the drafter's) attention come from the CUDA backend's cos/sin table
// (kernels/cuda/launch.h, RopeTable: positions [0, 16384), made once per (rot_dim, theta)) and are evaluated in
// double past it: either way the CPU's bits. Every input pair is (1, 0), so RoPE's output pair is exactly (cos, sin)
// (1·c − 0·s and 0·c + 1·s, with or without FMA contraction): the outputs compare bit for bit. The fused head
// norm + RoPE on the same inputs (w = 1) gives (n·c, n·s) for the head's normed value n (its output at position 0,
// where c = 1, s = 0): fl(n · c) bit for bit too. Positions in, at the end of, and past the table, both directions.
TEST_CASE("cuda twin target_model: RoPE cos/sin from the backend's table are the CPU's bits, in and past the table") {
  std::unique_ptr<kernels::Backend<float>> gpu = kernels::make_cuda_backend<float>();
  kernels::Backend<float>& cpu = kernels::cpu_backend<float>();
  ExecContext& gx = gpu->context();
  ExecContext& hx = kernels::host_exec_context();
  const std::vector<int32_t> pos = {0, 1, 2, 7, 100, 4095, 8191, 8192, 16382, 16383, 16384, 16385, 40000, 100000, 3};
  const int rows = int(pos.size());
  const auto device = [&](const auto& host) {
    using V = typename std::decay_t<decltype(host)>::value_type;
    Buffer b(MemoryKind::device, std::max<size_t>(1, host.size()) * sizeof(V));
    gpu->upload(gx, b.data(), host.data(), host.size() * sizeof(V));
    return b;
  };
  const auto host = [&](const Buffer& b, size_t n) {
    std::vector<float> h(n);
    gpu->download(gx, h.data(), b.data(), n * sizeof(float));
    return h;
  };
  const Buffer dpos = device(pos);
  struct Case { int heads, head_dim, rot_dim; double theta; };
  for (const Case c : {Case{2, 128, 128, 1e6}, Case{3, 256, 64, 1e7}, Case{1, 16, 16, 1e4}, Case{2, 64, 64, 1e6}}) {
    CAPTURE(c.head_dim);
    CAPTURE(c.rot_dim);
    const int half = c.rot_dim / 2;
    const size_t n = size_t(rows) * c.heads * c.head_dim;
    std::vector<float> x(n, 0.0f);
    for (size_t r = 0; r < size_t(rows) * c.heads; ++r)
      for (int i = 0; i < half; ++i) x[r * c.head_dim + size_t(i)] = 1.0f;  // pairs (1, 0); the rest 0
    const Buffer dx = device(x);
    // full or partial RoPE, forward; the backward (Rᵀ: sin negated) of the full one
    std::vector<float> y_cpu(n), dx_cpu(n, 0.0f);
    Buffer dy(MemoryKind::device, n * sizeof(float)), ddx = device(dx_cpu);
    if (c.rot_dim == c.head_dim) {
      cpu.rope_forward(hx, y_cpu.data(), x.data(), pos.data(), rows, c.heads, c.head_dim, c.theta);
      cpu.rope_backward(hx, dx_cpu.data(), x.data(), pos.data(), rows, c.heads, c.head_dim, c.theta);
      gpu->rope_forward(gx, dy.as<float>(), dx.as<float>(), dpos.as<int32_t>(), rows, c.heads, c.head_dim, c.theta);
      gpu->rope_backward(gx, ddx.as<float>(), dx.as<float>(), dpos.as<int32_t>(), rows, c.heads, c.head_dim,
                         c.theta);
      CHECK(std::memcmp(host(ddx, n).data(), dx_cpu.data(), n * sizeof(float)) == 0);
    } else {
      cpu.rope_partial_forward(hx, y_cpu.data(), x.data(), pos.data(), rows, c.heads, c.head_dim, c.rot_dim, c.theta);
      gpu->rope_partial_forward(gx, dy.as<float>(), dx.as<float>(), dpos.as<int32_t>(), rows, c.heads, c.head_dim,
                                c.rot_dim, c.theta);
    }
    const std::vector<float> y_gpu = host(dy, n);
    size_t differ = 0;
    for (size_t k = 0; k < n; ++k) differ += std::memcmp(&y_gpu[k], &y_cpu[k], sizeof(float)) != 0;
    CHECK(differ == 0);
    // the rotated values are the angles' cos and sin (not a vacuous pass: sin is non-zero past position 0)
    CHECK(y_cpu[size_t(1) * c.heads * c.head_dim + size_t(half)] != 0.0f);
    if (c.rot_dim != c.head_dim) continue;
    // the fused head norm + RoPE: (n·c, n·s), n its own output at position 0
    const std::vector<float> w(size_t(c.head_dim), 1.0f);
    const Buffer dw = device(w);
    Buffer dyf(MemoryKind::device, n * sizeof(float)), drstd(MemoryKind::device, size_t(rows) * c.heads * 4);
    gpu->head_norm_rope_forward(gx, dyf.as<float>(), drstd.as<float>(), dx.as<float>(), dw.as<float>(),
                                dpos.as<int32_t>(), rows, c.heads, c.head_dim, 1e-6, c.theta);
    const std::vector<float> yf = host(dyf, n);
    const float normed = yf[0];
    CHECK(normed > 1.0f);  // sqrt(2) · (1 ± eps): half the head is 1, the rest 0
    size_t fused_differ = 0;
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < c.heads; ++h)
        for (int i = 0; i < half; ++i) {
          const size_t at = (size_t(r) * c.heads + h) * c.head_dim, cpu_at = size_t(r) * c.heads * c.head_dim;
          const float cs = y_cpu[cpu_at + size_t(i)], sn = y_cpu[cpu_at + size_t(half + i)];
          const float want_a = normed * cs, want_b = normed * sn;
          fused_differ += std::memcmp(&yf[at + size_t(i)], &want_a, 4) != 0 ||
                          std::memcmp(&yf[at + size_t(half + i)], &want_b, 4) != 0;
        }
    CHECK(fused_differ == 0);
  }
}


// Split-K of the CUDA-core cached attention (the fp32 target's decode and verify; bf16 shapes the tensor cores do
// not take): the launcher with the policy's splits against the unsplit kernel and the CPU backend's
// attention_cached_forward, and through the CUDA backend (which asks the policy). Bound, per element, for an output
// that is a convex combination of v rows: 2·u·(keys + D · max|q| · max|k| · scale)·max|v| (the fp32 sum over the
// keys, and the scores' D-term dot products moving every weight by at most their error), u = 2⁻²⁴ for fp32; bf16
// outputs add one rounding, 2⁻⁸·max|v|. Also: the scratch filled with NaN and then zeros gives the same bits (every
// partial read is written first), and the split counts of the 27B's shapes.
TEST_CASE("cuda twin target_model: split-K on the CUDA-core cached attention matches the unsplit kernel and the CPU") {
  CHECK(kernels::cuda::attention_cached_splits_cores(1, 8191, 24, 256) == 6);   // 24 blocks: 6 for 132; 256 tiles
  CHECK(kernels::cuda::attention_cached_splits_cores(1, 8191, 5, 256) == 26);   // a TP-5 shard's 5 heads: 10 a split
  CHECK(kernels::cuda::attention_cached_splits_cores(16, 8176, 24, 256) == 6);  // 16 rows: still 1 query tile
  CHECK(kernels::cuda::attention_cached_splits_cores(8192, 0, 24, 256) == 1);   // prefill: 12288 blocks
  CHECK(kernels::cuda::attention_cached_splits_cores(1, 100, 8, 128) == 1);     // 4 tiles: too short to split
  // bf16 at a tensor-core shape takes the tensor-core policy; elsewhere this one
  CHECK(kernels::cuda::attention_cached_forward_splits<kernels::cuda::bf16>(1, 8191, 24, 4, 256, {}) ==
        kernels::cuda::attention_cached_splits(1, 8191, 24, 4, 256));
  CHECK(kernels::cuda::attention_cached_forward_splits<kernels::cuda::bf16>(1, 8191, 8, 2, 96, {}) ==
        kernels::cuda::attention_cached_splits_cores(1, 8191, 8, 96));
  CHECK(kernels::cuda::attention_cached_forward_splits<float>(1, 8191, 24, 4, 256, {}) == 6);

  std::unique_ptr<kernels::Backend<float>> gpu = kernels::make_cuda_backend<float>();
  kernels::Backend<float>& cpu = kernels::cpu_backend<float>();
  ExecContext& gx = gpu->context();
  ExecContext& hx = kernels::host_exec_context();
  const cudaStream_t st = static_cast<cudaStream_t>(gx.stream);
  const auto to_device = [&](const std::vector<float>& h) {
    Buffer b(MemoryKind::device, std::max<size_t>(1, h.size()) * sizeof(float));
    gpu->upload(gx, b.data(), h.data(), h.size() * sizeof(float));
    return b;
  };
  const auto to_host = [&](const Buffer& b, size_t n) {
    std::vector<float> h(n);
    gpu->download(gx, h.data(), b.data(), n * sizeof(float));
    return h;
  };
  struct Case { int n, past, NH, KVH, D, splits; };
  // decode, a verify, GQA 1 / 4 / 3, partial last tiles, and past = 0 with 6 splits of 1 tile: the first query
  // tiles see fewer keys than the later splits start at (empty splits)
  for (const Case c : {Case{1, 1000, 8, 2, 128, 0}, Case{16, 700, 6, 2, 64, 5}, Case{1, 300, 4, 1, 256, 3},
                       Case{3, 517, 3, 3, 96, 4}, Case{100, 90, 2, 1, 32, 6}, Case{1, 64, 4, 4, 16, 2}}) {
    CAPTURE(c.n);
    CAPTURE(c.past);
    CAPTURE(c.D);
    const int keys = c.past + c.n, splits = c.splits ? c.splits : kernels::cuda::attention_cached_splits_cores(
                                                                      c.n, c.past, c.NH, c.D);
    REQUIRE(splits > 1);
    Rng rng(uint64_t(c.past * 7 + c.D));
    std::vector<float> q(size_t(c.n) * c.NH * c.D), k(size_t(keys) * c.KVH * c.D), v(k.size());
    for (auto* t : {&q, &k, &v})
      for (auto& x : *t) x = float(rng.normal());
    const size_t n_out = q.size();
    std::vector<float> ref(n_out);
    cpu.attention_cached_forward(hx, ref.data(), q.data(), k.data(), v.data(), c.n, c.past, c.NH, c.KVH, c.D);
    const Buffer dq = to_device(q), dk = to_device(k), dv = to_device(v);
    Buffer unsplit(MemoryKind::device, n_out * sizeof(float)), split(MemoryKind::device, n_out * sizeof(float));
    kernels::cuda::launch_attention_cached_forward_cores<float>(st, unsplit.as<float>(), dq.as<float>(),
                                                                dk.as<float>(), dv.as<float>(), c.n, c.past, c.NH,
                                                                c.KVH, c.D);
    const size_t floats = kernels::cuda::attention_cached_split_scratch_floats(c.n, c.NH, c.D, splits);
    size_t unwritten = 0;  // partials still NaN after the split kernel (the NaN-filled run): none may be
    const auto run_split = [&](float fill) {
      const Buffer scratch = to_device(std::vector<float>(floats, fill));
      kernels::cuda::launch_attention_cached_forward_cores<float>(st, split.as<float>(), dq.as<float>(),
                                                                  dk.as<float>(), dv.as<float>(), c.n, c.past, c.NH,
                                                                  c.KVH, c.D, splits, scratch.as<float>());
      for (float x : to_host(scratch, floats)) unwritten += std::isnan(x);
      return to_host(split, n_out);
    };
    const std::vector<float> got = run_split(std::numeric_limits<float>::quiet_NaN()), got0 = run_split(0.0f);
    CHECK(unwritten == 0);
    const std::vector<float> one = to_host(unsplit, n_out);
    CHECK(std::memcmp(got.data(), got0.data(), n_out * sizeof(float)) == 0);
    double max_q = 0, max_k = 0, max_v = 0;
    for (float x : q) max_q = std::max(max_q, double(std::fabs(x)));
    for (float x : k) max_k = std::max(max_k, double(std::fabs(x)));
    for (float x : v) max_v = std::max(max_v, double(std::fabs(x)));
    const double u = std::ldexp(1.0, -24), bound = 2 * u * (keys + c.D * max_q * max_k / std::sqrt(double(c.D))) * max_v;
    double worst_ref = 0, worst_one = 0;
    size_t nan = 0;
    for (size_t i = 0; i < n_out; ++i) {
      nan += std::isnan(got[i]);
      worst_ref = std::max(worst_ref, std::fabs(double(got[i]) - ref[i]));
      worst_one = std::max(worst_one, std::fabs(double(got[i]) - one[i]));
    }
    CAPTURE(bound);
    CHECK(nan == 0);
    CHECK(worst_ref <= bound);
    CHECK(worst_one <= bound);
    // the backend asks the policy: the same bits as the launcher with the policy's splits
    const int policy = kernels::cuda::attention_cached_splits_cores(c.n, c.past, c.NH, c.D);
    if (policy > 1) {
      const std::vector<float> at_policy = [&] {
        const Buffer scratch = to_device(std::vector<float>(
            kernels::cuda::attention_cached_split_scratch_floats(c.n, c.NH, c.D, policy), 0.0f));
        kernels::cuda::launch_attention_cached_forward_cores<float>(st, split.as<float>(), dq.as<float>(),
                                                                    dk.as<float>(), dv.as<float>(), c.n, c.past,
                                                                    c.NH, c.KVH, c.D, policy, scratch.as<float>());
        return to_host(split, n_out);
      }();
      Buffer via(MemoryKind::device, n_out * sizeof(float));
      gpu->attention_cached_forward(gx, via.as<float>(), dq.as<float>(), dk.as<float>(), dv.as<float>(), c.n, c.past,
                                    c.NH, c.KVH, c.D);
      CHECK(std::memcmp(to_host(via, n_out).data(), at_policy.data(), n_out * sizeof(float)) == 0);
    }
  }
  // bf16 at a shape the tensor cores do not take (head_dim 96): split against the CPU on the same bf16 inputs
  {
    std::unique_ptr<kernels::Backend<kernels::bf16>> gb = kernels::make_cuda_backend<kernels::bf16>();
    ExecContext& bx = gb->context();
    const int n = 1, past = 2000, NH = 6, KVH = 2, D = 96, keys = past + n;
    REQUIRE(kernels::cuda::attention_cached_forward_splits<kernels::cuda::bf16>(n, past, NH, KVH, D, {}) > 1);
    Rng rng(31);
    std::vector<float> q(size_t(n) * NH * D), k(size_t(keys) * KVH * D), v(k.size());
    for (auto* t : {&q, &k, &v})
      for (auto& x : *t) x = float(kernels::bf16(float(rng.normal())));  // bf16 values: both sides read the same
    std::vector<float> ref(q.size());
    cpu.attention_cached_forward(hx, ref.data(), q.data(), k.data(), v.data(), n, past, NH, KVH, D);
    const auto to_bf16 = [](const std::vector<float>& f) {
      std::vector<kernels::bf16> b(f.size());
      for (size_t i = 0; i < f.size(); ++i) b[i] = kernels::bf16(f[i]);
      return b;
    };
    const auto up = [&](const std::vector<kernels::bf16>& h) {
      Buffer b(MemoryKind::device, h.size() * sizeof(kernels::bf16));
      gb->upload(bx, b.data(), h.data(), h.size() * sizeof(kernels::bf16));
      return b;
    };
    const Buffer dq = up(to_bf16(q)), dk = up(to_bf16(k)), dv = up(to_bf16(v));
    Buffer out(MemoryKind::device, q.size() * sizeof(kernels::bf16));
    using B = kernels::bf16;
    gb->attention_cached_forward(bx, out.as<B>(), dq.as<B>(), dk.as<B>(), dv.as<B>(), n, past, NH, KVH, D);
    std::vector<kernels::bf16> got(q.size());
    gb->download(bx, got.data(), out.data(), got.size() * sizeof(kernels::bf16));
    double max_v = 0, worst = 0;
    for (float x : v) max_v = std::max(max_v, double(std::fabs(x)));
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(float(got[i])) - ref[i]));
    const double u = std::ldexp(1.0, -24);
    CHECK(worst <= (2 * u * (keys + D * 16.0 / std::sqrt(double(D))) + std::ldexp(1.0, -8)) * max_v);
  }
}

#endif  // DFLASH_WITH_CUDA
