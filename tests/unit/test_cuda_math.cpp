// The CUDA kernels' per-row / per-tile math (kernels/cuda/*_math.h, __host__ __device__) walked on the CPU in the
// order the CUDA kernels walk it, against the CPU kernels: the attention mask enumeration and its inverse, the
// online-softmax tile merge (forward and the recomputing backward), RMSNorm's dw from the CUDA kernel's chunk
// partials, and the vocab loss's row statistics (kernels/math/loss_rows.h) merged from 256 strided partials as the
// CUDA block merges them, against the CPU's one-thread walk. The formulas of kernels/math/ have one copy, which
// both backends call: each op against a double reference on every backend is test_backend_ops.cpp. What only a
// GPU can check (thread mapping, memory access, cuBLASLt) is in tests/cuda.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_dflash.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/vocab_loss_rows.h"
#include "kernels/cuda/attention_math.h"
#include "kernels/math/norm.h"
#include "kernels/math/loss_rows.h"
#include "lib/core/rng.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::kernels;
namespace cm = dflash::kernels::cuda_math;
namespace km = dflash::kernels::math;
using dflash::test::random_floats;
using dflash::test::require_close;

namespace {

// ---------------- attention ----------------

struct AttnCase {
  DFlashAttentionShape s;
  std::vector<int> anchors;
  std::vector<float> q, kc, vc, kb, vb, dout;
};

AttnCase attn_case(int window, int kv_heads, std::vector<int> anchors, int ctx_len, int block, int D, uint64_t seed) {
  AttnCase c;
  c.s = {int(anchors.size()), block, ctx_len, 2 * kv_heads, kv_heads, D, window};
  c.anchors = std::move(anchors);
  const size_t NB = size_t(c.s.n_blocks) * block;
  c.q = random_floats(NB * c.s.heads * D, seed);
  c.kc = random_floats(size_t(ctx_len) * kv_heads * D, seed + 1);
  c.vc = random_floats(size_t(ctx_len) * kv_heads * D, seed + 2);
  c.kb = random_floats(NB * kv_heads * D, seed + 3);
  c.vb = random_floats(NB * kv_heads * D, seed + 4);
  c.dout = random_floats(NB * c.s.heads * D, seed + 5);
  return c;
}

// The shapes the tests walk: full and sliding layers, GQA, anchors at 0, near S and at S, ragged sizes.
std::vector<AttnCase> attn_cases() {
  return {attn_case(0, 2, {0, 4, 5, 9}, 9, 3, 4, 11),         // full, anchors at 0 and at S
          attn_case(4, 2, {0, 4, 5, 9}, 9, 3, 4, 12),         // sliding window 4
          attn_case(1, 1, {2, 7, 1}, 8, 4, 5, 13),            // window 1: only the block's own causal rows
          attn_case(0, 3, {37, 1, 40, 20, 39}, 40, 5, 7, 14),  // more keys than a 32-key tile, ragged D
          attn_case(6, 1, {37, 1, 40, 20}, 40, 8, 3, 15)};
}

bool dense_visible(const AttnCase& c, int r, int key, bool key_is_ctx) {
  const int B = c.s.block, b = r / B, j = r % B, a = c.anchors[b];
  if (key_is_ctx) {
    if (key >= a || key >= c.s.ctx_len) return false;
    return c.s.window == 0 || key >= a + j - (c.s.window - 1);
  }
  if (key / B != b) return false;
  return c.s.window == 0 || key % B <= j;
}

}  // namespace

