// The per-element / per-column math of the target's CUDA kernels (kernels/cuda/target_math.h, attention_math.h, and
// the kernels/math formulas they call; __host__ __device__) run on the CPU in the order the kernels walk it, against
// kernels/cpu and the CPU backend: causal attention over a KV cache (prefill and decode), partial RoPE, the causal
// conv1d with a carried tail, l2norm, gated RMSNorm, the DeltaNet gates, the sigmoid output gate, the gated delta
// rule (one state column per lane, the state carried across calls) and the row argmax (256 strided partials merged
// in the block's tree). What only a GPU can check (thread mapping, memory access) is in tests/cuda: the op table on
// CUDA (cuda twin ops) and the whole target forward (cuda twin target_model).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_causal.h"
#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gated_deltanet.h"
#include "kernels/cpu/rope_partial.h"
#include "kernels/cuda/attention_math.h"
#include "kernels/cuda/target_math.h"
#include "kernels/math/argmax.h"
#include "kernels/math/gates.h"
#include "kernels/math/norm.h"
#include "lib/core/rng.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::kernels;
namespace cm = dflash::kernels::cuda_math;
namespace km = dflash::kernels::math;
using dflash::test::random_floats;
using dflash::test::require_close;

namespace {

// attention_causal.cu's walk for rows [n] after `past` cached positions: per (row, head) the keys
// 0 .. causal_key_count(past, i) − 1 in tiles of `tile`, scores in float, merged by cm::OnlineSoftmax.
std::vector<float> cached_attention_walk(const std::vector<float>& q, const std::vector<float>& k,
                                         const std::vector<float>& v, int n, int past, int NH, int KVH, int D,
                                         int tile) {
  std::vector<float> out(size_t(n) * NH * D);
  const float scale = 1.0f / std::sqrt(float(D));
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < NH; ++h) {
      const int g = h / (NH / KVH), keys = cm::causal_key_count(past, i);
      const float* qi = &q[(size_t(i) * NH + h) * D];
      cm::OnlineSoftmax sm;
      std::vector<float> o(D, 0.f), sc(tile);
      for (int t0 = 0; t0 < keys; t0 += tile) {
        const int nt = std::min(tile, keys - t0);
        float tmax = -INFINITY;
        for (int t = 0; t < nt; ++t) {
          const float* kt = &k[(size_t(t0 + t) * KVH + g) * D];
          float dot = 0;
          for (int d = 0; d < D; ++d) dot += qi[d] * kt[d];
          sc[t] = dot * scale;
          tmax = std::max(tmax, sc[t]);
        }
        const float alpha = sm.rescale(tmax);
        for (auto& x : o) x *= alpha;
        for (int t = 0; t < nt; ++t) {
          const float p = std::exp(sc[t] - sm.m);
          sm.add(p);
          const float* vt = &v[(size_t(t0 + t) * KVH + g) * D];
          for (int d = 0; d < D; ++d) o[d] += p * vt[d];
        }
      }
      for (int d = 0; d < D; ++d) out[(size_t(i) * NH + h) * D + d] = o[d] / sm.l;
    }
  return out;
}

}  // namespace

// fp32: one output is a softmax-weighted sum over ≤ 48 keys; the walk and the CPU kernels differ in summation order
// and the tile rescaling only: a few ulp × (keys + D) ≈ 1e-5 relative to O(1) values (as the DFlash attention).
TEST_CASE("cuda_math: causal attention over a KV cache (prefill, decode, GQA) matches the CPU kernels") {
  struct Case {
    int n, past, NH, KVH, D;
  };
  for (Case c : {Case{9, 0, 4, 2, 12}, Case{40, 0, 3, 1, 8}, Case{1, 47, 4, 2, 12}, Case{7, 33, 6, 3, 5},
                 Case{1, 0, 2, 2, 4}}) {
    CAPTURE(c.n);
    CAPTURE(c.past);
    const int keys = c.past + c.n;
    const auto q = random_floats(size_t(c.n) * c.NH * c.D, 1), k = random_floats(size_t(keys) * c.KVH * c.D, 2),
               v = random_floats(size_t(keys) * c.KVH * c.D, 3);
    std::vector<float> want(q.size());
    cpu::attention_decode_forward(want.data(), q.data(), k.data(), v.data(), c.n, c.past, c.NH, c.KVH, c.D);
    for (int tile : {32, 5, 1}) {
      const auto got = cached_attention_walk(q, k, v, c.n, c.past, c.NH, c.KVH, c.D, tile);
      require_close(got, want, 2e-5, 2e-6, "cached attention walk vs attention_decode");
    }
    // the CPU backend's entry: the blocked prefill kernel at past 0, the decode kernel after a cache
    std::vector<float> be(q.size());
    cpu_backend<float>().attention_cached_forward(host_exec_context(), be.data(), q.data(), k.data(), v.data(), c.n,
                                                  c.past, c.NH, c.KVH, c.D);
    if (c.past == 0) {
      std::vector<float> prefill(q.size());
      cpu::attention_causal_forward(prefill.data(), q.data(), k.data(), v.data(), c.n, c.NH, c.KVH, c.D);
      CHECK(be == prefill);
      require_close(prefill, want, 2e-5, 2e-6, "attention_causal vs attention_decode");
    } else {
      CHECK(be == want);
    }
  }
}

