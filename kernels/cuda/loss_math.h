#pragma once
// Per-row math of the CUDA vocab-loss row passes, host and device. It replicates kernels/cpu/vocab_loss_rows.h
// (same formulas, same exp polynomial, same float/double split) but is cut into what a thread block needs:
//   pass 1: max z, max u                                  (RowMax, merged across threads)
//   pass 2: argmax, Σ_{v≠m} exp(z − z_max), label rank, second max, Σ exp((z − z_max)/τ), the KL sums
//                                                         (RowSums, merged across threads)
//   pass 3: only when CAP needs it (gap > kExclShortcutGap): Σ_{v≠m} exp(z − second)
//   finish: one thread turns the sums into VocabLossRow + VocabLossRowValues (finish_row_stats).
// The gradient: grad_row_coeffs (one thread, doubles at the label and argmax) + grad_element (every element).
// Sums over the vocabulary are in double, exponentials in float, as on the CPU; only the summation order differs
// (a tree over threads instead of a loop), which changes the double sums by a few ulp of double.
// tests/unit/test_cuda_math.cpp runs this on the CPU against kernels/cpu/vocab_loss_rows.h.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/attention_shape.h"  // DFLASH_HD
#include "kernels/vocab_loss_rows.h"

namespace dflash::kernels::cuda_math {

DFLASH_HD inline float float_from_bits(int32_t i) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(i);
#else
  float f;
  memcpy(&f, &i, sizeof f);
  return f;
#endif
}
DFLASH_HD inline int32_t bits_from_float(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(f);
#else
  int32_t i;
  memcpy(&i, &f, sizeof i);
  return i;
#endif
}

// The CPU's loss_exp (kernels/cpu/loss_exp.h): Cephes expf, ≤ 2 ulp on [−87.3, 88.3], 0 below, clamped above.
// The same polynomial on both sides keeps the GPU's softmax within an ulp or two of the CPU's (nvcc may fuse
// multiply-adds, g++ on x86-64 does not: that is the remaining difference).
DFLASH_HD inline float loss_expf(float x) {
  const float xc = x > 88.3f ? 88.3f : (x < -87.3f ? -87.3f : x);
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const int32_t ni = bits_from_float(t) - 0x4B400000;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r2 + r + 1.0f;
  const float e = y * float_from_bits((ni + 127) << 23);
  return x < -87.3f ? 0.0f : e;
}

// ---- pass 1 ----
struct RowMax {
  float z = -INFINITY, u = -INFINITY;  // NaN is ignored (as the CPU's max_of), a sum later sees it
  DFLASH_HD void add(float zv, float uv) {
    z = zv > z ? zv : z;
    u = uv > u ? uv : u;
  }
  DFLASH_HD void merge(const RowMax& o) { add(o.z, o.u); }
};

// ---- pass 2 ----
// What pass 2 needs from pass 1 and the row: z_max, u_max, z_y, y, 1/τ and which sums to form.
struct RowPass2In {
  float zmax = 0, umax = 0, zy = 0, inv_tau = 1;
  int y = 0;
  bool tau1 = true, has_u = false;
};

struct RowSums {
  int32_t argmax = 0x7fffffff;  // lowest index with z == z_max
  int32_t ties = 0;             // how many v have z == z_max (the argmax's own 1 is left out of s_lt)
  double s_lt = 0;              // Σ exp(z − z_max) over v with z ≠ z_max (NaN included: it must poison the sum)
  long long above = 0;          // label rank: v < y with z ≥ z_y, v > y with z > z_y
  float second_lt = -INFINITY;  // max z over z < z_max
  double zt = 0;                // Σ_v exp((z − z_max)/τ) (τ ≠ 1)
  double su = 0, acc = 0;       // Σ q̃ and Σ q̃ ((u − u_max) − (z − z_max)), q̃ = exp((u − u_max)/τ)