TEST_CASE("cuda_math: attention key enumeration is the mask, and its inverse lists the queries of each key") {
  for (const AttnCase& c : attn_cases()) {
    const int B = c.s.block, NB = c.s.n_blocks * B;
    for (int r = 0; r < NB; ++r) {
      const int b = r / B, j = r % B;
      const cm::DFlashKeys keys = cm::dflash_query_keys(c.s, c.anchors[b], j);
      std::vector<char> seen_ctx(c.s.ctx_len, 0), seen_blk(NB, 0);
      for (int t = 0; t < keys.count(); ++t) {
        int row;
        if (cm::dflash_key_row(keys, b, B, t, row))
          seen_ctx.at(row) = 1;
        else
          seen_blk.at(row) = 1;
      }
      for (int k = 0; k < c.s.ctx_len; ++k) {
        CHECK(bool(seen_ctx[k]) == dense_visible(c, r, k, true));
        int lo, hi;
        cm::dflash_rows_seeing_ctx(c.s, c.anchors[b], k, lo, hi);
        CHECK((j >= lo && j < hi) == dense_visible(c, r, k, true));
      }
      for (int k = 0; k < NB; ++k) {
        CHECK(bool(seen_blk[k]) == dense_visible(c, r, k, false));
        if (k / B == b) {
          int lo, hi;
          cm::dflash_rows_seeing_blk(c.s, k % B, lo, hi);
          CHECK((j >= lo && j < hi) == dense_visible(c, r, k, false));
        }
      }
    }
  }
}

