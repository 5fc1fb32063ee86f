#pragma once
// The vocab loss's per-row math, host and device: the only copy. The CPU row passes (kernels/cpu/vocab_loss_rows.h)
// are one "thread" that walks the whole row through these functions; the CUDA row passes
// (kernels/cuda/vocab_loss_rows.cu) give each thread of a block a strided share of the row and merge the partials in
// a fixed tree. The math is in docs/loss.md; the row structs in kernels/vocab_loss_rows.h. F is the compute type of
// the exponentials (float on the fp32 and bf16 paths, double on the CPU's double path); every sum over the
// vocabulary is in double. The passes:
//   pass 1: max z, max u                                  (RowMax)
//   pass 2: argmax, Σ_{v≠m} exp(z − z_max), label rank, second max, Σ exp((z − z_max)/τ), the KL sums   (RowSums)
//   pass 3: only when CAP needs it (gap > kExclShortcutGap): Σ_{v≠m} exp(z − second)                  (excl_term)
//   pass 4: only with TV / LK / NLA (τ = 1): the overlap Σ min(p, q) and Σ_{p<q} p, from pass 2's sums (RowOverlap)
//   finish: one thread turns the sums into VocabLossRow + VocabLossRowValues (finish_row_stats, finish_overlap).
// The gradient: grad_row_coeffs (one thread, doubles at the label and argmax) + grad_term (every element).
// CPU and CUDA differ only in the order of the double sums (one loop vs a tree over threads: a few ulp of double)
// and in nvcc's fused multiply-adds.
#include <math.h>
#include <stdint.h>

#include "kernels/math/hd.h"
#include "kernels/math/loss_exp.h"
#include "kernels/vocab_loss_rows.h"

namespace dflash::kernels::math {

// ---- pass 1 ----
template <typename F>
struct RowMax {
  F z = -INFINITY, u = -INFINITY;  // NaN is ignored (never > anything); a sum of pass 2 sees it
  DFLASH_HD void add(F zv, F uv) {
    z = zv > z ? zv : z;
    u = uv > u ? uv : u;
  }
  DFLASH_HD void merge(const RowMax& o) { add(o.z, o.u); }
};

// ---- pass 2 ----
// What pass 2 needs from pass 1 and the row: z_max, u_max, z_y, y, 1/τ and which sums to form.
template <typename F>
struct RowPass2In {
  F zmax = 0, umax = 0, zy = 0, inv_tau = 1;
  int y = 0;
  bool tau1 = true, has_u = false;
};

template <typename F>
DFLASH_HD inline RowPass2In<F> pass2_in(const RowMax<F>& mx, F zy, int y, double tau, bool has_u) {
  RowPass2In<F> in;
  in.zmax = mx.z;
  in.umax = mx.u;
  in.zy = zy;
  in.y = y;
  in.tau1 = tau == 1.0;
  in.inv_tau = F(1.0 / tau);
  in.has_u = has_u;
  return in;
}

template <typename F>
struct RowSums {
  int32_t argmax = 0x7fffffff;  // lowest index with z == z_max
  int32_t ties = 0;             // how many v have z == z_max (the argmax's own 1 is left out of s_lt)
  double s_lt = 0;              // Σ exp(z − z_max) over v with z ≠ z_max (NaN included: it must poison the sum)
  long long above = 0;          // label rank: v < y with z ≥ z_y, v > y with z > z_y
  F second_lt = -INFINITY;      // max z over z < z_max
  double zt = 0;                // Σ_v exp((z − z_max)/τ) (τ ≠ 1)
  double su = 0, acc = 0;       // Σ q̃ and Σ q̃ ((u − u_max) − (z − z_max)), q̃ = exp((u − u_max)/τ)