  DFLASH_HD void add(const RowPass2In& in, int v, float zv, float uv) {
    if (zv == in.zmax) {
      ++ties;
      argmax = v < argmax ? v : argmax;
    } else {
      s_lt += double(loss_expf((zv - in.zmax) * 1.0f));
      second_lt = zv > second_lt ? zv : second_lt;
    }
    above += v < in.y ? (zv >= in.zy) : (v > in.y ? (zv > in.zy) : 0);
    if (!in.tau1) zt += double(loss_expf((zv - in.zmax) * in.inv_tau));
    if (in.has_u) {
      const double e = double(loss_expf((uv - in.umax) * in.inv_tau));
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
  // Σ_{v≠m} exp(z − z_max): the other maxima contribute exactly 1 each (loss_expf(0) = 1).
  DFLASH_HD double s_excl() const { return s_lt + double(ties - 1); }
  // max_{v≠m} z
  DFLASH_HD float second(float zmax) const { return ties > 1 ? zmax : second_lt; }
};

// ---- pass 3 (CAP only) ----
// True when lse_{v≠m} needs its own pass around the second maximum (the CPU's rule, kExclShortcutGap).
DFLASH_HD inline bool needs_excl_pass(const RowMax& mx, const RowSums& s, int y) {
  if (s.argmax == y) return false;
  const double se = s.s_excl();
  return !(double(mx.z) - double(s.second(mx.z)) <= kExclShortcutGap && se > 0);
}
// One element of Σ_{v≠m} exp(z_v − second).
DFLASH_HD inline double excl_term(int v, float zv, int argmax, float second) {
  return v == argmax ? 0.0 : double(loss_expf((zv - second) * 1.0f));
}

// ---- finish: one thread ----
// rows/values as the CPU's row_stats writes them (fields it leaves alone on a non-finite row are left alone).
// excl_sum: the pass-3 sum when needs_excl_pass, else unused.
DFLASH_HD inline void finish_row_stats(const RowMax& mx, const RowSums& sums, double excl_sum, float zy, int y,
                                       double tau, int top_k, bool has_u, VocabLossRow& s, VocabLossRowValues& out) {
  const float zmax = mx.z;
  if (!isfinite(double(zmax))) {
    out.finite = 0;
    return;
  }
  const int m = sums.argmax;
  const double s_excl = sums.s_excl();
  if (!isfinite(s_excl)) {
    out.finite = 0;
    return;
  }
  const double logsum = log1p(s_excl);
  s.z_max = double(zmax);
  s.z_logsum = logsum;
  s.argmax = m;
  out.topk = sums.above < top_k;
  out.correct = m == y;
  if (m == y) {
    out.ce = logsum;
    s.one_minus_py = s_excl / (1.0 + s_excl);
  } else {
    out.ce = (double(zmax) - double(zy)) + logsum;
    s.one_minus_py = 1.0 - exp(double(zy - zmax) - logsum);
  }
  s.cap_active = m != y;
  if (m != y) {
    const float second = sums.second(zmax);
    if (!needs_excl_pass(mx, sums, y)) {
      s.excl_max = double(zmax);
      s.excl_logsum = log(s_excl);
    } else {
      s.excl_max = double(second);
      s.excl_logsum = log(excl_sum);
    }
    out.cap = (s.z_max - s.excl_max) + (logsum - s.excl_logsum);
  }
  s.zt_logsum = tau == 1.0 ? logsum : log(sums.zt);
  if (has_u) {
    if (!isfinite(double(mx.u))) {
      out.finite = 0;
      return;
    }
    if (!isfinite(sums.su + sums.acc)) {
      out.finite = 0;
      return;
    }
    s.u_max = double(mx.u);
    s.ut_logsum = log(sums.su);
    out.kl = tau * sums.acc / sums.su - tau * tau * (s.ut_logsum - s.zt_logsum);
  }
}

// ---- gradient ----
// Everything grad_element needs, formed once per row from the forward statistics (the CPU's GradLoop fields),
// and the exact values at the label and the argmax, formed in double from the row's original logits.
struct GradRow {
  float a_p = 0, a_pt = 0, a_q = 0, a_cap = 0;
  float zmax = 0, logsum = 0, zt_logsum = 0, umax = 0, ut_logsum = 0, excl_max = 0, excl_logsum = 0, inv_tau = 1;
  bool kl = false, tau1 = true, cap = false, zero = false;
  int y = 0, m = 0;
  double at_y = 0, at_m = 0;
};

// c = grad_scale · w_r; z_y, z_m, u_y, u_m: the row's logits at the label and the argmax (u: 0 without KL).
DFLASH_HD inline GradRow grad_row_coeffs(const VocabLossRow& s, int y, float zy, float zm, float uy, float um,
                                         bool has_u, double c, const VocabLossCoeffs& k) {
  GradRow g;
  g.y = y;
  g.m = s.argmax;
  if (c == 0) {
    g.zero = true;
    return g;
  }
  g.kl = has_u && k.kl != 0;
  g.cap = s.cap_active && k.cap != 0;
  g.tau1 = k.tau == 1.0;
  const double tau = k.tau;
  g.zmax = float(s.z_max), g.umax = float(s.u_max), g.excl_max = float(s.excl_max);
  g.logsum = float(s.z_logsum), g.zt_logsum = float(s.zt_logsum), g.ut_logsum = float(s.ut_logsum);
  g.excl_logsum = float(s.excl_logsum);
  g.inv_tau = float(1.0 / tau);
  const double p_m = exp(-s.z_logsum);
  const bool kl = g.kl, cap = g.cap;
  const float zmax = g.zmax, umax = g.umax, excl_max = g.excl_max;
  auto kl_term = [&](float zv, float uv) {
    if (!kl) return 0.0;
    const double pt = exp(double(zv - zmax) / tau - s.zt_logsum);
    const double qt = exp(double(uv - umax) / tau - s.ut_logsum);
    return c * k.kl * tau * (pt - qt);
  };
  auto cap_other = [&](float zv) { return cap ? -c * k.cap * p_m * exp(double(zv - excl_max) - s.excl_logsum) : 0.0; };
  const int m = g.m;
  g.at_y = c * k.ce * (-s.one_minus_py) + kl_term(zy, uy) + (y != m ? cap_other(zy) : 0.0);
  g.at_m = m != y ? c * k.ce * p_m + kl_term(zm, um) + (cap ? c * k.cap * p_m : 0.0) : g.at_y;
  g.a_p = float(c * k.ce + (kl && g.tau1 ? c * k.kl * tau : 0.0));
  g.a_pt = float(kl && !g.tau1 ? c * k.kl * tau : 0.0);
  g.a_q = float(kl ? -c * k.kl * tau : 0.0);
  g.a_cap = float(cap ? -c * k.cap * p_m : 0.0);
  return g;
}

// c · ∂ℓ/∂z_v for v ∉ {y, m} (those two are overwritten with at_y / at_m afterwards); uv unused without KL.
DFLASH_HD inline float grad_element(const GradRow& g, float zv, float uv) {
  if (g.zero) return 0.0f;
  float d = g.a_p * loss_expf((zv - g.zmax) - g.logsum);
  if (g.kl) {
    if (g.tau1) {
      d += g.a_q * loss_expf((uv - g.umax) - g.ut_logsum);
    } else {
      d += g.a_pt * loss_expf((zv - g.zmax) * g.inv_tau - g.zt_logsum);
      d += g.a_q * loss_expf((uv - g.umax) * g.inv_tau - g.ut_logsum);
    }
  }
  if (g.cap) d += g.a_cap * loss_expf((zv - g.excl_max) - g.excl_logsum);
  return d;
}

}  // namespace dflash::kernels::cuda_math