namespace {

// The CUDA forward, one query at a time in the kernel's order: tiles of `tile` visible keys, scores in float,
// cm::OnlineSoftmax merges, output normalised at the end.
void tiled_forward(const AttnCase& c, int tile, std::vector<float>& out, std::vector<float>& lse) {
  const auto& s = c.s;
  const int B = s.block, NB = s.n_blocks * B, NH = s.heads, KVH = s.kv_heads, D = s.head_dim, G = NH / KVH;
  out.assign(size_t(NB) * NH * D, 0.f);
  lse.assign(size_t(NB) * NH, 0.f);
  const float scale = 1.0f / std::sqrt(float(D));
  for (int r = 0; r < NB; ++r)
    for (int h = 0; h < NH; ++h) {
      const int b = r / B, g = h / G;
      const float* q = &c.q[(size_t(r) * NH + h) * D];
      const cm::DFlashKeys keys = cm::dflash_query_keys(s, c.anchors[b], r % B);
      auto kv = [&](int t, const float*& k, const float*& v) {
        int row;
        const bool ctx = cm::dflash_key_row(keys, b, B, t, row);
        k = (ctx ? c.kc.data() : c.kb.data()) + (size_t(row) * KVH + g) * D;
        v = (ctx ? c.vc.data() : c.vb.data()) + (size_t(row) * KVH + g) * D;
      };
      cm::OnlineSoftmax sm;
      std::vector<float> o(D, 0.f), sc(tile);
      for (int t0 = 0; t0 < keys.count(); t0 += tile) {
        const int nt = std::min(tile, keys.count() - t0);
        float tmax = -INFINITY;
        for (int i = 0; i < nt; ++i) {
          const float *k, *v;
          kv(t0 + i, k, v);
          float dot = 0;
          for (int d = 0; d < D; ++d) dot += q[d] * k[d];
          sc[i] = dot * scale;
          tmax = std::max(tmax, sc[i]);
        }
        const float alpha = sm.rescale(tmax);
        for (auto& x : o) x *= alpha;
        for (int i = 0; i < nt; ++i) {
          const float p = std::exp(sc[i] - sm.m);
          sm.add(p);
          const float *k, *v;
          kv(t0 + i, k, v);
          for (int d = 0; d < D; ++d) o[d] += p * v[d];
        }
      }
      for (int d = 0; d < D; ++d) out[(size_t(r) * NH + h) * D + d] = o[d] / sm.l;
      lse[size_t(r) * NH + h] = sm.lse();
    }
}

// The CUDA backward in the kernels' order: dq per query over its keys; dk/dv per key over the queries that see it
// (cm::dflash_rows_seeing_*), p recomputed from lse, dS = cm::attention_dscore.
void tiled_backward(const AttnCase& c, const std::vector<float>& out, const std::vector<float>& lse,
                    std::vector<float>& dq, std::vector<float>& dkc, std::vector<float>& dvc,
                    std::vector<float>& dkb, std::vector<float>& dvb) {
  const auto& s = c.s;
  const int B = s.block, NB = s.n_blocks * B, NH = s.heads, KVH = s.kv_heads, D = s.head_dim, G = NH / KVH;
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> delta(size_t(NB) * NH);
  auto dot = [&](const float* a, const float* b) {
    float acc = 0;
    for (int d = 0; d < D; ++d) acc += a[d] * b[d];
    return acc;
  };
  for (int r = 0; r < NB; ++r)
    for (int h = 0; h < NH; ++h) {
      const size_t qo = (size_t(r) * NH + h) * D;
      delta[size_t(r) * NH + h] = dot(&c.dout[qo], &out[qo]);
      const int b = r / B, g = h / G;
      const cm::DFlashKeys keys = cm::dflash_query_keys(s, c.anchors[b], r % B);
      for (int t = 0; t < keys.count(); ++t) {
        int row;
        const bool ctx = cm::dflash_key_row(keys, b, B, t, row);
        const float* k = (ctx ? c.kc.data() : c.kb.data()) + (size_t(row) * KVH + g) * D;
        const float* v = (ctx ? c.vc.data() : c.vb.data()) + (size_t(row) * KVH + g) * D;
        const float p = std::exp(dot(&c.q[qo], k) * scale - lse[size_t(r) * NH + h]);
        const float ds = cm::attention_dscore(p, dot(&c.dout[qo], v), delta[size_t(r) * NH + h]) * scale;
        for (int d = 0; d < D; ++d) dq[qo + d] += ds * k[d];
      }
    }
  auto key_grads = [&](bool ctx, int key_row, int g, float* dk, float* dv) {
    const float* k = (ctx ? c.kc.data() : c.kb.data()) + (size_t(key_row) * KVH + g) * D;
    const float* v = (ctx ? c.vc.data() : c.vb.data()) + (size_t(key_row) * KVH + g) * D;
    const int b0 = ctx ? 0 : key_row / B, b1 = ctx ? s.n_blocks : b0 + 1;
    for (int b = b0; b < b1; ++b) {
      int lo, hi;
      if (ctx)
        cm::dflash_rows_seeing_ctx(s, c.anchors[b], key_row, lo, hi);
      else
        cm::dflash_rows_seeing_blk(s, key_row % B, lo, hi);
      for (int t = 0; t < (hi - lo) * G; ++t) {
        const int r = b * B + lo + t / G, h = g * G + t % G;
        const size_t qo = (size_t(r) * NH + h) * D;
        const float p = std::exp(dot(&c.q[qo], k) * scale - lse[size_t(r) * NH + h]);
        const float ds = cm::attention_dscore(p, dot(&c.dout[qo], v), delta[size_t(r) * NH + h]) * scale;
        for (int d = 0; d < D; ++d) {
          dk[d] += ds * c.q[qo + d];
          dv[d] += p * c.dout[qo + d];
        }
      }
    }
  };
  for (int kr = 0; kr < s.ctx_len; ++kr)
    for (int g = 0; g < KVH; ++g)
      key_grads(true, kr, g, &dkc[(size_t(kr) * KVH + g) * D], &dvc[(size_t(kr) * KVH + g) * D]);
  for (int kr = 0; kr < NB; ++kr)
    for (int g = 0; g < KVH; ++g)
      key_grads(false, kr, g, &dkb[(size_t(kr) * KVH + g) * D], &dvb[(size_t(kr) * KVH + g) * D]);
}

}  // namespace

