#pragma once
// One row of the vocab loss on the CPU, on logits already in memory: softmax statistics + CE/KL/CAP + metrics
// (row_stats), and d(logits) (row_grad). The math is in docs/loss.md; the row structs in kernels/vocab_loss_rows.h.
// Exponentials run in T (float on the fp32 path); every sum over the vocabulary accumulates in double.
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/loss_exp.h"
#include "kernels/vocab_loss_rows.h"

namespace dflash::cpu {

using kernels::kExclShortcutGap;
using kernels::VocabLossCoeffs;
using kernels::VocabLossRow;
using kernels::VocabLossRowValues;


template <typename T>
inline double sum_exp(const T* z, int begin, int end, T shift, T scale) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int v = begin; v < end; ++v) s += double(loss_exp((z[v] - shift) * scale));
  return s;
}

template <typename T>
inline T max_of(const T* z, int begin, int end) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int v = begin; v < end; ++v) m = z[v] > m ? z[v] : m;
  return m;
}

// z [V] drafter logits, u [V] target logits or null; y the label. Writes the row's statistics (=) and values (=).
template <typename T>
void row_stats(const T* z, const T* u, int V, int y, double tau, int top_k, VocabLossRow& s, VocabLossRowValues& out) {
  const T zmax = max_of(z, 0, V);
  if (!std::isfinite(double(zmax))) {
    out.finite = 0;
    return;
  }
  int m = 0;
  while (z[m] != zmax) ++m;  // first index of the maximum: argmax with the lowest index on ties
  // Σ_{v≠m} exp(z_v − z_max) kept apart from the 1 of v = m: 1 − p_m and CE at p_y → 1 need it exactly.
  const double s_excl = sum_exp(z, 0, m, zmax, T(1)) + sum_exp(z, m + 1, V, zmax, T(1));
  if (!std::isfinite(s_excl)) {  // a NaN among the logits (max ignores it, the sum does not)
    out.finite = 0;
    return;
  }
  const double logsum = std::log1p(s_excl);
  s.z_max = double(zmax);
  s.z_logsum = logsum;
  s.argmax = m;

  // Rank of the label: logits above it, and ties at lower indices (the argmax tie rule).
  const T zy = z[y];
  int64_t above = 0;
#pragma omp simd reduction(+ : above)
  for (int v = 0; v < y; ++v) above += z[v] >= zy;
#pragma omp simd reduction(+ : above)
  for (int v = y + 1; v < V; ++v) above += z[v] > zy;
  out.topk = above < top_k;
  out.correct = m == y;

  // CE = lse − z_y; 1 − p_y without cancellation: from Σ_{v≠m} when y is the argmax, else p_y ≤ 1/2.
  if (m == y) {
    out.ce = logsum;
    s.one_minus_py = s_excl / (1.0 + s_excl);
  } else {
    out.ce = (double(zmax) - double(zy)) + logsum;
    s.one_minus_py = 1.0 - std::exp(double(zy - zmax) - logsum);
  }

  // CAP = lse − lse_{v≠m} when the argmax is wrong.
  s.cap_active = m != y;
  if (m != y) {
    const T second = std::max(max_of(z, 0, m), max_of(z, m + 1, V));
    if (double(zmax) - double(second) <= kExclShortcutGap && s_excl > 0) {
      s.excl_max = double(zmax);
      s.excl_logsum = std::log(s_excl);
    } else {
      s.excl_max = double(second);
      s.excl_logsum = std::log(sum_exp(z, 0, m, second, T(1)) + sum_exp(z, m + 1, V, second, T(1)));
    }
    out.cap = (s.z_max - s.excl_max) + (logsum - s.excl_logsum);
  }

  // Softmax of z/τ (the same as p when τ = 1).
  const T inv_tau = T(1.0 / tau);
  s.zt_logsum = tau == 1.0 ? logsum : std::log(sum_exp(z, 0, V, zmax, inv_tau));

  // KL(q_τ ‖ p_τ) = Σ q_v [((u_v − u_max) − (z_v − z_max))/τ] − log S_u + log S_zτ, scaled by τ².
  if (u) {
    const T umax = max_of(u, 0, V);
    if (!std::isfinite(double(umax))) {
      out.finite = 0;
      return;
    }
    double su = 0, acc = 0;
#pragma omp simd reduction(+ : su, acc)
    for (int v = 0; v < V; ++v) {
      const double e = double(loss_exp((u[v] - umax) * inv_tau));
      su += e;
      acc += e * double((u[v] - umax) - (z[v] - zmax));
    }
    if (!std::isfinite(su + acc)) {
      out.finite = 0;
      return;
    }
    s.u_max = double(umax);
    s.ut_logsum = std::log(su);
    out.kl = tau * acc / su - tau * tau * (s.ut_logsum - s.zt_logsum);
  }
}

