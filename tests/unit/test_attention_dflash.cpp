// DFlash attention against a dense reference with an explicit mask, and its backward against finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "fd_check.h"
#include "kernels/cpu/attention_dflash.h"

using namespace dflash;
using namespace dflash::test;
using Vec = std::vector<double>;

namespace {

struct Case {
  cpu::DFlashAttentionShape s;
  std::vector<int> anchors;
  Vec q, kc, vc, kb, vb;
};

Case make_case(int window) {
  Case c;
  c.s = {/*n_blocks*/ 4, /*block*/ 3, /*ctx_len*/ 9, /*heads*/ 4, /*kv_heads*/ 2, /*head_dim*/ 4, window};
  c.anchors = {0, 4, 5, 8};  // one at 0 (no context), two overlapping, one at the end
  const size_t NB = size_t(c.s.n_blocks) * c.s.block, S = c.s.ctx_len, D = c.s.head_dim;
  c.q = random_vector(NB * c.s.heads * D, 21);
  c.kc = random_vector(S * c.s.kv_heads * D, 22);
  c.vc = random_vector(S * c.s.kv_heads * D, 23);
  c.kb = random_vector(NB * c.s.kv_heads * D, 24);
  c.vb = random_vector(NB * c.s.kv_heads * D, 25);
  return c;
}

// The mask written directly from its definition (docs/drafter.md), over the concatenated keys [context ; every block's rows].
bool visible(const Case& c, int qrow, int key) {
  const int B = c.s.block, S = c.s.ctx_len, b = qrow / B, j = qrow % B, a = c.anchors[b];
  if (key < S) {
    if (key >= a) return false;  // strict: the anchor's own context row is not visible
    return c.s.window == 0 || key >= a + j - (c.s.window - 1);
  }
  const int kb = (key - S) / B, kj = (key - S) % B;
  if (kb != b) return false;  // other blocks are never visible
  return c.s.window == 0 || kj <= j;
}

Vec reference_forward(const Case& c) {
  const int B = c.s.block, S = c.s.ctx_len, NB = c.s.n_blocks * B, NH = c.s.heads, KVH = c.s.kv_heads;
  const int D = c.s.head_dim, G = NH / KVH;
  Vec out(size_t(NB) * NH * D, 0.0);
  for (int r = 0; r < NB; ++r)
    for (int h = 0; h < NH; ++h) {
      std::vector<double> score(S + NB, -INFINITY);
      double m = -INFINITY;
      for (int t = 0; t < S + NB; ++t) {
        if (!visible(c, r, t)) continue;
        const double* k = t < S ? &c.kc[(size_t(t) * KVH + h / G) * D] : &c.kb[(size_t(t - S) * KVH + h / G) * D];
        double d = 0;
        for (int i = 0; i < D; ++i) d += c.q[(size_t(r) * NH + h) * D + i] * k[i];
        score[t] = d / std::sqrt(double(D));
        m = std::max(m, score[t]);
      }
      double l = 0;
      for (double& x : score) l += (x = std::exp(x - m));
      for (int t = 0; t < S + NB; ++t) {
        const double* v = t < S ? &c.vc[(size_t(t) * KVH + h / G) * D] : &c.vb[(size_t(t - S) * KVH + h / G) * D];
        for (int i = 0; i < D; ++i) out[(size_t(r) * NH + h) * D + i] += score[t] / l * v[i];
      }
    }
  return out;
}

void check_case(int window) {
  Case c = make_case(window);
  const size_t NB = size_t(c.s.n_blocks) * c.s.block;
  Vec out(NB * c.s.heads * c.s.head_dim), lse(NB * c.s.heads);
  auto forward = [&] {
    cpu::dflash_attention_forward(out.data(), lse.data(), c.q.data(), c.kc.data(), c.vc.data(), c.kb.data(),
                                  c.vb.data(), c.anchors.data(), c.s);
  };
  forward();
  Vec ref = reference_forward(c);
  double max_err = 0;
  for (size_t i = 0; i < out.size(); ++i) max_err = std::max(max_err, std::abs(out[i] - ref[i]));
  INFO("window " << window << ": forward max abs err vs dense reference " << max_err);
  CHECK(max_err < 1e-13);

  Vec r = random_vector(out.size(), 26);
  auto loss = [&] {
    forward();
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += r[i] * out[i];
    return s;
  };
  Vec dq(c.q.size(), 0.0), dkc(c.kc.size(), 0.0), dvc(c.vc.size(), 0.0), dkb(c.kb.size(), 0.0),
      dvb(c.vb.size(), 0.0);
  forward();
  cpu::dflash_attention_backward(dq.data(), dkc.data(), dvc.data(), dkb.data(), dvb.data(), r.data(), out.data(),
                                 lse.data(), c.q.data(), c.kc.data(), c.vc.data(), c.kb.data(), c.vb.data(),
                                 c.anchors.data(), c.s);
  // context rows no query may see (>= the largest anchor) must get exactly zero gradient
  for (size_t i = size_t(8) * c.s.kv_heads * c.s.head_dim; i < dkc.size(); ++i) CHECK(dkc[i] == 0.0);
  struct {
    const char* name;
    Vec* x;
    Vec* g;
  } tensors[] = {{"q", &c.q, &dq}, {"k_ctx", &c.kc, &dkc}, {"v_ctx", &c.vc, &dvc}, {"k_blk", &c.kb, &dkb},
                 {"v_blk", &c.vb, &dvb}};
  for (auto& t : tensors) {
    auto res = fd_check(*t.x, *t.g, loss);
    INFO("window " << window << ", d" << t.name << ": " << describe(res));
    CHECK(res.max_rel_err <= 1e-6);
  }
}

}  // namespace

TEST_CASE("dflash attention (full layer): dense-reference forward and finite-difference backward") {
  check_case(0);
}

TEST_CASE("dflash attention (sliding window 3, causal in block): dense-reference forward and FD backward") {
  check_case(3);
}

TEST_CASE("dflash attention counts the admitted (query, key, head) pairs") {
  Case c = make_case(0);
  // full: each row sees anchor context rows + 3 block rows: (0+3 + 4+3 + 5+3 + 8+3) rows × 3 queries × 4 heads
  CHECK(cpu::dflash_attention_pairs(c.anchors.data(), c.s) == (3 + 7 + 8 + 11) * 3 * 4);
}
