#include "kernels/cpu/gated_deltanet.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/math/gates.h"
#include "lib/core/error.h"

namespace dflash::cpu {

// The element formulas are kernels/math/gates.h (shared with the CUDA kernels).
namespace km = kernels::math;

template <typename T>
void causal_conv1d_silu_forward(T* y, const T* x, const T* w, int S, int C, int K) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < S; ++t) {
    for (int c = 0; c < C; ++c) {
      T acc = 0;
      for (int j = 0; j < K; ++j) {
        const int src = t - (K - 1) + j;
        if (src >= 0) acc = km::conv_tap(acc, w[size_t(c) * K + j], x[size_t(src) * C + c]);
      }
      y[size_t(t) * C + c] = km::silu(acc);
    }
  }
}

template <typename T>
void l2norm_forward(T* x, int rows, int dim, T eps, T scale) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    T* row = x + size_t(r) * dim;
    T ss = 0;
    for (int i = 0; i < dim; ++i) ss += row[i] * row[i];
    const T f = km::l2norm_factor(ss, eps, scale);
    for (int i = 0; i < dim; ++i) row[i] *= f;
  }
}

template <typename T>
void deltanet_gates_forward(T* g, T* beta, const T* a, const T* b, const T* a_log, const T* dt_bias, int rows,
                            int heads) {
  for (int t = 0; t < rows; ++t)
    for (int j = 0; j < heads; ++j) {
      const size_t i = size_t(t) * heads + j;
      beta[i] = km::deltanet_beta(b[i]);
      g[i] = km::deltanet_g(a[i], dt_bias[j], a_log[j]);
    }
}

template <typename T>
void gated_rmsnorm_forward(T* y, const T* x, const T* z, const T* w, int rows, int dim, T eps) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const T* xr = x + size_t(r) * dim;
    const T* zr = z + size_t(r) * dim;
    T* yr = y + size_t(r) * dim;
    T ss = 0;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const T rstd = km::rmsnorm_rstd(ss, dim, eps);
    for (int i = 0; i < dim; ++i) yr[i] = km::gated_rmsnorm_y(xr[i], rstd, w[i], zr[i]);
  }
}

template <typename T>
void gated_delta_rule_forward(T* out, const T* q, const T* k, const T* v, const T* g, const T* beta, int S,
                              int k_heads, int v_heads, int dk, int dv, int chunk, T* state) {
  DFLASH_CHECK(k_heads > 0 && v_heads % k_heads == 0 && chunk > 0,
               "gated_delta_rule: {} value heads must be a multiple of {} key heads (chunk {})", v_heads, k_heads,
               chunk);
  const int r = v_heads / k_heads;
#pragma omp parallel for schedule(dynamic)
  for (int h = 0; h < v_heads; ++h) {
    const int kh = h / r;
    std::vector<T> M(size_t(dk) * dv, T(0));  // [dk, dv]
    if (state) std::copy_n(state + size_t(h) * dk * dv, M.size(), M.data());
    std::vector<T> Kc(size_t(chunk) * dk), Qc(size_t(chunk) * dk);  // [n, dk] this chunk's keys / queries
    std::vector<T> U(size_t(chunk) * dv);                           // [n, dv] right-hand side, then the deltas u
    std::vector<T> O(size_t(chunk) * dv);                           // [n, dv] M₀ᵀ q, then the outputs
    std::vector<T> KK(size_t(chunk) * chunk), QK(size_t(chunk) * chunk);  // [n, n] k_i·k_j, q_i·k_j
    std::vector<T> gam(static_cast<size_t>(chunk)), bet(static_cast<size_t>(chunk));
    for (int c0 = 0; c0 < S; c0 += chunk) {
      const int n = std::min(chunk, S - c0);
      T acc = 0;
      for (int i = 0; i < n; ++i) {
        const size_t t = size_t(c0 + i);
        acc += g[t * v_heads + h];
        gam[size_t(i)] = acc;
        bet[size_t(i)] = beta[t * v_heads + h];
        std::copy_n(k + (t * k_heads + kh) * dk, dk, &Kc[size_t(i) * dk]);
        std::copy_n(q + (t * k_heads + kh) * dk, dk, &Qc[size_t(i) * dk]);
      }
      // U = K M₀ (the old state's prediction for each key), then rhs_i = β_i (v_i − e^{γ_i} (K M₀)_i)
      gemm<T>(false, false, n, dv, dk, T(1), Kc.data(), dk, M.data(), dv, T(0), U.data(), dv);
      for (int i = 0; i < n; ++i) {
        const T e = std::exp(gam[size_t(i)]), b = bet[size_t(i)];
        const T* vi = v + (size_t(c0 + i) * v_heads + h) * dv;
        T* ui = &U[size_t(i) * dv];
        for (int d = 0; d < dv; ++d) ui[d] = b * (vi[d] - e * ui[d]);
      }
      gemm<T>(false, true, n, n, dk, T(1), Kc.data(), dk, Kc.data(), dk, T(0), KK.data(), n);
      // forward substitution: u_i = rhs_i − Σ_{j<i} β_i e^{γ_i−γ_j} (k_i·k_j) u_j
      for (int i = 1; i < n; ++i) {
        T* ui = &U[size_t(i) * dv];
        for (int j = 0; j < i; ++j) {
          const T a = bet[size_t(i)] * std::exp(gam[size_t(i)] - gam[size_t(j)]) * KK[size_t(i) * n + j];
          const T* uj = &U[size_t(j) * dv];
          for (int d = 0; d < dv; ++d) ui[d] -= a * uj[d];
        }
      }
      // o_i = e^{γ_i} (Q M₀)_i + Σ_{j≤i} e^{γ_i−γ_j} (q_i·k_j) u_j
      gemm<T>(false, false, n, dv, dk, T(1), Qc.data(), dk, M.data(), dv, T(0), O.data(), dv);
      gemm<T>(false, true, n, n, dk, T(1), Qc.data(), dk, Kc.data(), dk, T(0), QK.data(), n);
      for (int i = 0; i < n; ++i) {
        T* oi = &O[size_t(i) * dv];
        const T e = std::exp(gam[size_t(i)]);
        for (int d = 0; d < dv; ++d) oi[d] *= e;
        for (int j = 0; j <= i; ++j) {
          const T a = std::exp(gam[size_t(i)] - gam[size_t(j)]) * QK[size_t(i) * n + j];
          const T* uj = &U[size_t(j) * dv];
          for (int d = 0; d < dv; ++d) oi[d] += a * uj[d];
        }
        std::copy_n(oi, dv, out + (size_t(c0 + i) * v_heads + h) * dv);
      }
      // M ← e^{γ_last} M₀ + Σ_j (e^{γ_last−γ_j} k_j) u_jᵀ; Kc is rescaled in place (no longer needed as is)
      const T last = gam[size_t(n - 1)];
      for (int j = 0; j < n; ++j) {
        const T e = std::exp(last - gam[size_t(j)]);
        for (int d = 0; d < dk; ++d) Kc[size_t(j) * dk + d] *= e;
      }
      gemm<T>(true, false, dk, dv, n, T(1), Kc.data(), dk, U.data(), dv, std::exp(last), M.data(), dv);
    }
    if (state) std::copy_n(M.data(), M.size(), state + size_t(h) * dk * dv);
  }
}