// Angles in double, cos/sin rounded to float, rotation in float on both sides: within an ulp; the pass-through
// dims are copied exactly.
TEST_CASE("cuda_math: partial RoPE (first rot_dim dims rotate, the rest pass) matches cpu::rope_partial_forward") {
  const int rows = 5, heads = 3, D = 16;
  const std::vector<int> pos = {0, 1, 17, 4095, 100000};
  const auto x = random_floats(size_t(rows) * heads * D, 9);
  for (int rot : {4, 10, 16}) {
    CAPTURE(rot);
    std::vector<float> want = x, got = x;
    cpu::rope_partial_forward(want.data(), pos.data(), rows, heads, D, rot, 1e7);
    const int half = rot / 2;
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < half; ++i) {  // norm_rope.cu's rope_kernel with rot_dim
        float c, s;
        km::rope_cos_sin(pos[r], i, rot, 1e7, c, s);
        for (int h = 0; h < heads; ++h) {
          const size_t o = (size_t(r) * heads + h) * D;
          km::rope_rotate(x[o + i], x[o + i + half], c, s, got[o + i], got[o + i + half]);
        }
      }
    require_close(got, want, 2e-7, 1e-7, "partial rope");
    for (size_t o = 0; o < x.size(); o += D)
      for (int d = rot; d < D; ++d) CHECK(want[o + d] == x[o + d]);
    // the backend entry out of place leaves x alone and fills every dim of y
    std::vector<float> y(x.size(), -7.f);
    std::vector<int32_t> pos32(pos.begin(), pos.end());
    cpu_backend<float>().rope_partial_forward(host_exec_context(), y.data(), x.data(), pos32.data(), rows, heads, D,
                                              rot, 1e7);
    CHECK(y == want);
  }
}

namespace {

// deltanet.cu's conv for one call: y[t, c] = silu(Σ_j w[c, j] · [tail ; x][t + j, c]) (tail null: zeros), then the
// tail moved row by row in increasing order (conv_tail_kernel).
void conv_walk(std::vector<float>& y, const float* x, const std::vector<float>& w, float* tail, int S, int C, int K) {
  y.assign(size_t(S) * C, 0.f);
  for (int t = 0; t < S; ++t)
    for (int c = 0; c < C; ++c) {
      float acc = 0;
      for (int j = 0; j < K; ++j) {
        int row;
        const bool in_tail = cm::conv_tap_row(t, j, K, row);
        const float xv = in_tail ? (tail ? tail[size_t(row) * C + c] : 0.f) : x[size_t(row) * C + c];
        acc = km::conv_tap(acc, w[size_t(c) * K + j], xv);
      }
      y[size_t(t) * C + c] = km::silu(acc);
    }
  if (!tail) return;
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < K - 1; ++r) {
      int row;
      const bool in_tail = cm::conv_tap_row(S, r, K, row);
      tail[size_t(r) * C + c] = in_tail ? tail[size_t(row) * C + c] : x[size_t(row) * C + c];
    }
}

}  // namespace