  DFLASH_HD void add(const RowPass2In<F>& in, int v, F zv, F uv) {
    if (zv == in.zmax) {
      ++ties;
      argmax = v < argmax ? v : argmax;
    } else {
      s_lt += double(loss_exp((zv - in.zmax) * F(1)));
      second_lt = zv > second_lt ? zv : second_lt;
    }
    above += v < in.y ? (zv >= in.zy) : (v > in.y ? (zv > in.zy) : 0);
    if (!in.tau1) zt += double(loss_exp((zv - in.zmax) * in.inv_tau));
    if (in.has_u) {
      const double e = double(loss_exp((uv - in.umax) * in.inv_tau));
      su += e;
      acc += e * double((uv - in.umax) - (zv - in.zmax));
    }
  }
  DFLASH_HD void merge(const RowSums& o) {
    argmax = o.argmax < argmax ? o.argmax : argmax;
    ties += o.ties;
    s_lt += o.s_lt;
    above += o.above;
    second_lt = o.second_lt > second_lt ? o.second_lt : second_lt;
    zt += o.zt;
    su += o.su;
    acc += o.acc;
  }
  // Σ_{v≠m} exp(z − z_max): the other maxima contribute exactly 1 each (loss_exp(0) = 1).
  DFLASH_HD double s_excl() const { return s_lt + double(ties - 1); }
  // max_{v≠m} z
  DFLASH_HD F second(F zmax) const { return ties > 1 ? zmax : second_lt; }
};

// ---- pass 3 (CAP only) ----
// True when lse_{v≠m} needs its own pass around the second maximum: Σ_{v≠m} exp(z_v − z_max) may have lost its
// leading terms to underflow when the gap exceeds kExclShortcutGap (or is empty).
template <typename F>
DFLASH_HD inline bool needs_excl_pass(const RowMax<F>& mx, const RowSums<F>& s, int y) {
  if (s.argmax == y) return false;
  const double se = s.s_excl();
  return !(double(mx.z) - double(s.second(mx.z)) <= kExclShortcutGap && se > 0);
}
// One element of Σ_{v≠m} exp(z_v − second).
template <typename F>
DFLASH_HD inline double excl_term(int v, F zv, int argmax, F second) {
  return v == argmax ? 0.0 : double(loss_exp((zv - second) * F(1)));
}

// ---- pass 4 (TV, LK, NLA: τ = 1) ----
// True when the row passes form the overlap of p = softmax(z) and q = softmax(u).
DFLASH_HD inline bool uses_overlap(const VocabLossCoeffs& k) { return k.tv != 0 || k.lk != 0 || k.nla != 0; }

// What pass 4 needs: z_max, log Σ exp(z − z_max), u_max, log Σ exp(u − u_max) in F — exactly the values
// grad_row_coeffs forms from the saved statistics, so that both passes compute the same p_v and q_v and put each
// v on the same side of p_v < q_v.
template <typename F>
struct OverlapIn {
  F zmax = 0, logsum = 0, umax = 0, ulogsum = 0;
};
template <typename F>
DFLASH_HD inline OverlapIn<F> overlap_in(const RowMax<F>& mx, const RowSums<F>& s) {
  OverlapIn<F> in;
  in.zmax = mx.z;
  in.logsum = F(log1p(s.s_excl()));
  in.umax = mx.u;
  in.ulogsum = F(log(s.su));  // τ = 1: su = Σ exp(u − u_max)
  return in;
}
// α = Σ_v min(p_v, q_v) and the p-mass below q, Σ_{v: p_v < q_v} p_v (TV's gradient: p_v (below − [p_v < q_v])).
struct RowOverlap {
  double alpha = 0, below = 0;
  template <typename F>
  DFLASH_HD void add(const OverlapIn<F>& in, F zv, F uv) {
    const F p = loss_exp((zv - in.zmax) - in.logsum), q = loss_exp((uv - in.umax) - in.ulogsum);
    alpha += double(p < q ? p : q);
    below += p < q ? double(p) : 0.0;
  }
  DFLASH_HD void merge(const RowOverlap& o) {
    alpha += o.alpha;
    below += o.below;
  }
};

// ---- finish: one thread ----
// The row's statistics (=) and values (=); the fields of a non-finite row after the first failing check are left
// alone. excl_sum: the pass-3 sum when needs_excl_pass, else unused.
template <typename F>
DFLASH_HD inline void finish_row_stats(const RowMax<F>& mx, const RowSums<F>& sums, double excl_sum, F zy, int y,
                                       double tau, int top_k, bool has_u, VocabLossRow& s, VocabLossRowValues& out) {
  const F zmax = mx.z;
  if (!isfinite(double(zmax))) {
    out.finite = 0;
    return;
  }
  const int m = sums.argmax;
  const double s_excl = sums.s_excl();
  if (!isfinite(s_excl)) {  // a NaN among the logits (max ignores it, the sum does not)
    out.finite = 0;
    return;
  }
  const double logsum = log1p(s_excl);  // Σ_{v≠m} kept apart from the 1 of v = m: no cancellation at p_m → 1
  s.z_max = double(zmax);
  s.z_logsum = logsum;
  s.argmax = m;
  out.topk = sums.above < top_k;
  out.correct = m == y;
  // CE = lse − z_y; 1 − p_y without cancellation: from Σ_{v≠m} when y is the argmax, else p_y ≤ 1/2.
  if (m == y) {
    out.ce = logsum;
    s.one_minus_py = s_excl / (1.0 + s_excl);
  } else {
    out.ce = (double(zmax) - double(zy)) + logsum;
    s.one_minus_py = 1.0 - exp(double(zy - zmax) - logsum);
  }
  // CAP = lse − lse_{v≠m} when the argmax is wrong.
  s.cap_active = m != y;
  if (m != y) {
    if (!needs_excl_pass(mx, sums, y)) {
      s.excl_max = double(zmax);
      s.excl_logsum = log(s_excl);
    } else {
      s.excl_max = double(sums.second(zmax));
      s.excl_logsum = log(excl_sum);
    }
    out.cap = (s.z_max - s.excl_max) + (logsum - s.excl_logsum);
  }
  // Softmax of z/τ (the same as p when τ = 1).
  s.zt_logsum = tau == 1.0 ? logsum : log(sums.zt);
  // KL(q_τ ‖ p_τ) = Σ q_v [((u_v − u_max) − (z_v − z_max))/τ] − log S_u + log S_zτ, scaled by τ².
  if (has_u) {
    if (!isfinite(double(mx.u)) || !isfinite(sums.su + sums.acc)) {
      out.finite = 0;
      return;
    }
    s.u_max = double(mx.u);
    s.ut_logsum = log(sums.su);
    out.kl = tau * sums.acc / sums.su - tau * tau * (s.ut_logsum - s.zt_logsum);
  }
}

// The TV / LK / NLA values from pass 4 (after finish_row_stats, whose KL at τ = 1 LK blends in).
DFLASH_HD inline void finish_overlap(const RowOverlap& o, const VocabLossCoeffs& k, VocabLossRow& s,
                                     VocabLossRowValues& out) {
  s.overlap = o.alpha;
  s.overlap_below = o.below;
  out.tv = 1.0 - o.alpha;
  out.nla = -log(o.alpha > kNlaFloor ? o.alpha : kNlaFloor);
  const double lambda = exp(-k.lk_eta * o.alpha);
  out.lk = lambda * out.kl + (1.0 - lambda) * out.tv;
}

// ---- gradient ----
// c · ∂ℓ/∂z for a row, with c = grad_scale · w:
//   CE:  p − e_y (at y: −(1 − p_y) from the saved statistics)
//   KL:  τ (p_τ − q_τ)
//   CAP: at m: p_m; elsewhere −p_m p_v / (1 − p_m) = −p_m exp(z_v − lse_{v≠m})
//   TV:  p_v (below − [p_v < q_v]);  NLA: the same / α (0 when α ≤ kNlaFloor);
//   LK:  λ (p − q) + (1 − λ) ∂TV, λ = exp(−η α) held fixed: LK's KL part joins KL's coefficient (τ = 1)
// Everything grad_term needs, formed once per row from the forward statistics, and the exact values at the label
// and the argmax, formed in double from the row's original logits (written after the element loop).
template <typename F>
struct GradRow {
  F a_p = 0, a_pt = 0, a_q = 0, a_cap = 0, a_tv = 0;  // coefficients of p, p_τ, q_τ, the CAP and the TV terms
  F zmax = 0, logsum = 0, zt_logsum = 0, umax = 0, ut_logsum = 0, excl_max = 0, excl_logsum = 0, inv_tau = 1;
  F below = 0;  // Σ_{v: p_v < q_v} p_v (TV)
  bool kl = false, tau1 = true, cap = false, tv = false, zero = false;
  int y = 0, m = 0;
  double at_y = 0, at_m = 0;
};

// zy, zm, uy, um: the row's logits at the label and the argmax (u: 0 without KL). c == 0 gives a zero row.
template <typename F>
DFLASH_HD inline GradRow<F> grad_row_coeffs(const VocabLossRow& s, int y, F zy, F zm, F uy, F um, bool has_u,
                                            double c, const VocabLossCoeffs& k) {
  GradRow<F> g;
  g.y = y;
  g.m = s.argmax;
  if (c == 0) {
    g.zero = true;
    return g;
  }
  const double tau = k.tau;
  // TV / LK / NLA (τ = 1, checked by the caller): λ = exp(−η α) and α held fixed; LK's λ KL joins KL's coefficient
  // of (p_τ − q_τ), the rest of the three is one coefficient of TV's gradient.
  const bool ov = has_u && uses_overlap(k);
  const double lambda = ov ? exp(-k.lk_eta * s.overlap) : 0.0;
  const double kl_coef = k.kl * tau + (ov ? k.lk * lambda : 0.0);
  const double tv_coef =
      ov ? k.tv + k.lk * (1.0 - lambda) + (s.overlap > kNlaFloor ? k.nla / s.overlap : 0.0) : 0.0;
  g.kl = has_u && kl_coef != 0;
  g.tv = tv_coef != 0;
  g.cap = s.cap_active && k.cap != 0;
  g.tau1 = tau == 1.0;
  g.zmax = F(s.z_max), g.umax = F(s.u_max), g.excl_max = F(s.excl_max);
  g.logsum = F(s.z_logsum), g.zt_logsum = F(s.zt_logsum), g.ut_logsum = F(s.ut_logsum);
  g.excl_logsum = F(s.excl_logsum);
  g.inv_tau = F(1.0 / tau);
  g.below = F(s.overlap_below);
  const double p_m = exp(-s.z_logsum);
  const bool kl = g.kl, cap = g.cap, tv = g.tv;
  const F zmax = g.zmax, umax = g.umax, excl_max = g.excl_max;
  auto kl_term = [&](F zv, F uv) {
    if (!kl) return 0.0;
    const double pt = exp(double(zv - zmax) / tau - s.zt_logsum);
    const double qt = exp(double(uv - umax) / tau - s.ut_logsum);
    return c * kl_coef * (pt - qt);
  };
  auto cap_other = [&](F zv) { return cap ? -c * k.cap * p_m * exp(double(zv - excl_max) - s.excl_logsum) : 0.0; };
  auto tv_term = [&](F zv, F uv) {
    if (!tv) return 0.0;
    const double p = exp(double(zv - zmax) - s.z_logsum), q = exp(double(uv - umax) - s.ut_logsum);
    return c * tv_coef * p * (s.overlap_below - (p < q ? 1.0 : 0.0));
  };
  const int m = g.m;
  g.at_y = c * k.ce * (-s.one_minus_py) + kl_term(zy, uy) + (y != m ? cap_other(zy) : 0.0) + tv_term(zy, uy);
  g.at_m = m != y ? c * k.ce * p_m + kl_term(zm, um) + (cap ? c * k.cap * p_m : 0.0) + tv_term(zm, um) : g.at_y;
  g.a_p = F(c * k.ce + (kl && g.tau1 ? c * kl_coef : 0.0));  // τ = 1: p_τ = p shares the exponential
  g.a_pt = F(kl && !g.tau1 ? c * kl_coef : 0.0);
  g.a_q = F(kl ? -c * kl_coef : 0.0);
  g.a_cap = F(cap ? -c * k.cap * p_m : 0.0);
  g.a_tv = F(c * tv_coef);
  return g;
}

// c · ∂ℓ/∂z_v for v ∉ {y, m}, with the terms fixed at compile time (the CPU instantiates one loop per combination so
// that each vectorises; uv unused without KL). TV comes with KL and TAU1 (it needs q at τ = 1; a_q may be 0).
template <bool KL, bool TAU1, bool CAP, bool TV = false, typename F>
DFLASH_HD inline F grad_term(const GradRow<F>& g, F zv, F uv) {
  static_assert(!TV || (KL && TAU1), "the TV terms take the KL path at tau = 1");
  const F p = loss_exp((zv - g.zmax) - g.logsum);
  F d = g.a_p * p;
  if constexpr (KL) {
    if constexpr (TAU1) {
      const F q = loss_exp((uv - g.umax) - g.ut_logsum);
      d += g.a_q * q;
      if constexpr (TV) d += g.a_tv * p * (g.below - (p < q ? F(1) : F(0)));
    } else {
      d += g.a_pt * loss_exp((zv - g.zmax) * g.inv_tau - g.zt_logsum);
      d += g.a_q * loss_exp((uv - g.umax) * g.inv_tau - g.ut_logsum);
    }
  }
  if constexpr (CAP) d += g.a_cap * loss_exp((zv - g.excl_max) - g.excl_logsum);
  return d;
}

// The same with the terms chosen at run time (the CUDA kernel; 0 for a zero row).
template <typename F>
DFLASH_HD inline F grad_element(const GradRow<F>& g, F zv, F uv) {
  if (g.zero) return F(0);
  if (g.tv) return g.cap ? grad_term<true, true, true, true>(g, zv, uv) : grad_term<true, true, false, true>(g, zv, uv);
  if (!g.kl) return g.cap ? grad_term<false, false, true>(g, zv, uv) : grad_term<false, false, false>(g, zv, uv);
  if (g.tau1) return g.cap ? grad_term<true, true, true>(g, zv, uv) : grad_term<true, true, false>(g, zv, uv);
  return g.cap ? grad_term<true, false, true>(g, zv, uv) : grad_term<true, false, false>(g, zv, uv);
}

}  // namespace dflash::kernels::math
