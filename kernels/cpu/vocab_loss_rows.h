#pragma once
// One row of the vocab loss on the CPU, on logits already in memory: softmax statistics + CE/KL/CAP/TV/LK/NLA + metrics
// (row_stats), and d(logits) (row_grad). The CPU is one "thread" of the CUDA block: it walks the whole row through
// the same accumulate / finish functions (kernels/math/loss_rows.h, the only copy of the formulas), so the CPU and
// CUDA row passes differ only in the order of their double sums. Exponentials run in T (float on the fp32 path);
// every sum over the vocabulary accumulates in double.
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/math/loss_rows.h"
#include "kernels/vocab_loss_rows.h"

namespace dflash::cpu {

using kernels::VocabLossCoeffs;
using kernels::VocabLossRow;
using kernels::VocabLossRowValues;

// z [V] drafter logits, u [V] target logits or null; y the label; k: τ and which terms need the overlap pass.
// Writes the row's statistics (=) and values (=).
template <typename T>
void row_stats(const T* z, const T* u, int V, int y, const VocabLossCoeffs& k, int top_k, VocabLossRow& s,
               VocabLossRowValues& out) {
  namespace km = kernels::math;
  const double tau = k.tau;
  km::RowMax<T> mx;
  if (u) {
    for (int v = 0; v < V; ++v) mx.add(z[v], u[v]);
  } else {
    for (int v = 0; v < V; ++v) mx.add(z[v], -std::numeric_limits<T>::infinity());
  }
  const km::RowPass2In<T> in = km::pass2_in(mx, z[y], y, tau, u != nullptr);
  km::RowSums<T> sums;
  double excl = 0;
  if (std::isfinite(double(mx.z))) {
    if (u) {
      for (int v = 0; v < V; ++v) sums.add(in, v, z[v], u[v]);
    } else {
      for (int v = 0; v < V; ++v) sums.add(in, v, z[v], T(0));
    }
    if (km::needs_excl_pass(mx, sums, y)) {
      const T second = sums.second(mx.z);
      for (int v = 0; v < V; ++v) excl += km::excl_term(v, z[v], sums.argmax, second);
    }
  }
  const bool overlap = u && km::uses_overlap(k);
  km::RowOverlap ov;
  if (overlap && std::isfinite(double(mx.z))) {
    const km::OverlapIn<T> in4 = km::overlap_in(mx, sums);
    for (int v = 0; v < V; ++v) ov.add(in4, z[v], u[v]);
  }
  km::finish_row_stats(mx, sums, excl, z[y], y, tau, top_k, u != nullptr, s, out);
  if (overlap && out.finite) km::finish_overlap(ov, k, s, out);
}

// z [V]: in = the row's logits, out (=) c · ∂ℓ/∂z with c = grad_scale · w; u [V] target logits (null without KL).
// The element loop is instantiated once per combination of terms so that each vectorises.
template <typename T>
void row_grad(T* z, const T* u, int V, int y, const VocabLossRow& s, double c, const VocabLossCoeffs& k) {
  namespace km = kernels::math;
  const int m = s.argmax;
  const km::GradRow<T> g = km::grad_row_coeffs<T>(s, y, z[y], c == 0 ? T(0) : z[m], u ? u[y] : T(0),
                                                  u && c != 0 ? u[m] : T(0), u != nullptr, c, k);
  if (g.zero) {
    for (int v = 0; v < V; ++v) z[v] = T(0);
    return;
  }
  auto run = [&](auto kl, auto tau1, auto cap, auto tv) {
    constexpr bool KL = decltype(kl)::value, TAU1 = decltype(tau1)::value, CAP = decltype(cap)::value,
                   TV = decltype(tv)::value;
    if constexpr (KL) {
#pragma omp simd
      for (int v = 0; v < V; ++v) z[v] = km::grad_term<KL, TAU1, CAP, TV>(g, z[v], u[v]);
    } else {
#pragma omp simd
      for (int v = 0; v < V; ++v) z[v] = km::grad_term<KL, TAU1, CAP, TV>(g, z[v], T(0));
    }
  };
  using yes = std::true_type;
  using no = std::false_type;
  if (g.tv)  // TV implies u and τ = 1 (its q shares the KL path's exponential)
    g.cap ? run(yes{}, yes{}, yes{}, yes{}) : run(yes{}, yes{}, no{}, yes{});
  else if (!g.kl)
    g.cap ? run(no{}, no{}, yes{}, no{}) : run(no{}, no{}, no{}, no{});
  else if (g.tau1)
    g.cap ? run(yes{}, yes{}, yes{}, no{}) : run(yes{}, yes{}, no{}, no{});
  else
    g.cap ? run(yes{}, no{}, yes{}, no{}) : run(yes{}, no{}, no{}, no{});
  z[y] = T(g.at_y);
  z[m] = T(g.at_m);
}

}  // namespace dflash::cpu