// The same products summed in the same order (x·0 for the taps before position 0 adds exactly nothing): equal up
// to an ulp of the SiLU.
TEST_CASE("cuda_math: causal conv1d + SiLU with a carried tail matches the CPU kernel over the whole sequence") {
  const int C = 5, K = 4, S = 13;
  const auto x = random_floats(size_t(S) * C, 20), w = random_floats(size_t(C) * K, 21, 0.5);
  std::vector<float> want(x.size());
  cpu::causal_conv1d_silu_forward(want.data(), x.data(), w.data(), S, C, K);
  // calls of 3, 1 (fewer rows than the tail: the tail shifts within itself), 0, 2 and 7 rows
  std::vector<float> tail(size_t(K - 1) * C, 0.f), tail_be = tail, got, got_be(x.size());
  int t0 = 0;
  for (int n : {3, 1, 0, 2, 7}) {
    std::vector<float> y;
    conv_walk(y, x.data() + size_t(t0) * C, w, tail.data(), n, C, K);
    std::copy(y.begin(), y.end(), std::back_inserter(got));
    cpu_backend<float>().causal_conv1d_silu_forward(host_exec_context(), got_be.data() + size_t(t0) * C,
                                                    x.data() + size_t(t0) * C, w.data(), tail_be.data(), n, C, K);
    t0 += n;
    // the tail is the last K−1 inputs so far (zeros before position 0)
    for (int r = 0; r < K - 1; ++r)
      for (int c = 0; c < C; ++c) {
        const int src = t0 - (K - 1) + r;
        const float expect = src >= 0 ? x[size_t(src) * C + c] : 0.f;
        CHECK(tail[size_t(r) * C + c] == expect);
        CHECK(tail_be[size_t(r) * C + c] == expect);
      }
  }
  REQUIRE(t0 == S);
  require_close(got, want, 4e-7, 1e-7, "conv walk, chunked with tail");
  require_close(got_be, want, 4e-7, 1e-7, "CPU backend conv, chunked with tail");
  std::vector<float> no_tail;
  conv_walk(no_tail, x.data(), w, nullptr, S, C, K);
  require_close(no_tail, want, 4e-7, 1e-7, "conv walk without a tail");
}

// Same float formulas on both sides: within a few ulp.
TEST_CASE("cuda_math: l2norm, gated RMSNorm, DeltaNet gates and the sigmoid gate match the CPU kernels") {
  const int rows = 7, dim = 33;
  const auto x = random_floats(size_t(rows) * dim, 30), z = random_floats(x.size(), 31, 3.0), w = random_floats(dim, 32);
  {
    std::vector<float> want = x, got = x;
    cpu::l2norm_forward(want.data(), rows, dim, 1e-6f, 0.25f);
    for (int r = 0; r < rows; ++r) {
      float ss = 0;
      for (int i = 0; i < dim; ++i) ss += x[size_t(r) * dim + i] * x[size_t(r) * dim + i];
      const float f = km::l2norm_factor(ss, 1e-6f, 0.25f);
      for (int i = 0; i < dim; ++i) got[size_t(r) * dim + i] *= f;
    }
    require_close(got, want, 4e-7, 1e-8, "l2norm");
  }
  {
    std::vector<float> want(x.size()), got(x.size());
    cpu::gated_rmsnorm_forward(want.data(), x.data(), z.data(), w.data(), rows, dim, 1e-6f);
    for (int r = 0; r < rows; ++r) {
      float ss = 0;
      for (int i = 0; i < dim; ++i) ss += x[size_t(r) * dim + i] * x[size_t(r) * dim + i];
      const float rstd = km::rmsnorm_rstd(ss, dim, 1e-6f);
      for (int i = 0; i < dim; ++i) {
        const size_t o = size_t(r) * dim + i;
        got[o] = km::gated_rmsnorm_y(x[o], rstd, w[i], z[o]);
      }
    }
    require_close(got, want, 4e-7, 1e-8, "gated rmsnorm");
    std::vector<float> alias = x;  // the backend entry, y aliasing x
    cpu_backend<float>().gated_rmsnorm_forward(host_exec_context(), alias.data(), alias.data(), z.data(), w.data(),
                                               rows, dim, 1e-6);
    CHECK(alias == want);
  }
  {
    const int heads = 6, n = rows * heads;
    auto a = random_floats(size_t(n), 33, 8.0), b = random_floats(size_t(n), 34, 4.0);
    a[0] = 30.f, a[1] = -40.f, a[2] = 20.5f;  // softplus: the linear branch, a vanishing one, and just past 20
    const auto a_log = random_floats(heads, 35, 0.5), dt_bias = random_floats(heads, 36);
    std::vector<float> g(n), beta(n), g_got(n), beta_got(n);
    cpu::deltanet_gates_forward(g.data(), beta.data(), a.data(), b.data(), a_log.data(), dt_bias.data(), rows, heads);
    for (int i = 0; i < n; ++i) {
      beta_got[i] = km::deltanet_beta(b[i]);
      g_got[i] = km::deltanet_g(a[i], dt_bias[i % heads], a_log[i % heads]);
      CHECK(g[i] <= 0.f);
      CHECK(beta[i] >= 0.f);
      CHECK(beta[i] <= 1.f);
    }
    require_close(g_got, g, 4e-7, 1e-30, "decay g");
    require_close(beta_got, beta, 4e-7, 1e-30, "beta");
  }
  {
    std::vector<float> want = x, got = x;
    cpu::sigmoid_gate(want.data(), z.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) got[i] = km::sigmoid_gate(x[i], z[i]);
    require_close(got, want, 4e-7, 1e-30, "sigmoid gate");
  }
}

