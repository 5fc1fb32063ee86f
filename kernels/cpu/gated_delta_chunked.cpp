#include "kernels/cpu/gated_delta_chunked.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/bf16.h"
#include "lib/core/error.h"

namespace dflash::cpu {

namespace {

constexpr int kRun = 32;    // positions a scan run (a warp)
constexpr int kBlock = 16;  // rows of T's blocks (an mma tile)

}  // namespace

template <typename T>
void chunk_decay_scan(T* gam, const T* g, int n, int chunk) {
  std::vector<T> prev(static_cast<size_t>(chunk));
  for (int i = 0; i < chunk; ++i) gam[i] = i < n ? g[i] : T(0);
  for (int off = 1; off < kRun; off *= 2) {
    std::copy_n(gam, chunk, prev.data());
    for (int i = 0; i < chunk; ++i)
      if (i % kRun >= off) gam[i] = prev[size_t(i)] + prev[size_t(i - off)];
  }
  for (int i = kRun; i < chunk; ++i) gam[i] += gam[i / kRun * kRun - 1];  // the run before, already finished
}

template <typename T>
void gated_delta_rule_chunked_ut(T* out, const T* q, const T* k, const T* v, const T* g, const T* beta, int S,
                                 int k_heads, int v_heads, int dk, int dv, int chunk, T* state, bool kernel_roundings,
                                 ChunkedTrace<T>* trace) {
  DFLASH_CHECK(k_heads > 0 && v_heads % k_heads == 0 && chunk > 0 && dk > 0 && dv > 0,
               "gated_delta_rule_chunked_ut: {} value heads must be a multiple of {} key heads (chunk {}, dk {}, dv {})",
               v_heads, k_heads, chunk, dk, dv);
  const int r = v_heads / k_heads;
  const size_t C = size_t(chunk), chunks = S > 0 ? (size_t(S) + C - 1) / C : 0, P = chunks * C;
  if (trace) {
    trace->gamma.assign(size_t(v_heads) * P, T(0));
    trace->w.assign(size_t(v_heads) * P * dk, T(0));
    trace->states.assign(size_t(v_heads) * chunks * dk * dv, T(0));
  }
  // the kernel's rounding to bf16 (round to nearest even, through float), or nothing
  const auto rd = [kernel_roundings](T x) { return kernel_roundings ? T(float(kernels::bf16(float(x)))) : x; };
#pragma omp parallel for schedule(dynamic)
  for (int h = 0; h < v_heads; ++h) {
    const int kh = h / r;
    std::vector<T> M(size_t(dk) * dv, T(0));  // [dk, dv] the state, unrounded
    if (state) std::copy_n(state + size_t(h) * dk * dv, M.size(), M.data());
    std::vector<T> gin(C), gam(C), bet(C);
    std::vector<T> A(C * C), Tm(C * C), Y(size_t(kBlock) * kBlock);  // [n, n] A, T = (I + A)⁻¹; a block product
    std::vector<T> X(C * dk), Vb(C * dv);                              // β e^γ K, β V
    std::vector<T> W(C * dk), U(C * dv), Sb(size_t(dk) * dv);          // W, U then V'; S₀ as the operand
    std::vector<T> Vs(C * dv);                                         // e^{γlast−γ} V'
    const auto kr = [&](int t) { return k + (size_t(t) * k_heads + kh) * dk; };
    const auto qr = [&](int t) { return q + (size_t(t) * k_heads + kh) * dk; };
    for (size_t c = 0; c < chunks; ++c) {
      const int c0 = int(c * C), n = std::min(chunk, S - c0);
      // ---- (1) per chunk: γ, A, T, W, U ----
      for (int i = 0; i < n; ++i) {
        gin[size_t(i)] = g[size_t(c0 + i) * v_heads + h];
        bet[size_t(i)] = beta[size_t(c0 + i) * v_heads + h];
      }
      chunk_decay_scan(gam.data(), gin.data(), n, chunk);
      // A_ij = β_i e^{γ_i−γ_j} (k_i·k_j), j < i
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < i; ++j) {
          T dot = 0;
          for (int d = 0; d < dk; ++d) dot += kr(c0 + i)[d] * kr(c0 + j)[d];
          A[size_t(i) * C + j] = bet[size_t(i)] * std::exp(gam[size_t(i)] - gam[size_t(j)]) * dot;
        }
      // T's diagonal blocks by forward substitution, column by column (the kernel's lane j)
      const int nb = (n + kBlock - 1) / kBlock;
      const auto end = [&](int b) { return std::min(n, (b + 1) * kBlock); };
      for (int b = 0; b < nb; ++b)
        for (int j = b * kBlock; j < end(b); ++j) {
          for (int i = b * kBlock; i < end(b); ++i) Tm[size_t(i) * C + j] = i == j ? T(1) : T(0);
          for (int i = j + 1; i < end(b); ++i) {
            T s = A[size_t(i) * C + j];
            for (int m = j + 1; m < i; ++m) s += A[size_t(i) * C + m] * Tm[size_t(m) * C + j];
            Tm[size_t(i) * C + j] = -s;
          }
        }
      // the blocks below the diagonal, by distance: T_ij = −T_ii Σ_{j≤m<i} A_im T_mj (blocks)
      for (int d = 1; d < nb; ++d)
        for (int bi = d; bi < nb; ++bi) {
          const int bj = bi - d;
          const int i0 = bi * kBlock, j0 = bj * kBlock, ni = end(bi) - i0, nj = end(bj) - j0;
          for (int i = 0; i < ni; ++i)
            for (int j = 0; j < nj; ++j) {
              T s = 0;
              for (int m = j0; m < i0; ++m) s += A[size_t(i0 + i) * C + m] * Tm[size_t(m) * C + j0 + j];
              Y[size_t(i) * kBlock + j] = s;
            }
          for (int i = 0; i < ni; ++i)
            for (int j = 0; j < nj; ++j) {
              T s = 0;
              for (int m = 0; m <= i; ++m) s += Tm[size_t(i0 + i) * C + i0 + m] * Y[size_t(m) * kBlock + j];
              Tm[size_t(i0 + i) * C + j0 + j] = -s;
            }
        }
      // W = T (β e^γ K), U = T (β V), each operand rounded as the kernel's
      for (int j = 0; j < n; ++j) {
        const T bw = bet[size_t(j)] * std::exp(gam[size_t(j)]), bu = bet[size_t(j)];
        const T* vj = v + (size_t(c0 + j) * v_heads + h) * dv;
        for (int d = 0; d < dk; ++d) X[size_t(j) * dk + d] = rd(bw * kr(c0 + j)[d]);
        for (int d = 0; d < dv; ++d) Vb[size_t(j) * dv + d] = rd(bu * vj[d]);
      }
      for (int i = 0; i < n; ++i) {
        for (int d = 0; d < dk; ++d) {
          T s = 0;
          for (int j = 0; j <= i; ++j) s += rd(Tm[size_t(i) * C + j]) * X[size_t(j) * dk + d];
          W[size_t(i) * dk + d] = rd(s);
        }
        for (int d = 0; d < dv; ++d) {
          T s = 0;
          for (int j = 0; j <= i; ++j) s += rd(Tm[size_t(i) * C + j]) * Vb[size_t(j) * dv + d];
          U[size_t(i) * dv + d] = rd(s);
        }
      }
      if (trace) {
        T* tg = &trace->gamma[size_t(h) * P + c * C];
        std::copy_n(gam.data(), C, tg);
        std::copy_n(W.data(), size_t(n) * dk, &trace->w[(size_t(h) * P + c * C) * dk]);
      }
      // ---- (2) the state: V' = U − W S₀, S ← e^{γlast} S₀ + Kᵀ (e^{γlast−γ} V') ----
      for (size_t e = 0; e < Sb.size(); ++e) Sb[e] = rd(M[e]);
      if (trace) std::copy_n(Sb.data(), Sb.size(), &trace->states[(size_t(h) * chunks + c) * dk * dv]);
      const T last = gam[size_t(n - 1)];
      for (int i = 0; i < n; ++i) {
        const T f = std::exp(last - gam[size_t(i)]);
        for (int d = 0; d < dv; ++d) {
          T s = 0;
          for (int e = 0; e < dk; ++e) s += W[size_t(i) * dk + e] * Sb[size_t(e) * dv + d];
          const T vp = U[size_t(i) * dv + d] - s;
          U[size_t(i) * dv + d] = rd(vp);  // V', as the output pass reads it
          Vs[size_t(i) * dv + d] = rd(f * vp);
        }
      }
      const T el = std::exp(last);
      for (auto& m : M) m *= el;
      for (int j = 0; j < n; ++j) {
        const T* kj = kr(c0 + j);
        for (int e = 0; e < dk; ++e)
          for (int d = 0; d < dv; ++d) M[size_t(e) * dv + d] += kj[e] * Vs[size_t(j) * dv + d];
      }
      // ---- (3) the outputs: O = e^γ (Q S₀) + (Q Kᵀ ⊙ D ⊙ causal) V' ----
      for (int i = 0; i < n; ++i) {
        T* oi = out + (size_t(c0 + i) * v_heads + h) * dv;
        const T* qi = qr(c0 + i);
        const T ei = std::exp(gam[size_t(i)]);
        for (int d = 0; d < dv; ++d) {
          T s = 0;
          for (int e = 0; e < dk; ++e) s += qi[e] * Sb[size_t(e) * dv + d];
          oi[d] = s * ei;
        }
        for (int j = 0; j <= i; ++j) {
          T dot = 0;
          for (int e = 0; e < dk; ++e) dot += qi[e] * kr(c0 + j)[e];
          const T p = rd(std::exp(gam[size_t(i)] - gam[size_t(j)]) * dot);
          for (int d = 0; d < dv; ++d) oi[d] += p * U[size_t(j) * dv + d];
        }
        for (int d = 0; d < dv; ++d) oi[d] = rd(oi[d]);
      }
    }
    if (state) std::copy_n(M.data(), M.size(), state + size_t(h) * dk * dv);
  }
}

#define DFLASH_INSTANTIATE(T)                                                                                     \
  template void gated_delta_rule_chunked_ut<T>(T*, const T*, const T*, const T*, const T*, const T*, int, int, int, \
                                               int, int, int, T*, bool, ChunkedTrace<T>*);                        \
  template void chunk_decay_scan<T>(T*, const T*, int, int);
DFLASH_INSTANTIATE(float)
DFLASH_INSTANTIATE(double)
#undef DFLASH_INSTANTIATE

}  // namespace dflash::cpu