// The vocabulary loop of row_grad, one instantiation per combination of terms so that each vectorises.
template <typename T>
struct GradLoop {
  T a_p, a_pt, a_q, a_cap;  // coefficients of p, p_τ, q_τ and the CAP term
  T zmax, logsum, zt_logsum, umax, ut_logsum, excl_max, excl_logsum, inv_tau;
  template <bool KL, bool TAU1, bool CAP>
  void run(T* z, const T* u, int V) const {
#pragma omp simd
    for (int v = 0; v < V; ++v) {
      const T zv = z[v];
      T d = a_p * loss_exp((zv - zmax) - logsum);
      if constexpr (KL) {
        if constexpr (TAU1) {
          d += a_q * loss_exp((u[v] - umax) - ut_logsum);
        } else {
          d += a_pt * loss_exp((zv - zmax) * inv_tau - zt_logsum);
          d += a_q * loss_exp((u[v] - umax) * inv_tau - ut_logsum);
        }
      }
      if constexpr (CAP) d += a_cap * loss_exp((zv - excl_max) - excl_logsum);
      z[v] = d;
    }
  }
};

// z [V]: in = the row's logits, out (=) c · ∂ℓ/∂z with c = grad_scale · w; u [V] target logits (null without KL).
//   CE:  p − e_y (at y: −(1 − p_y) from the saved statistics)
//   KL:  τ (p_τ − q_τ)
//   CAP: at m: p_m; elsewhere −p_m p_v / (1 − p_m) = −p_m exp(z_v − lse_{v≠m})
template <typename T>
void row_grad(T* z, const T* u, int V, int y, const VocabLossRow& s, double c, const VocabLossCoeffs& k) {
  if (c == 0) {
    for (int v = 0; v < V; ++v) z[v] = T(0);
    return;
  }
  const bool kl = u && k.kl != 0;
  const bool cap = s.cap_active && k.cap != 0;
  const bool tau1 = k.tau == 1.0;
  const int m = s.argmax;
  const double tau = k.tau;
  const T zmax = T(s.z_max), umax = T(s.u_max), excl_max = T(s.excl_max);
  const T logsum = T(s.z_logsum), zt_logsum = T(s.zt_logsum), ut_logsum = T(s.ut_logsum), excl_logsum = T(s.excl_logsum);
  const T inv_tau = T(1.0 / tau);
  const double p_m = std::exp(-s.z_logsum);

  // Exact values at the label and the argmax, formed in double before the generic loop overwrites z.
  auto kl_term = [&](int v) {
    if (!kl) return 0.0;
    const double pt = std::exp(double(z[v] - zmax) / tau - s.zt_logsum);
    const double qt = std::exp(double(u[v] - umax) / tau - s.ut_logsum);
    return c * k.kl * tau * (pt - qt);
  };
  auto cap_other = [&](int v) { return cap ? -c * k.cap * p_m * std::exp(double(z[v] - excl_max) - s.excl_logsum) : 0.0; };
  const double at_y = c * k.ce * (-s.one_minus_py) + kl_term(y) + (y != m ? cap_other(y) : 0.0);
  const double at_m = m != y ? c * k.ce * p_m + kl_term(m) + (cap ? c * k.cap * p_m : 0.0) : at_y;

  GradLoop<T> g;
  g.a_p = T(c * k.ce + (kl && tau1 ? c * k.kl * tau : 0.0));  // τ = 1: p_τ = p shares the exponential
  g.a_pt = T(kl && !tau1 ? c * k.kl * tau : 0.0);
  g.a_q = T(kl ? -c * k.kl * tau : 0.0);
  g.a_cap = T(cap ? -c * k.cap * p_m : 0.0);
  g.zmax = zmax, g.logsum = logsum, g.zt_logsum = zt_logsum, g.umax = umax, g.ut_logsum = ut_logsum;
  g.excl_max = excl_max, g.excl_logsum = excl_logsum, g.inv_tau = inv_tau;
  if (!kl && !cap)
    g.template run<false, false, false>(z, u, V);
  else if (!kl && cap)
    g.template run<false, false, true>(z, u, V);
  else if (tau1 && !cap)
    g.template run<true, true, false>(z, u, V);
  else if (tau1 && cap)
    g.template run<true, true, true>(z, u, V);
  else if (!cap)
    g.template run<true, false, false>(z, u, V);
  else
    g.template run<true, false, true>(z, u, V);
  z[y] = T(at_y);
  z[m] = T(at_m);
}

}  // namespace dflash::cpu