namespace {

struct DeltaCase {
  int S, k_heads, v_heads, dk, dv;
};
struct DeltaInputs {
  std::vector<float> q, k, v, g, beta;
};
// q, k L2-normed (q also scaled by 1/sqrt(dk)), g ∈ [−2, 0), β ∈ (0, 1): what the layer feeds the rule
DeltaInputs delta_inputs(const DeltaCase& c, uint64_t seed) {
  DeltaInputs in;
  in.q = random_floats(size_t(c.S) * c.k_heads * c.dk, seed);
  in.k = random_floats(in.q.size(), seed + 1);
  in.v = random_floats(size_t(c.S) * c.v_heads * c.dv, seed + 2);
  cpu::l2norm_forward(in.q.data(), c.S * c.k_heads, c.dk, 1e-6f, 1.0f / std::sqrt(float(c.dk)));
  cpu::l2norm_forward(in.k.data(), c.S * c.k_heads, c.dk, 1e-6f, 1.0f);
  Rng rng(seed + 3);
  in.g.resize(size_t(c.S) * c.v_heads);
  in.beta.resize(in.g.size());
  for (auto& x : in.g) x = float(-2.0 * rng.uniform());
  for (auto& x : in.beta) x = float(1.0 / (1.0 + std::exp(-rng.normal())));
  return in;
}

// deltanet.cu's delta_rule_kernel for positions [t0, t0 + n), slices of R rows: per value head and tile of 32
// columns, warp w's lane l holds rows [w·R, w·R + rows) of column d0 + l; per token the prediction's partials and
// then the output's, each summed over the warps in order (cm::delta_slice_*).
template <int R>
void delta_walk_slices(std::vector<float>& out, const DeltaInputs& in, const DeltaCase& c, int t0, int n,
                       std::vector<float>& state) {
  const int lanes = 32, groups = cm::kDeltaRowGroups, r = c.v_heads / c.k_heads;
  for (int h = 0; h < c.v_heads; ++h)
    for (int d0 = 0; d0 < c.dv; d0 += lanes) {
      const int cols = std::min(lanes, c.dv - d0);
      struct Slice {
        float m[R];
      };
      std::vector<Slice> m(size_t(groups) * lanes);  // [warp][lane] → the slice's rows (a thread's registers)
      auto rows_of = [&](int w) { return std::max(0, std::min(R, c.dk - w * R)); };
      for (int w = 0; w < groups; ++w)
        for (int l = 0; l < cols; ++l)
          for (int j = 0; j < R; ++j)
            m[size_t(w) * lanes + l].m[j] = j < rows_of(w) ? state[(size_t(h) * c.dk + w * R + j) * c.dv + d0 + l] : 0.f;
      for (int t = t0; t < t0 + n; ++t) {
        const size_t kq = (size_t(t) * c.k_heads + h / r) * c.dk, th = size_t(t) * c.v_heads + h;
        const float decay = std::exp(in.g[th]);
        for (int l = 0; l < cols; ++l) {
          float pred = 0;
          for (int w = 0; w < groups; ++w)
            pred += cm::delta_slice_dot(m[size_t(w) * lanes + l].m, &in.k[kq + size_t(w) * R], rows_of(w));
          const float u = cm::delta_u(pred, decay, in.v[th * c.dv + d0 + l], in.beta[th]);
          float o = 0;
          for (int w = 0; w < groups; ++w)
            o += cm::delta_slice_update(m[size_t(w) * lanes + l].m, &in.k[kq + size_t(w) * R],
                                        &in.q[kq + size_t(w) * R], rows_of(w), decay, u);
          out[th * c.dv + d0 + l] = o;
        }
      }
      for (int w = 0; w < groups; ++w)
        for (int l = 0; l < cols; ++l)
          for (int j = 0; j < rows_of(w); ++j)
            state[(size_t(h) * c.dk + w * R + j) * c.dv + d0 + l] = m[size_t(w) * lanes + l].m[j];
    }
}

void delta_walk(std::vector<float>& out, const DeltaInputs& in, const DeltaCase& c, int t0, int n,
                std::vector<float>& state) {
  switch (cm::delta_slice_rows(c.dk)) {
    case 8: return delta_walk_slices<8>(out, in, c, t0, n, state);
    case 16: return delta_walk_slices<16>(out, in, c, t0, n, state);
    case 32: return delta_walk_slices<32>(out, in, c, t0, n, state);
    default: return delta_walk_slices<64>(out, in, c, t0, n, state);
  }
}

}  // namespace

