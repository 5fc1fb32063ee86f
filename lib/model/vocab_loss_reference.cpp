// The plain reference of the vocab loss: every [rows, V] logit materialised in long double, each quantity written
// from its definition (docs/loss.md, "The math, per row" and "Position weights"). Slow on purpose; tests compare
// against it. D-PACE factors are formed here from their definition (products and suffix sums written out), not
// by the kernels' recursion (kernels/math/dpace.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "lib/core/error.h"
#include "lib/model/vocab_loss.h"

namespace dflash::model {

namespace {
using LD = long double;

LD logsumexp(const std::vector<LD>& x, int skip = -1) {
  LD mx = -INFINITY;
  for (size_t v = 0; v < x.size(); ++v)
    if (int(v) != skip) mx = std::max(mx, x[v]);
  LD s = 0;
  for (size_t v = 0; v < x.size(); ++v)
    if (int(v) != skip) s += std::exp(x[v] - mx);
  return mx + std::log(s);
}
}  // namespace

VocabLossResult vocab_loss_reference(const VocabLossSettings& st, const VocabLossBatch<double>& b, const double* W,
                                     int V, int H, double grad_scale, double* dX) {
  const int R = b.rows, B = st.block_size;
  const LD tau = st.kl_temperature;
  DFLASH_CHECK(!st.uses_overlap() || st.kl_temperature == 1.0, "vocab loss reference: TV / LK / NLA need τ = 1");
  VocabLossResult out;
  out.metrics.correct.assign(size_t(B), 0);
  out.metrics.scored.assign(size_t(B), 0);
  LD ce_sum = 0, kl_sum = 0, cap_sum = 0, tv_sum = 0, lk_sum = 0, nla_sum = 0, w_sum = 0;
  std::map<int, std::vector<std::pair<int, bool>>> blocks;  // block id → (k, scored and correct)
  const size_t nv = size_t(V);
  std::vector<LD> z(nv), u(nv), zt(nv), ut(nv);
  std::vector<LD> row_loss(size_t(R), 0), row_ce(size_t(R), 0);  // ℓ_r (all λ-weighted terms) and CE_r
  std::vector<LD> grad(dX ? size_t(R) * nv : 0, 0);                // ∂ℓ_r/∂z_r, one row per scored row

  for (int r = 0; r < R; ++r) {
    const int y = b.labels[r];
    DFLASH_CHECK(y >= 0 && y < V, "vocab loss reference: row {} has label {} outside [0, {})", r, y, V);
    const LD w = b.weights[r];
    for (int v = 0; v < V; ++v) {
      LD s = 0, t = 0;
      for (int h = 0; h < H; ++h) {
        s += LD(b.hidden[size_t(r) * H + h]) * LD(W[size_t(v) * H + h]);
        if (b.target_hidden) t += LD(b.target_hidden[size_t(r) * H + h]) * LD(W[size_t(v) * H + h]);
      }
      z[v] = s;
      u[v] = t;
      zt[v] = s / tau;
      ut[v] = t / tau;
    }
    int m = 0;
    for (int v = 1; v < V; ++v)
      if (z[v] > z[m]) m = v;
    const LD lse = logsumexp(z);
    std::vector<LD> p(nv);
    for (int v = 0; v < V; ++v) p[v] = std::exp(z[v] - lse);

    // CE = −log p_y; at the argmax written as log Σ_v exp(z_v − z_y) = log1p(Σ_{v≠y} …) so it keeps its digits.
    LD ce;
    if (y == m) {
      LD s = 0;
      for (int v = 0; v < V; ++v)
        if (v != y) s += std::exp(z[v] - z[y]);
      ce = std::log1p(s);
    } else {
      ce = lse - z[y];
    }
    // KL(q_τ ‖ p_τ) · τ²
    LD kl = 0;
    std::vector<LD> pt(nv), qt(nv);
    if (b.target_hidden) {
      const LD lzt = logsumexp(zt), lut = logsumexp(ut);
      for (int v = 0; v < V; ++v) {
        pt[v] = std::exp(zt[v] - lzt);
        qt[v] = std::exp(ut[v] - lut);
        kl += qt[v] * ((ut[v] - lut) - (zt[v] - lzt));
      }
      kl *= tau * tau;
    }
    // CAP = [m ≠ y] (lse − lse_{v≠m})
    LD cap = 0, lse_excl = 0;
    if (m != y) {
      lse_excl = logsumexp(z, m);
      cap = lse - lse_excl;
    }
    // α = Σ min(p, q) at τ = 1 (τ = 1 here, so qt = softmax(u)); TV = 1 − α, NLA = −log max(α, floor),
    // LK = λ KL + (1 − λ) TV with λ = exp(−η α) treated as a constant
    const bool overlap = st.uses_overlap() && b.target_hidden;
    LD alpha = 0, tv = 0, nla = 0, lk = 0, lambda = 0;
    if (overlap) {
      for (int v = 0; v < V; ++v) alpha += std::min(p[v], qt[v]);
      tv = 1 - alpha;
      nla = -std::log(std::max(alpha, LD(kernels::kNlaFloor)));
      lambda = std::exp(-LD(st.lk_eta) * alpha);
      lk = lambda * kl + (1 - lambda) * tv;
    }
    const bool scored = w > 0;
    if (scored) {
      w_sum += w;
      ce_sum += w * ce;
      kl_sum += w * kl;
      cap_sum += w * cap;
      tv_sum += w * tv;
      lk_sum += w * lk;
      nla_sum += w * nla;
      row_ce[size_t(r)] = ce;
      row_loss[size_t(r)] = LD(st.ce_weight) * ce + LD(st.kl_weight) * kl + LD(st.cap_weight) * cap +
                            LD(st.tv_weight) * tv + LD(st.lk_weight) * lk + LD(st.nla_weight) * nla;
      const int k = b.block_pos[r];
      out.metrics.scored[size_t(k)] += 1;
      out.metrics.correct[size_t(k)] += (m == y);
      int above = 0;
      for (int v = 0; v < V; ++v) above += z[v] > z[y] || (z[v] == z[y] && v < y);
      out.metrics.topk_hits += above < st.top_k;
    }
    blocks[b.block_id[r]].push_back({b.block_pos[r], scored && m == y});
    (void)scored;

    if (dX && scored) {
      // ∂α/∂z_j = Σ_{v: p_v < q_v} p_v (δ_vj − p_j): TV's gradient is −that
      LD below = 0;
      if (overlap)
        for (int v = 0; v < V; ++v) below += p[v] < qt[v] ? p[v] : 0;
      for (int v = 0; v < V; ++v) {
        LD g = LD(st.ce_weight) * p[v];
        if (v == y) {  // p_y − 1 = −Σ_{v≠y} p_v
          LD rest = 0;
          for (int j = 0; j < V; ++j)
            if (j != y) rest += p[j];
          g = -LD(st.ce_weight) * rest;
        }
        if (b.target_hidden) g += LD(st.kl_weight) * tau * (pt[v] - qt[v]);
        if (m != y) g += LD(st.cap_weight) * (v == m ? p[m] : -p[m] * std::exp(z[v] - lse_excl));
        if (overlap) {
          const LD d_tv = p[v] * (below - (p[v] < qt[v] ? 1 : 0));
          g += LD(st.tv_weight) * d_tv;
          g += LD(st.nla_weight) * (alpha > LD(kernels::kNlaFloor) ? d_tv / alpha : 0);
          g += LD(st.lk_weight) * (lambda * (p[v] - qt[v]) + (1 - lambda) * d_tv);  // KL at τ = 1
        }
        grad[size_t(r) * nv + size_t(v)] = g;
      }
    }
  }

  // Position factors d_r: 1 (decay), or D-PACE over each block's rows in order of k, from q = exp(−CE):
  //   q̃ = α + (1 − α) q on scored rows, 1 elsewhere; C_k = Π_{i ≤ k} q̃_i; S_k = Σ_{m ≥ k, scored} C_m
  //   dpace: S_k, cumulative confidence: C_k, continuation value: S_k / C_k
  std::vector<LD> factor(size_t(R), 1);
  if (st.position_weight != PositionWeight::decay) {
    const LD a = st.dpace_alpha;
    for (int r0 = 0; r0 < R;) {
      int r1 = r0 + 1;
      while (r1 < R && b.block_id[r1] == b.block_id[r0]) ++r1;
      for (int j = r0; j < r1; ++j) {
        auto smooth = [&](int i) { return b.weights[i] > 0 ? a + (1 - a) * std::exp(-row_ce[size_t(i)]) : LD(1); };
        auto cumulative = [&](int m) {
          LD c = 1;
          for (int i = r0; i <= m; ++i) c *= smooth(i);
          return c;
        };
        LD suffix = 0;
        for (int m = j; m < r1; ++m)
          if (b.weights[m] > 0) suffix += cumulative(m);
        switch (st.position_weight) {
          case PositionWeight::dpace: factor[size_t(j)] = suffix; break;
          case PositionWeight::dpace_cumulative_confidence: factor[size_t(j)] = cumulative(j); break;
          case PositionWeight::dpace_continuation_value: factor[size_t(j)] = suffix / cumulative(j); break;
          case PositionWeight::decay: break;
        }
      }
      r0 = r1;
    }
  }
  LD loss = 0, dpace_sum = 0;
  for (int r = 0; r < R; ++r) {
    const LD w = b.weights[r];
    if (!(w > 0)) continue;
    loss += w * factor[size_t(r)] * row_loss[size_t(r)];
    dpace_sum += w * factor[size_t(r)];
  }
  if (dX) {
    for (int r = 0; r < R; ++r) {
      const LD c = LD(grad_scale) * LD(b.weights[r]) * factor[size_t(r)];
      for (int h = 0; h < H; ++h) {
        LD s = 0;
        if (b.weights[r] > 0)
          for (int v = 0; v < V; ++v) s += c * grad[size_t(r) * nv + size_t(v)] * LD(W[size_t(v) * H + h]);
        dX[size_t(r) * H + h] = double(s);
      }
    }
  }
  for (auto& [id, rows] : blocks) {
    std::sort(rows.begin(), rows.end());
    bool any_scored = false;
    for (int r = 0; r < R; ++r) any_scored = any_scored || (b.block_id[r] == id && b.weights[r] > 0);
    if (!any_scored) continue;
    int run = 0;
    for (auto& [k, ok] : rows) {
      if (k == run + 1 && ok)
        ++run;
      else
        break;
    }
    out.metrics.blocks += 1;
    out.metrics.accepted_sum += 1 + run;
  }
  out.sums.loss = double(loss);
  out.sums.ce = double(ce_sum);
  out.sums.kl = double(kl_sum);
  out.sums.cap = double(cap_sum);
  out.sums.tv = double(tv_sum);
  out.sums.lk = double(lk_sum);
  out.sums.nla = double(nla_sum);
  out.sums.weight = double(w_sum);
  out.sums.dpace = double(dpace_sum);
  return out;
}

}  // namespace dflash::model
