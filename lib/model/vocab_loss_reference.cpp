// The plain reference of the vocab loss: every [rows, V] logit materialised in long double, each quantity written
// from its definition (docs/loss.md, "The math, per row"). Slow on purpose; tests compare against it.
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
  VocabLossResult out;
  out.metrics.correct.assign(size_t(B), 0);
  out.metrics.scored.assign(size_t(B), 0);
  LD loss = 0, ce_sum = 0, kl_sum = 0, cap_sum = 0, w_sum = 0;
  std::map<int, std::vector<std::pair<int, bool>>> blocks;  // block id → (k, scored and correct)
  const size_t nv = size_t(V);
  std::vector<LD> z(nv), u(nv), zt(nv), ut(nv), dz(nv);

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
    const bool scored = w > 0;
    if (scored) {
      w_sum += w;
      ce_sum += w * ce;
      kl_sum += w * kl;
      cap_sum += w * cap;
      loss += w * (LD(st.ce_weight) * ce + LD(st.kl_weight) * kl + LD(st.cap_weight) * cap);
      const int k = b.block_pos[r];
      out.metrics.scored[size_t(k)] += 1;
      out.metrics.correct[size_t(k)] += (m == y);
      int above = 0;
      for (int v = 0; v < V; ++v) above += z[v] > z[y] || (z[v] == z[y] && v < y);
      out.metrics.topk_hits += above < st.top_k;
    }
    blocks[b.block_id[r]].push_back({b.block_pos[r], scored && m == y});
    (void)scored;

    if (dX) {
      const LD c = LD(grad_scale) * w;
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
        dz[v] = scored ? c * g : 0;
      }
      for (int h = 0; h < H; ++h) {
        LD s = 0;
        for (int v = 0; v < V; ++v) s += dz[v] * LD(W[size_t(v) * H + h]);
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
  out.sums.weight = double(w_sum);
  return out;
}

}  // namespace dflash::model