// fp32 tolerances: one query's output and lse are sums over ≤ 50 keys with a softmax; the two sides differ only
// in summation order and the rescaling steps, a few ulp × (keys + D) ≈ 1e-5 relative to O(1) values.
TEST_CASE("cuda_math: online-softmax tiles and the key-owned backward reproduce the CPU DFlash attention") {
  for (const AttnCase& c : attn_cases()) {
    const size_t NB = size_t(c.s.n_blocks) * c.s.block, NH = c.s.heads, D = c.s.head_dim, KVH = c.s.kv_heads;
    std::vector<float> out_cpu(NB * NH * D), lse_cpu(NB * NH);
    cpu::dflash_attention_forward(out_cpu.data(), lse_cpu.data(), c.q.data(), c.kc.data(), c.vc.data(), c.kb.data(),
                                  c.vb.data(), c.anchors.data(), c.s);
    for (int tile : {32, 3, 1}) {
      std::vector<float> out, lse;
      tiled_forward(c, tile, out, lse);
      require_close(out, out_cpu, 2e-5, 2e-6, "attention out");
      require_close(lse, lse_cpu, 2e-6, 2e-6, "attention lse");
    }
    std::vector<float> dq(NB * NH * D, 0.5f), dkc(size_t(c.s.ctx_len) * KVH * D, 0.25f), dvc(dkc.size(), -0.5f),
        dkb(NB * KVH * D, 1.0f), dvb(dkb.size(), 2.0f);  // non-zero: both sides accumulate (+=)
    std::vector<float> dq_c = dq, dkc_c = dkc, dvc_c = dvc, dkb_c = dkb, dvb_c = dvb;
    cpu::dflash_attention_backward(dq_c.data(), dkc_c.data(), dvc_c.data(), dkb_c.data(), dvb_c.data(),
                                   c.dout.data(), out_cpu.data(), lse_cpu.data(), c.q.data(), c.kc.data(),
                                   c.vc.data(), c.kb.data(), c.vb.data(), c.anchors.data(), c.s);
    tiled_backward(c, out_cpu, lse_cpu, dq, dkc, dvc, dkb, dvb);
    require_close(dq, dq_c, 1e-4, 1e-5, "dq");
    require_close(dkc, dkc_c, 1e-4, 1e-5, "dk_ctx");
    require_close(dvc, dvc_c, 1e-4, 1e-5, "dv_ctx");
    require_close(dkb, dkb_c, 1e-4, 1e-5, "dk_blk");
    require_close(dvb, dvb_c, 1e-4, 1e-5, "dv_blk");
  }
}

// ---------------- vocab loss rows ----------------