// Against the per-token reference the walk does the same float operations in another order (the decay applied to
// the prediction's sum, four accumulators per slice, slices summed last): 1e-6 of the largest value, float
// rounding over ≤ 256 terms. Against the chunked kernel (what the CPU backend runs): float vs float through
// different algebra, within the 1e-5 the CPU's own test allows between the chunked float kernel and the recurrence.
TEST_CASE("cuda_math: gated delta rule, state rows split over 4 warps, state carried across calls, matches the CPU") {
  // dk 8 (slices of 8: warps 1-3 hold nothing), 16, 4, 100 (slices of 32, the last short), 256 (slices of 64)
  for (DeltaCase c : {DeltaCase{70, 2, 4, 8, 40}, DeltaCase{9, 1, 3, 16, 5}, DeltaCase{1, 2, 2, 4, 3},
                      DeltaCase{20, 1, 2, 100, 33}, DeltaCase{6, 1, 1, 256, 8}}) {
    CAPTURE(c.S);
    const DeltaInputs in = delta_inputs(c, uint64_t(c.S + c.dv));
    const size_t state_n = size_t(c.v_heads) * c.dk * c.dv;
    const std::vector<float> state0 = random_floats(state_n, 77, 0.3);  // a carried non-zero state
    std::vector<float> want(size_t(c.S) * c.v_heads * c.dv), state_want = state0;
    cpu::gated_delta_rule_reference(want.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                                    c.S, c.k_heads, c.v_heads, c.dk, c.dv, state_want.data());
    std::vector<float> chunked(want.size()), state_chunked = state0;
    cpu_backend<float>().gated_delta_rule_forward(host_exec_context(), chunked.data(), in.q.data(), in.k.data(),
                                                  in.v.data(), in.g.data(), in.beta.data(), state_chunked.data(), c.S,
                                                  c.k_heads, c.v_heads, c.dk, c.dv, nullptr);
    // the walk in calls of 1/3, 1 and the rest of the sequence, the state carried
    std::vector<float> got(want.size()), state = state0;
    const int first = c.S / 3, second = std::min(1, c.S - first);
    delta_walk(got, in, c, 0, first, state);
    delta_walk(got, in, c, first, second, state);
    delta_walk(got, in, c, first + second, c.S - first - second, state);
    CHECK(test::max_rel_diff(got, want) < 1e-6);
    CHECK(test::max_rel_diff(state, state_want) < 1e-6);
    CHECK(test::max_rel_diff(got, chunked) < 1e-5);
    CHECK(test::max_rel_diff(state, state_chunked) < 1e-5);
  }
}

namespace {

// argmax.cu: thread tid adds columns tid, tid + 256, …; block_merge folds buf[tid] with buf[tid + stride] for
// stride 128, 64, …, 1.
km::ArgMax<float> argmax_walk(const float* row, int cols) {
  const int threads = 256;
  std::vector<km::ArgMax<float>> buf(threads);
  for (int tid = 0; tid < threads; ++tid)
    for (int i = tid; i < cols; i += threads) buf[tid].add(row[i], i);
  for (int stride = threads / 2; stride > 0; stride /= 2)
    for (int tid = 0; tid < stride; ++tid) buf[tid].merge(buf[tid + stride]);
  return buf[0];
}

}  // namespace

