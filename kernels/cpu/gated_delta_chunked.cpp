#include "kernels/cpu/gated_delta_chunked.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "lib/core/error.h"

namespace dflash::cpu {

template <typename T>
void gated_delta_rule_chunked_ut(T* out, const T* q, const T* k, const T* v, const T* g, const T* beta, int S,
                                 int k_heads, int v_heads, int dk, int dv, int chunk, T* state) {
  DFLASH_CHECK(k_heads > 0 && v_heads % k_heads == 0 && chunk > 0 && dk > 0 && dv > 0,
               "gated_delta_rule_chunked_ut: {} value heads must be a multiple of {} key heads (chunk {}, dk {}, dv {})",
               v_heads, k_heads, chunk, dk, dv);
  const int r = v_heads / k_heads;
  const size_t C = size_t(chunk);
#pragma omp parallel for schedule(dynamic)
  for (int h = 0; h < v_heads; ++h) {
    const int kh = h / r;
    std::vector<T> M(size_t(dk) * dv, T(0));  // [dk, dv] the state
    if (state) std::copy_n(state + size_t(h) * dk * dv, M.size(), M.data());
    std::vector<T> gam(C), bet(C);
    std::vector<T> Tm(C * C);                         // [n, n] L, then T = (I + L)⁻¹ (lower, unit diagonal)
    std::vector<T> W(C * dk), U(C * dv);              // [n, dk], [n, dv]; U becomes V'
    const auto kr = [&](int t) { return k + (size_t(t) * k_heads + kh) * dk; };
    const auto qr = [&](int t) { return q + (size_t(t) * k_heads + kh) * dk; };
    for (int c0 = 0; c0 < S; c0 += chunk) {
      const int n = std::min(chunk, S - c0);
      T acc = 0;
      for (int i = 0; i < n; ++i) {
        acc += g[size_t(c0 + i) * v_heads + h];
        gam[size_t(i)] = acc;
        bet[size_t(i)] = beta[size_t(c0 + i) * v_heads + h];
      }
      // L_ij = β_i e^{γ_i−γ_j} (k_i·k_j), j < i
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < i; ++j) {
          T dot = 0;
          for (int d = 0; d < dk; ++d) dot += kr(c0 + i)[d] * kr(c0 + j)[d];
          Tm[size_t(i) * C + j] = bet[size_t(i)] * std::exp(gam[size_t(i)] - gam[size_t(j)]) * dot;
        }
      // T = (I + L)⁻¹ row by row: T_ij = δ_ij − Σ_{j≤m<i} L_im T_mj; row i's L is read before it is overwritten
      std::vector<T> row(C);
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < i; ++j) {
          T s = 0;
          for (int m = j; m < i; ++m) s += Tm[size_t(i) * C + m] * (m == j ? T(1) : Tm[size_t(m) * C + j]);
          row[size_t(j)] = -s;
        }
        for (int j = 0; j < i; ++j) Tm[size_t(i) * C + j] = row[size_t(j)];
        Tm[size_t(i) * C + i] = T(1);
      }
      // W = T diag(β e^γ) K, U = T diag(β) V
      for (int i = 0; i < n; ++i) {
        T* wi = &W[size_t(i) * dk];
        T* ui = &U[size_t(i) * dv];
        std::fill_n(wi, dk, T(0));
        std::fill_n(ui, dv, T(0));
        for (int j = 0; j <= i; ++j) {
          const T t = Tm[size_t(i) * C + j];
          const T bw = t * bet[size_t(j)] * std::exp(gam[size_t(j)]), bu = t * bet[size_t(j)];
          const T* kj = kr(c0 + j);
          const T* vj = v + (size_t(c0 + j) * v_heads + h) * dv;
          for (int d = 0; d < dk; ++d) wi[d] += bw * kj[d];
          for (int d = 0; d < dv; ++d) ui[d] += bu * vj[d];
        }
      }
      // V' = U − W S₀
      for (int i = 0; i < n; ++i)
        for (int d = 0; d < dv; ++d) {
          T s = 0;
          for (int e = 0; e < dk; ++e) s += W[size_t(i) * dk + e] * M[size_t(e) * dv + d];
          U[size_t(i) * dv + d] -= s;
        }
      // O = e^γ Q S₀ + (Q Kᵀ ⊙ D ⊙ causal) V'
      for (int i = 0; i < n; ++i) {
        T* oi = out + (size_t(c0 + i) * v_heads + h) * dv;
        const T* qi = qr(c0 + i);
        const T ei = std::exp(gam[size_t(i)]);
        for (int d = 0; d < dv; ++d) {
          T s = 0;
          for (int e = 0; e < dk; ++e) s += qi[e] * M[size_t(e) * dv + d];
          oi[d] = ei * s;
        }
        for (int j = 0; j <= i; ++j) {
          T dot = 0;
          for (int e = 0; e < dk; ++e) dot += qi[e] * kr(c0 + j)[e];
          const T a = dot * std::exp(gam[size_t(i)] - gam[size_t(j)]);
          for (int d = 0; d < dv; ++d) oi[d] += a * U[size_t(j) * dv + d];
        }
      }
      // S ← e^{γ_last} S₀ + (diag(e^{γ_last−γ}) K)ᵀ V'
      const T last = gam[size_t(n - 1)], el = std::exp(last);
      for (auto& m : M) m *= el;
      for (int j = 0; j < n; ++j) {
        const T f = std::exp(last - gam[size_t(j)]);
        const T* kj = kr(c0 + j);
        for (int e = 0; e < dk; ++e) {
          const T ke = f * kj[e];
          for (int d = 0; d < dv; ++d) M[size_t(e) * dv + d] += ke * U[size_t(j) * dv + d];
        }
      }
    }
    if (state) std::copy_n(M.data(), M.size(), state + size_t(h) * dk * dv);
  }
}

#define DFLASH_INSTANTIATE(T)                                                                                      \
  template void gated_delta_rule_chunked_ut<T>(T*, const T*, const T*, const T*, const T*, const T*, int, int, int, \
                                               int, int, int, T*);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(double)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::cpu