namespace {

// The CUDA block's view of one row: P threads, thread t takes v = t, t + P, …; partials merged in a tree.
template <typename S, typename Add>
S block_reduce(int V, int P, Add add) {
  std::vector<S> part(P);
  for (int t = 0; t < P; ++t)
    for (int v = t; v < V; v += P) add(part[t], v);
  for (int stride = 1; stride < P; stride *= 2)
    for (int t = 0; t + stride < P; t += 2 * stride) part[t].merge(part[t + stride]);
  return part[0];
}

void gpu_style_row_stats(const float* z, const float* u, int V, int y, const kernels::VocabLossCoeffs& k, int top_k,
                         int P, VocabLossRow& s, VocabLossRowValues& out) {
  const double tau = k.tau;
  const km::RowMax<float> mx = block_reduce<km::RowMax<float>>(V, P, [&](km::RowMax<float>& m, int v) { m.add(z[v], u ? u[v] : -INFINITY); });
  km::RowPass2In<float> in;
  in.zmax = mx.z, in.umax = mx.u, in.zy = z[y], in.y = y, in.tau1 = tau == 1.0, in.inv_tau = float(1.0 / tau);
  in.has_u = u != nullptr;
  km::RowSums<float> sums;
  if (std::isfinite(mx.z))
    sums = block_reduce<km::RowSums<float>>(V, P, [&](km::RowSums<float>& r, int v) { r.add(in, v, z[v], u ? u[v] : 0.f); });
  struct SumD {
    double v = 0;
    void merge(const SumD& o) { v += o.v; }
  };
  SumD excl;
  if (std::isfinite(mx.z) && km::needs_excl_pass(mx, sums, y)) {
    const float second = sums.second(mx.z);
    excl = block_reduce<SumD>(V, P, [&](SumD& d, int v) { d.v += km::excl_term(v, z[v], sums.argmax, second); });
  }
  const bool overlap = u && km::uses_overlap(k);
  km::RowOverlap ov;
  if (overlap && std::isfinite(mx.z)) {
    const km::OverlapIn<float> in4 = km::overlap_in(mx, sums);
    ov = block_reduce<km::RowOverlap>(V, P, [&](km::RowOverlap& o, int v) { o.add(in4, z[v], u[v]); });
  }
  km::finish_row_stats(mx, sums, excl.v, z[y], y, tau, top_k, u != nullptr, s, out);
  if (overlap && out.finite) km::finish_overlap(ov, k, s, out);
}

struct LossRowCase {
  std::vector<float> z, u;
  int y;
};

// Rows that exercise every branch: label = argmax, ties at the maximum (argmax = lowest index), a lone maximum
// more than kExclShortcutGap above the rest (CAP's own pass), very peaked target logits, ragged V.
std::vector<LossRowCase> loss_rows(int V, uint64_t seed) {
  std::vector<LossRowCase> rows;
  for (int k = 0; k < 6; ++k) {
    LossRowCase r;
    r.z = random_floats(V, seed + 10 * k, 3.0);
    r.u = random_floats(V, seed + 10 * k + 1, 3.0);
    r.y = int(Rng(seed + k).below(V));
    if (k == 1) r.y = int(std::max_element(r.z.begin(), r.z.end()) - r.z.begin());  // correct row
    if (k == 2 && V > 3) r.z[V - 1] = r.z[1] = r.z[V / 2] = 50.f;                  // ties at the max
    if (k == 3) r.z[V / 3] = 80.f;                                                  // gap > 40: CAP pass 3
    if (k == 4) r.u[r.y] = 60.f;                                                    // peaked target
    if (k == 5) r.z.assign(V, 1.5f);                                                // all equal
    rows.push_back(std::move(r));
  }
  return rows;
}

void check_row(const VocabLossRow& a, const VocabLossRow& b, const VocabLossRowValues& va,
               const VocabLossRowValues& vb) {
  auto near = [](double x, double y) { return std::fabs(x - y) <= 1e-12 + 1e-10 * std::fabs(y); };
  CHECK(va.finite == vb.finite);
  CHECK(va.correct == vb.correct);
  CHECK(va.topk == vb.topk);
  CHECK(near(va.ce, vb.ce));
  CHECK(near(va.kl, vb.kl));
  CHECK(near(va.cap, vb.cap));
  if (!vb.finite) return;
  CHECK(a.argmax == b.argmax);
  CHECK(a.cap_active == b.cap_active);
  CHECK(a.z_max == b.z_max);
  CHECK(near(a.z_logsum, b.z_logsum));
  CHECK(near(a.excl_max, b.excl_max));
  CHECK(near(a.excl_logsum, b.excl_logsum));
  CHECK(near(a.zt_logsum, b.zt_logsum));
  CHECK(a.u_max == b.u_max);
  CHECK(near(a.ut_logsum, b.ut_logsum));
  CHECK(near(a.one_minus_py, b.one_minus_py));
  CHECK(near(a.overlap, b.overlap));
  CHECK(near(a.overlap_below, b.overlap_below));
  CHECK(near(va.tv, vb.tv));
  CHECK(near(va.lk, vb.lk));
  CHECK(near(va.nla, vb.nla));
}

}  // namespace

// The same functions on both sides; only the order of the double sums differs (P = 256 strided partials merged in a
// tree vs one loop), ~V·2^-53 relative: 1e-10 is a loose bound that still catches a wrong merge (a lost partial, a
// wrong argmax or tie count, a second maximum from the wrong side).
TEST_CASE("cuda_math: loss row statistics merged from block partials equal the CPU's one-thread walk") {
  for (int V : {1, 7, 300, 4099}) {
    for (const LossRowCase& r : loss_rows(V, 100 + V)) {
      for (double tau : {1.0, 2.0}) {
        for (bool with_u : {false, true}) {
          for (int P : {1, 256}) {
            VocabLossRow a, b;
            VocabLossRowValues va, vb;
            const float* u = with_u ? r.u.data() : nullptr;
            kernels::VocabLossCoeffs k;
            k.tau = tau;
            if (tau == 1.0) k.tv = 0.5, k.lk = 0.3, k.nla = 0.2;  // the overlap pass (TV, LK, NLA) too
            gpu_style_row_stats(r.z.data(), u, V, r.y, k, 5, P, a, va);
            cpu::row_stats<float>(r.z.data(), u, V, r.y, k, 5, b, vb);
            INFO("V " << V << " y " << r.y << " tau " << tau << " u " << with_u << " P " << P);
            check_row(a, b, va, vb);
          }
        }
      }
    }
  }
  // non-finite logits: a NaN (max ignores it, the sum must not) and an infinity
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> z = random_floats(100, 7);
    z[42] = bad;
    VocabLossRow a, b;
    VocabLossRowValues va, vb;
    gpu_style_row_stats(z.data(), nullptr, 100, 3, kernels::VocabLossCoeffs{}, 5, 256, a, va);
    cpu::row_stats<float>(z.data(), nullptr, 100, 3, kernels::VocabLossCoeffs{}, 5, b, vb);
    CHECK(va.finite == 0);
    CHECK(vb.finite == 0);
  }
}