TEST_CASE("cuda_math: row argmax (256 strided partials, tree merge) is the CPU's first maximum, NaNs skipped") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int cols = 1000;
  std::vector<std::vector<float>> rows;
  rows.push_back(random_floats(cols, 40));
  auto tie = random_floats(cols, 41);
  tie[700] = tie[300] = tie[556] = 9.f;  // threads 188 (700) and 44 (300, 556): 300 wins
  rows.push_back(tie);
  auto same_thread = random_floats(cols, 42);
  same_thread[44] = same_thread[556] = 9.f;  // tie within one thread's columns: 44 wins
  rows.push_back(same_thread);
  auto with_nan = random_floats(cols, 43);
  with_nan[0] = nan, with_nan[5] = 12.f, with_nan[6] = nan;
  rows.push_back(with_nan);
  rows.push_back(std::vector<float>(cols, nan));   // none: −1
  rows.push_back(std::vector<float>(cols, -inf));  // all −inf: column 0
  auto big = random_floats(cols, 44);
  big[999] = inf;
  rows.push_back(big);
  std::vector<float> x;
  for (const auto& r : rows) x.insert(x.end(), r.begin(), r.end());
  const int n = int(rows.size());
  std::vector<int32_t> index(n);
  std::vector<float> value(n);
  cpu::argmax_rows(index.data(), value.data(), x.data(), n, cols);
  CHECK(index[1] == 300);
  CHECK(index[2] == 44);
  CHECK(index[3] == 5);
  CHECK(index[4] == -1);
  CHECK(index[5] == 0);
  CHECK(index[6] == 999);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    const km::ArgMax<float> got = argmax_walk(&x[size_t(r) * cols], cols);
    CHECK(got.index == index[r]);
    if (index[r] >= 0) {
      CHECK(got.value == value[r]);
      CHECK(value[r] == x[size_t(r) * cols + index[r]]);
    } else {
      CHECK(value[r] == -inf);
      CHECK(got.value == -inf);
    }
  }
  // fewer columns than threads: most partials stay empty
  const auto short_row = random_floats(7, 45);
  int32_t idx;
  float val;
  cpu::argmax_rows(&idx, &val, short_row.data(), 1, 7);
  CHECK(argmax_walk(short_row.data(), 7).index == idx);
  CHECK(idx == int(std::max_element(short_row.begin(), short_row.end()) - short_row.begin()));
}

TEST_CASE("cpu backend: copy_strided splits Qwen3.5's per-head query | gate rows and leaves the rest alone") {
  const int rows = 6, hd = 5;  // rows = tokens × heads, q_proj gives [query (hd) | gate (hd)] per row
  std::vector<float> fused(size_t(rows) * 2 * hd);
  for (size_t i = 0; i < fused.size(); ++i) fused[i] = float(i);
  std::vector<float> query(size_t(rows) * hd + 3, -1.f), gate(size_t(rows) * hd, -1.f);
  auto& be = cpu_backend<float>();
  be.copy_strided(host_exec_context(), query.data(), hd, fused.data(), 2 * hd, rows, hd);
  be.copy_strided(host_exec_context(), gate.data(), hd, fused.data() + hd, 2 * hd, rows, hd);
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < hd; ++d) {
      CHECK(query[size_t(r) * hd + d] == float(r * 2 * hd + d));
      CHECK(gate[size_t(r) * hd + d] == float(r * 2 * hd + hd + d));
    }
  for (size_t i = size_t(rows) * hd; i < query.size(); ++i) CHECK(query[i] == -1.f);  // past the last row: untouched
}

TEST_CASE("cpu backend: the attention_block option is the blocked prefill kernel's block (same bits)") {
  const int S = 50, NH = 4, KVH = 2, D = 8;
  const auto q = random_floats(size_t(S) * NH * D, 60), k = random_floats(size_t(S) * KVH * D, 61), v = random_floats(size_t(S) * KVH * D, 62);
  for (int block : {1, 16, 64}) {
    CAPTURE(block);
    std::vector<float> want(q.size()), got(q.size()), got_causal(q.size());
    cpu::attention_causal_forward(want.data(), q.data(), k.data(), v.data(), S, NH, KVH, D, block);
    const auto be = make_cpu_backend<float>({block});
    be->attention_cached_forward(host_exec_context(), got.data(), q.data(), k.data(), v.data(), S, 0, NH, KVH, D);
    be->attention_causal_forward(host_exec_context(), got_causal.data(), q.data(), k.data(), v.data(), S, NH, KVH, D);
    CHECK(got == want);
    CHECK(got_causal == want);
  }
  CHECK_THROWS(make_cpu_backend<float>({0}));
}