template <typename T>
void gated_delta_rule_reference(T* out, const T* q, const T* k, const T* v, const T* g, const T* beta, int S,
                                int k_heads, int v_heads, int dk, int dv, T* state) {
  const int r = v_heads / k_heads;
  for (int h = 0; h < v_heads; ++h) {
    const int kh = h / r;
    std::vector<T> M(size_t(dk) * dv, T(0));
    if (state) std::copy_n(state + size_t(h) * dk * dv, M.size(), M.data());
    std::vector<T> u(static_cast<size_t>(dv));
    for (int t = 0; t < S; ++t) {
      const T* qt = q + (size_t(t) * k_heads + kh) * dk;
      const T* kt = k + (size_t(t) * k_heads + kh) * dk;
      const T* vt = v + (size_t(t) * v_heads + h) * dv;
      const T decay = std::exp(g[size_t(t) * v_heads + h]), b = beta[size_t(t) * v_heads + h];
      for (auto& m : M) m *= decay;
      for (int d = 0; d < dv; ++d) {
        T pred = 0;
        for (int i = 0; i < dk; ++i) pred += M[size_t(i) * dv + d] * kt[i];
        u[size_t(d)] = b * (vt[d] - pred);
      }
      for (int i = 0; i < dk; ++i)
        for (int d = 0; d < dv; ++d) M[size_t(i) * dv + d] += kt[i] * u[size_t(d)];
      T* ot = out + (size_t(t) * v_heads + h) * dv;
      for (int d = 0; d < dv; ++d) {
        T o = 0;
        for (int i = 0; i < dk; ++i) o += M[size_t(i) * dv + d] * qt[i];
        ot[d] = o;
      }
    }
    if (state) std::copy_n(M.data(), M.size(), state + size_t(h) * dk * dv);
  }
}

#define DFLASH_INSTANTIATE(T)                                                                                     \
  template void causal_conv1d_silu_forward<T>(T*, const T*, const T*, int, int, int);                           \
  template void l2norm_forward<T>(T*, int, int, T, T);                                                          \
  template void gated_rmsnorm_forward<T>(T*, const T*, const T*, const T*, int, int, T);                        \
  template void deltanet_gates_forward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);             \
  template void gated_delta_rule_forward<T>(T*, const T*, const T*, const T*, const T*, const T*, int, int, int, \
                                            int, int, int, T*);                                                 \
  template void gated_delta_rule_reference<T>(T*, const T*, const T*, const T*, const T*, const T*, int, int,    \
                                              int, int, int, T*);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(double)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::cpu