// ---------------- RMSNorm (the CUDA walk: per-row sums, dw from per-chunk partials) ----------------

// The CUDA RMSNorm: per-row Σ x² then rstd / y; backward per-row Σ g⊙n; dw from per-chunk column partials summed
// over chunks in order. Float sums of ≤ 100 terms in another order: ~1e-6 relative.
TEST_CASE("cuda_math: RMSNorm row math and chunked dw partials match the CPU kernel") {
  for (auto [rows, dim] : {std::pair{1, 1}, std::pair{7, 33}, std::pair{130, 96}}) {
    const auto x = random_floats(size_t(rows) * dim, 1), w = random_floats(dim, 2), dy = random_floats(x.size(), 3);
    std::vector<float> y_cpu(x.size()), rstd_cpu(rows), y(x.size()), rstd(rows);
    cpu::rmsnorm_forward(y_cpu.data(), rstd_cpu.data(), x.data(), w.data(), rows, dim, 1e-6f);
    for (int r = 0; r < rows; ++r) {
      float ss = 0;
      for (int i = 0; i < dim; ++i) ss += x[size_t(r) * dim + i] * x[size_t(r) * dim + i];
      rstd[r] = km::rmsnorm_rstd(ss, dim, 1e-6f);
      for (int i = 0; i < dim; ++i) y[size_t(r) * dim + i] = km::rmsnorm_y(x[size_t(r) * dim + i], rstd[r], w[i]);
    }
    require_close(rstd, rstd_cpu, 1e-6, 0, "rstd");
    require_close(y, y_cpu, 1e-6, 1e-7, "y");

    std::vector<float> dx_cpu(x.size(), 0.5f), dw_cpu(dim, 0.25f), dx = dx_cpu, dw = dw_cpu;
    cpu::rmsnorm_backward(dx_cpu.data(), dw_cpu.data(), dy.data(), x.data(), w.data(), rstd_cpu.data(), rows, dim);
    for (int r = 0; r < rows; ++r) {
      float dot = 0;
      for (int i = 0; i < dim; ++i) {
        const size_t o = size_t(r) * dim + i;
        dot += km::rmsnorm_gn(dy[o], w[i], x[o], rstd_cpu[r]);
      }
      for (int i = 0; i < dim; ++i) {
        const size_t o = size_t(r) * dim + i;
        dx[o] += km::rmsnorm_dx(dy[o], w[i], x[o], rstd_cpu[r], dot / float(dim));
      }
    }
    const int chunks = std::min(rows, 64), chunk_rows = (rows + chunks - 1) / chunks;  // norm_rope.cu's split
    for (int i = 0; i < dim; ++i) {
      float total = 0;
      for (int c = 0; c < chunks; ++c) {
        float part = 0;
        for (int r = c * chunk_rows; r < std::min(rows, (c + 1) * chunk_rows); ++r)
          part += km::rmsnorm_dw_term(dy[size_t(r) * dim + i], x[size_t(r) * dim + i], rstd_cpu[r]);
        total += part;
      }
      dw[i] += total;
    }
    require_close(dx, dx_cpu, 1e-5, 1e-6, "dx");
    require_close(dw, dw_cpu, 1e-5, 1e-5, "dw");
  }
}
