// The gated delta rule chunk-parallel on tensor cores (bf16 operands, fp32 accumulation, fp32 carried state), in
// the formulation of flash-linear-attention's chunk_gated_delta_rule (chunk_fwd.py's fused A + solve_tril,
// wy_fast.py's W and U, chunk_delta_h.py's state pass, chunk_o.py's outputs). CPU twin, line by line in float or
// double: kernels/cpu/gated_delta_chunked.h. Chunks of 64 tokens; three launches on the caller's stream:
//   1. prepare   grid (chunk, value head): γ by a warp scan; A = β_i e^{γi−γj} K Kᵀ (strictly lower, mma);
//                T = (I + A)⁻¹: the four 16×16 diagonal blocks by forward substitution (a lane per column), the
//                six blocks below them merged on the tensor cores in bf16x3 (hi + lo halves, ~2⁻¹⁶ of |x||y|;
//                fla merges in tf32); W = T (β e^γ K) → scratch, U = T (β V) → out, γ → scratch.
//   2. state     grid (value head, 32 state columns), 8 warps: the only serial pass. Per chunk: V' = U − W S₀
//                (mma) → out (U's place), S ← e^{γlast} S₀ + Kᵀ (e^{γlast−γ} V') (mma into the fp32 registers); S₀
//                in bf16 → scratch (the output pass's operand). The next chunks' W, K, U, γ arrive by cp.async meanwhile
//                (3 stages where the device's shared memory allows, else 2).
//   3. output    grid (chunk, value head, 64 value columns): O = e^γ (Q S₀) + (Q Kᵀ ⊙ D ⊙ causal) V' → out.
// Where bf16 rounding happens (fla's places): β e^γ K, β V, T, W, U (phase 1); S₀ as the mma operand, V' as phase 3
// reads it, e^{γlast−γ} V' as the state update's operand (phase 2); the decayed scores Q Kᵀ ⊙ D and the output
// (phase 3). A, T's blocks, the state and every accumulator stay fp32. Unverified on GPU.
#include "kernels/cuda/deltanet_chunked.h"

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_limits.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/delta_rule_chunks.h"

namespace dflash::kernels::cuda {

namespace {

constexpr int kChunk = kDeltaChunk;  // tokens a chunk (64)
constexpr int kWarps = 4;            // warp w owns token rows [16w, 16w + 16) of every [64, ·] product
constexpr int kBlock = kWarps * kWarp;
constexpr int kPad = 8;         // bf16 row padding: rows stay 16-byte aligned and 8 ldmatrix rows hit distinct banks
constexpr int kOutCols = 64;    // value columns a prepare (U) and an output block computes
constexpr int kStateCols = 32;  // value columns a state block carries
constexpr int kF = kChunk + 1;  // row stride of the fp32 [64, 64] tiles

// ---- fragments ----

// The element (row, col) of accumulator register e of a lane in its 16×8 tile (mma.cuh: mma_c_coord).
__device__ __forceinline__ int c_row(int lane, int e) { return (lane >> 2) + (e >> 1) * 8; }
__device__ __forceinline__ int c_col(int lane, int e) { return (lane & 3) * 2 + (e & 1); }

__device__ __forceinline__ void zero(MmaFragC& c) { c.reg[0] = c.reg[1] = c.reg[2] = c.reg[3] = 0.f; }

// A (16×16) = tile[r0 .. r0+16, c0 .. c0+16) of a row-major bf16 tile with row stride ld.
__device__ __forceinline__ void load_a(MmaFragA& a, const bf16* tile, int ld, int r0, int c0, int lane) {
  ldmatrix_x4(a.reg, tile + size_t(r0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8);
}
// A (16×16) with A(m, k) = tile[k0 + k][m0 + m]: the transpose of a row-major tile.
__device__ __forceinline__ void load_a_trans(MmaFragA& a, const bf16* tile, int ld, int m0, int k0, int lane) {
  const int mi = lane >> 3, i = lane & 7;
  ldmatrix_x4_trans(a.reg, tile + size_t(k0 + i + (mi >> 1) * 8) * ld + m0 + (mi & 1) * 8);
}
// B of the n-tiles [n0, n0+8) and [n0+8, n0+16) over k [k0, k0+16) from a tile stored [k][n] (row-major K×N).
__device__ __forceinline__ void load_b_kn(MmaFragB& b0, MmaFragB& b1, const bf16* tile, int ld, int k0, int n0,
                                          int lane) {
  const int mi = lane >> 3, i = lane & 7;
  uint32_t r[4];
  ldmatrix_x4_trans(r, tile + size_t(k0 + i + (mi & 1) * 8) * ld + n0 + (mi >> 1) * 8);
  b0.reg[0] = r[0], b0.reg[1] = r[1], b1.reg[0] = r[2], b1.reg[1] = r[3];
}
// The same from a tile stored [n][k] (B = tileᵀ: K Kᵀ, Q Kᵀ).
__device__ __forceinline__ void load_b_nk(MmaFragB& b0, MmaFragB& b1, const bf16* tile, int ld, int k0, int n0,
                                          int lane) {
  const int mi = lane >> 3, i = lane & 7;
  uint32_t r[4];
  ldmatrix_x4(r, tile + size_t(n0 + i + (mi >> 1) * 8) * ld + k0 + (mi & 1) * 8);
  b0.reg[0] = r[0], b0.reg[1] = r[1], b1.reg[0] = r[2], b1.reg[1] = r[3];
}

// bf16x3: x = hi + lo with hi = bf16(x), lo = bf16(x − hi); a product as hi·hi + hi·lo + lo·hi on the tensor cores
// keeps ~16 bits of each operand (the dropped lo·lo is 2⁻¹⁶ of |x||y|). A from a row-major fp32 tile.
__device__ __forceinline__ void split_a(MmaFragA& hi, MmaFragA& lo, const float* tile, int ld, int r0, int c0,
                                        int lane) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const FragCoord p0 = mma_a_coord(lane, 2 * j), p1 = mma_a_coord(lane, 2 * j + 1);
    const float x0 = tile[(r0 + p0.row) * ld + c0 + p0.col], x1 = tile[(r0 + p1.row) * ld + c0 + p1.col];
    hi.reg[j] = pack_bf16x2_rn(x0, x1);
    lo.reg[j] = pack_bf16x2_rn(x0 - __bfloat162float(bf16x2_lo(hi.reg[j])), x1 - __bfloat162float(bf16x2_hi(hi.reg[j])));
  }
}
// B (16×8, k × n) = tile[k0 + k][n0 + n] of a row-major fp32 tile, split likewise.
__device__ __forceinline__ void split_b(MmaFragB& hi, MmaFragB& lo, const float* tile, int ld, int k0, int n0,
                                        int lane) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const FragCoord p0 = mma_b_coord(lane, 2 * j), p1 = mma_b_coord(lane, 2 * j + 1);
    const float x0 = tile[(k0 + p0.row) * ld + n0 + p0.col], x1 = tile[(k0 + p1.row) * ld + n0 + p1.col];
    hi.reg[j] = pack_bf16x2_rn(x0, x1);
    lo.reg[j] = pack_bf16x2_rn(x0 - __bfloat162float(bf16x2_lo(hi.reg[j])), x1 - __bfloat162float(bf16x2_hi(hi.reg[j])));
  }
}
// acc += a b in bf16x3 (the small terms first)
__device__ __forceinline__ void mma_x3(MmaFragC& acc, const MmaFragA& ah, const MmaFragA& al, const MmaFragB& bh,
                                       const MmaFragB& bl) {
  mma_m16n8k16_bf16(acc, al, bh, acc);
  mma_m16n8k16_bf16(acc, ah, bl, acc);
  mma_m16n8k16_bf16(acc, ah, bh, acc);
}

// ---- global → shared ----

// dst[ROWS, W] (row stride ld) = rows [0, n) of src (row stride src_ld elements), zeros after; W a multiple of 8.
// async: 16-byte cp.async (the caller commits and waits), else plain loads. Thread tid of THREADS handles the pieces
// idx = tid, tid + THREADS, … (own_pieces visits the same ones: a thread may touch what it loaded without a barrier).
template <int ROWS, int W, int THREADS = kBlock>
__device__ __forceinline__ void load_rows(bf16* dst, int ld, const bf16* src, size_t src_ld, int n, bool async,
                                          int tid) {
  constexpr int kPieces = W / 8;  // 16-byte pieces a row
  for (int idx = tid; idx < ROWS * kPieces; idx += THREADS) {
    const int r = idx / kPieces, p = idx % kPieces;
    bf16* d = dst + size_t(r) * ld + p * 8;
    if (r >= n) {
      for (int e = 0; e < 8; ++e) d[e] = __float2bfloat16_rn(0.f);
    } else if (async) {
      cp_async_cg(d, src + size_t(r) * src_ld + p * 8);
    } else {
      for (int e = 0; e < 8; ++e) d[e] = src[size_t(r) * src_ld + p * 8 + e];
    }
  }
}
template <int ROWS, int W, class F>
__device__ __forceinline__ void own_pieces(bf16* tile, int ld, int tid, F f) {
  constexpr int kPieces = W / 8;
  for (int idx = tid; idx < ROWS * kPieces; idx += kBlock) {
    const int r = idx / kPieces, p = idx % kPieces;
    f(r, tile + size_t(r) * ld + p * 8);
  }
}
// 64 floats (one chunk's γ of one head, contiguous in the scratch) by 16 threads.
__device__ __forceinline__ void load_gamma(float* dst, const float* src, int tid) {
  if (tid < kChunk / 4) cp_async_cg(dst + 4 * tid, src + 4 * tid);
}

// Two adjacent bf16 (one accumulator register pair) as one 4-byte store.
__device__ __forceinline__ void store_pair(bf16* dst, float x0, float x1) {
  *reinterpret_cast<uint32_t*>(dst) = pack_bf16x2_rn(x0, x1);
}

// ================================ 1. prepare: γ, A, T, W, U ================================

template <int DK>
struct PrepareSmem {
  static constexpr int kK = DK + kPad;         // row stride of the [64, DK] bf16 tile
  static constexpr int kV = kOutCols + kPad;   // row stride of the [64, 64] bf16 tiles
  static constexpr size_t ks = 0;                                  // K [64, DK], then X = β e^γ K
  static constexpr size_t vs = ks + size_t(kChunk) * kK * 2;       // a 64-column tile of V, then β V
  static constexpr size_t af = vs + size_t(kChunk) * kV * 2;       // fp32 A [64, 64] (the strictly lower blocks)
  static constexpr size_t tf = af + size_t(kChunk) * kF * 4;       // fp32 T [64, 64] (the lower blocks)
  static constexpr size_t tb = tf + size_t(kChunk) * kF * 4;       // T in bf16 [64, 64]
  static constexpr size_t yf = tb + size_t(kChunk) * kV * 2;       // fp32 [4 warps][16, 17]: a merge's product
  static constexpr size_t gm = yf + size_t(kWarps) * 16 * 17 * 4;  // γ [64]
  static constexpr size_t bt = gm + kChunk * 4;                    // β [64]
  static constexpr size_t eg = bt + kChunk * 4;                    // e^γ [64]
  static constexpr size_t bytes = eg + kChunk * 4;
  static_assert(vs % 16 == 0 && af % 16 == 0 && tb % 16 == 0, "tiles 16-byte aligned");
};

// u_out [S, VH, dv]: U of rows < n (the state pass turns it into V', the output pass into O); gamma_ws [VH, P] and
// w_ws [VH, P, DK] of every row of the chunk (P = 64 · chunks; the padding: the scan over g = 0, ≈ γ_{n−1}, and zero rows).
template <int DK>
__global__ void __launch_bounds__(kBlock, 1)
    delta_chunk_prepare_kernel(bf16* u_out, float* gamma_ws, bf16* w_ws, const bf16* k, const bf16* v, const float* g,
                               const float* beta, int S, int KH, int VH, int dv, int P, bool async) {
  using L = PrepareSmem<DK>;
  constexpr int kK = L::kK, kV = L::kV;
  DFLASH_DYNAMIC_SHARED(uint4, smem_raw);
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem_raw);
  bf16* Ks = reinterpret_cast<bf16*>(smem + L::ks);
  bf16* Vs = reinterpret_cast<bf16*>(smem + L::vs);
  float* Af = reinterpret_cast<float*>(smem + L::af);
  float* Tf = reinterpret_cast<float*>(smem + L::tf);
  bf16* Tb = reinterpret_cast<bf16*>(smem + L::tb);
  float* Yf = reinterpret_cast<float*>(smem + L::yf);
  float* gam = reinterpret_cast<float*>(smem + L::gm);
  float* bet = reinterpret_cast<float*>(smem + L::bt);
  float* eg = reinterpret_cast<float*>(smem + L::eg);

  const int c = blockIdx.x, h = blockIdx.y, kh = h / (VH / KH);
  const int c0 = c * kChunk, n = min(kChunk, S - c0);
  const int tid = threadIdx.x, lane = tid % kWarp, w = tid / kWarp;

  load_rows<kChunk, DK>(Ks, kK, k + (size_t(c0) * KH + kh) * DK, size_t(KH) * DK, n, async, tid);
  load_rows<kChunk, kOutCols>(Vs, kV, v + (size_t(c0) * VH + h) * dv, size_t(VH) * dv, n, async, tid);
  if (async) cp_async_commit_group();
  // γ: warps 0 and 1 scan 32 decays each (Hillis–Steele, the CPU twin's chunk_decay_scan); warp 1 adds warp 0's
  // last value after the barrier. Rows past n: g = 0, β = 0.
  float x = 0;
  if (w < 2) {
    x = tid < n ? g[size_t(c0 + tid) * VH + h] : 0.f;
#pragma unroll
    for (int off = 1; off < kWarp; off *= 2) {
      const float y = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x += y;
    }
    if (w == 0) gam[tid] = x;
    bet[tid] = tid < n ? beta[size_t(c0 + tid) * VH + h] : 0.f;
  }
  if (async) cp_async_wait_group<0>();
  __syncthreads();
  if (w == 1) gam[tid] = x + gam[kWarp - 1];

  // K Kᵀ of this warp's row block against key blocks p ≤ w (2 n-tiles each), in registers across the barrier
  MmaFragC kk[8];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) zero(kk[nt]);
  for (int k0 = 0; k0 < DK; k0 += 16) {
    MmaFragA a;
    load_a(a, Ks, kK, 16 * w, k0, lane);
#pragma unroll
    for (int p = 0; p < 4; ++p)
      if (p <= w) {
        MmaFragB b0, b1;
        load_b_nk(b0, b1, Ks, kK, k0, 16 * p, lane);
        mma_m16n8k16_bf16(kk[2 * p], a, b0, kk[2 * p]);
        mma_m16n8k16_bf16(kk[2 * p + 1], a, b1, kk[2 * p + 1]);
      }
  }
  __syncthreads();  // γ final; every read of K as K is done

  if (tid < kChunk) {
    eg[tid] = expf(gam[tid]);
    gamma_ws[size_t(h) * P + c0 + tid] = gam[tid];
  }
  // A's row block w: A_ij = β_i e^{γi−γj} k_i·k_j for j < i
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
    if (nt < 2 * (w + 1))
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 16 * w + c_row(lane, e), j = nt * 8 + c_col(lane, e);
        Af[i * kF + j] = j < i ? bet[i] * expf(gam[i] - gam[j]) * kk[nt].reg[e] : 0.f;
      }
  __syncwarp();
  // T's diagonal block w by forward substitution, lane j its column: T_ij = −(A_ij + Σ_{j<m<i} A_im T_mj)
  if (lane < 16) {
    const float* Ad = Af + (16 * w) * kF + 16 * w;
    float* Td = Tf + (16 * w) * kF + 16 * w;
    const int j = lane;
    for (int i = 0; i < 16; ++i) Td[i * kF + j] = i == j ? 1.f : 0.f;
    for (int i = j + 1; i < 16; ++i) {
      float s = Ad[i * kF + j];
      for (int m = j + 1; m < i; ++m) s += Ad[i * kF + m] * Td[m * kF + j];
      Td[i * kF + j] = -s;
    }
  }
  __syncthreads();  // A, T's diagonal blocks, e^γ

  // X = β e^γ K in place of K, β V in place of V (each thread the pieces it loaded)
  own_pieces<kChunk, DK>(Ks, kK, tid, [&](int r, bf16* e8) {
    const float f = bet[r] * eg[r];
    for (int e = 0; e < 8; ++e) e8[e] = __float2bfloat16_rn(f * __bfloat162float(e8[e]));
  });
  own_pieces<kChunk, kOutCols>(Vs, kV, tid, [&](int r, bf16* e8) {
    for (int e = 0; e < 8; ++e) e8[e] = __float2bfloat16_rn(bet[r] * __bfloat162float(e8[e]));
  });

  // T's blocks below the diagonal by distance d: warp i computes T_{i,i−d} = −T_ii Σ_{i−d≤m<i} A_im T_{m,i−d}
  float* Yw = Yf + w * 16 * 17;
  for (int d = 1; d < 4; ++d) {
    if (w >= d) {
      const int i = w, j = w - d;
      MmaFragC y[2];
      zero(y[0]), zero(y[1]);
      for (int m = j; m < i; ++m) {
        MmaFragA ah, al;
        split_a(ah, al, Af, kF, 16 * i, 16 * m, lane);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          MmaFragB bh, bl;
          split_b(bh, bl, Tf, kF, 16 * m, 16 * j + 8 * nt, lane);
          mma_x3(y[nt], ah, al, bh, bl);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) Yw[c_row(lane, e) * 17 + nt * 8 + c_col(lane, e)] = y[nt].reg[e];
      __syncwarp();
      MmaFragA th, tl;
      split_a(th, tl, Tf, kF, 16 * i, 16 * i, lane);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        MmaFragB bh, bl;
        split_b(bh, bl, Yw, 17, 0, 8 * nt, lane);
        MmaFragC z;
        zero(z);
        mma_x3(z, th, tl, bh, bl);
#pragma unroll
        for (int e = 0; e < 4; ++e) Tf[(16 * i + c_row(lane, e)) * kF + 16 * j + nt * 8 + c_col(lane, e)] = -z.reg[e];
      }
      __syncwarp();  // Yw is rewritten in the next round
    }
    if (d < 3) __syncthreads();  // the blocks of distance d, read by the next rounds (the last is read by its warp)
  }

  // T's row block w in bf16 (own rows: read back only by this warp, as the A operand)
  for (int idx = lane; idx < 16 * 16 * (w + 1); idx += kWarp) {
    const int i = 16 * w + idx / (16 * (w + 1)), j = idx % (16 * (w + 1));
    Tb[i * kV + j] = __float2bfloat16_rn(Tf[i * kF + j]);
  }
  __syncwarp();

  // W = T X (rows of this warp) → scratch, all 64 rows
  {
    MmaFragC acc[DK / 8];
#pragma unroll
    for (int nt = 0; nt < DK / 8; ++nt) zero(acc[nt]);
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
      if (kt <= w) {  // T is lower triangular
        MmaFragA at;
        load_a(at, Tb, kV, 16 * w, 16 * kt, lane);
#pragma unroll
        for (int np = 0; np < DK / 16; ++np) {
          MmaFragB b0, b1;
          load_b_kn(b0, b1, Ks, kK, 16 * kt, 16 * np, lane);
          mma_m16n8k16_bf16(acc[2 * np], at, b0, acc[2 * np]);
          mma_m16n8k16_bf16(acc[2 * np + 1], at, b1, acc[2 * np + 1]);
        }
      }
    bf16* wrow = w_ws + (size_t(h) * P + c0 + 16 * w) * DK;
#pragma unroll
    for (int nt = 0; nt < DK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2)
        store_pair(wrow + size_t(c_row(lane, e)) * DK + nt * 8 + c_col(lane, e), acc[nt].reg[e], acc[nt].reg[e + 1]);
  }

  // U = T (β V), 64 columns at a time → out, rows < n
  for (int col0 = 0; col0 < dv; col0 += kOutCols) {
    if (col0 > 0) {  // the next tile of V (every warp is done with the last one)
      __syncthreads();
      load_rows<kChunk, kOutCols>(Vs, kV, v + (size_t(c0) * VH + h) * dv + col0, size_t(VH) * dv, n, async, tid);
      if (async) cp_async_wait_all();
      own_pieces<kChunk, kOutCols>(Vs, kV, tid, [&](int r, bf16* e8) {
        for (int e = 0; e < 8; ++e) e8[e] = __float2bfloat16_rn(bet[r] * __bfloat162float(e8[e]));
      });
      __syncthreads();
    }
    MmaFragC acc[kOutCols / 8];
#pragma unroll
    for (int nt = 0; nt < kOutCols / 8; ++nt) zero(acc[nt]);
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
      if (kt <= w) {
        MmaFragA at;
        load_a(at, Tb, kV, 16 * w, 16 * kt, lane);
#pragma unroll
        for (int np = 0; np < kOutCols / 16; ++np) {
          MmaFragB b0, b1;
          load_b_kn(b0, b1, Vs, kV, 16 * kt, 16 * np, lane);
          mma_m16n8k16_bf16(acc[2 * np], at, b0, acc[2 * np]);
          mma_m16n8k16_bf16(acc[2 * np + 1], at, b1, acc[2 * np + 1]);
        }
      }
#pragma unroll
    for (int nt = 0; nt < kOutCols / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int i = 16 * w + c_row(lane, e);
        if (i < n)
          store_pair(u_out + (size_t(c0 + i) * VH + h) * dv + col0 + nt * 8 + c_col(lane, e), acc[nt].reg[e],
                     acc[nt].reg[e + 1]);
      }
  }
}

// ================================ 2. state: the serial pass ================================

// Eight warps a state block (twice the prepare and output passes' four): the chunk's two dependent products are
// split over them so that each warp issues half the instructions of a four-warp block and each SM scheduler has
// two warps to switch between while one waits on an mma, an ldmatrix or a barrier.
constexpr int kStateWarps = 8;
constexpr int kStateBlock = kStateWarps * kWarp;

template <int DK, int STAGES>
struct StateSmem {
  static constexpr int kK = DK + kPad;          // row stride of the [64, DK] tiles
  static constexpr int kN = kStateCols + kPad;  // row stride of the [·, 32] tiles
  // one stage: W [64, DK], K [64, DK], U [64, 32] (bf16), γ [64] (fp32)
  static constexpr size_t ws = 0, ks = ws + size_t(kChunk) * kK * 2, us = ks + size_t(kChunk) * kK * 2,
                          gs = us + size_t(kChunk) * kN * 2, stage = gs + kChunk * 4;
  static constexpr size_t sb = STAGES * stage;              // S₀ in bf16 [DK, 32]
  static constexpr size_t vs = sb + size_t(DK) * kN * 2;    // e^{γlast−γ} V' in bf16 [64, 32]
  static constexpr size_t bytes = vs + size_t(kChunk) * kN * 2;
  static_assert(stage % 16 == 0 && ks % 16 == 0 && us % 16 == 0 && gs % 16 == 0 && sb % 16 == 0,
                "tiles 16-byte aligned");
};

// Which 16-byte pieces of a full chunk's stage thread tid copies, fixed for the whole pass (the addressing is
// computed once, not per chunk): W and K rows tid / kRowPieces + j·kRowsPass (j < kPasses), piece tid % kRowPieces;
// U row tid / 4, piece tid % 4 (64 rows × 4 pieces: one a thread); γ pieces tid < 16. S₀'s copy to the scratch:
// rows tid / 4 + j·64 (j < DK / 64), piece tid % 4.
template <int DK>
struct StatePieces {
  static constexpr int kRowPieces = DK / 8, kRowsPass = kStateBlock / kRowPieces, kPasses = kChunk / kRowsPass;
  static constexpr int kSPasses = DK / 64;
  static_assert(kStateBlock == kChunk * (kStateCols / 8) && kChunk % kRowsPass == 0, "U: one piece a thread");
};

// vnew [S, VH, dv]: U on entry (rows < S), V' on return; states_ws [VH, chunks, DK, dv]: S₀ of every chunk (bf16);
// state [VH, DK, dv] fp32: before position 0 on entry, after S − 1 on return (null: zero, not written).
// The block's state S[DK, 32] lives in the warps' mma accumulators for the whole sequence, as [DK/16] m-tiles ×
// 4 n-tiles of 16×8 spread over the 8 warps: warp w holds m-tile w % (DK/16) and kUpdN = 32·DK/16/8/8 consecutive
// n-tiles (dk 128: 16 rows × 32 columns; dk 64: 16 rows × 16 columns). V' = U − W S₀ [64, 32]: warp w computes
// token rows 16·(w % 4) × columns 16·(w / 4) (4 row tiles × 2 column halves).
// The arithmetic per element (operands, rounding points, the order of every fp32 sum) is the four-warp kernel's:
// V' sums the even and the odd k steps in two accumulators, the state update adds the key tiles in order.
template <int DK, int STAGES>
__global__ void __launch_bounds__(kStateBlock, 1)
    delta_chunk_state_kernel(bf16* vnew, bf16* states_ws, float* state, const bf16* k, const float* gamma_ws,
                             const bf16* w_ws, int S, int KH, int VH, int dv, int P, bool async) {
  using L = StateSmem<DK, STAGES>;
  using Pc = StatePieces<DK>;
  constexpr int kK = L::kK, kN = L::kN;
  constexpr int kMTiles = DK / 16;                                  // 16-row tiles of the state
  constexpr int kColTiles = kStateCols / 8;                         // 4 n-tiles
  constexpr int kUpdN = kColTiles * kMTiles / kStateWarps;          // n-tiles of the state a warp holds (4 or 2)
  static_assert(kUpdN >= 2 && kUpdN % 2 == 0, "whole ldmatrix_x4 pairs of n-tiles");
  DFLASH_DYNAMIC_SHARED(uint4, smem_raw);
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem_raw);
  bf16* Sb = reinterpret_cast<bf16*>(smem + L::sb);
  bf16* Vs = reinterpret_cast<bf16*>(smem + L::vs);

  const int h = blockIdx.x, col0 = blockIdx.y * kStateCols, kh = h / (VH / KH);
  const int tid = threadIdx.x, lane = tid % kWarp, w = tid / kWarp;
  const int chunks = P / kChunk;
  const int srow0 = (w % kMTiles) * 16, snt0 = (w / kMTiles) * kUpdN;  // this warp's state tiles
  const int vrow0 = (w % 4) * 16, vcol0 = (w / 4) * 16;                 // this warp's tile of V'

  MmaFragC st[kUpdN];  // S rows [srow0, srow0 + 16) × columns col0 + 8·[snt0, snt0 + kUpdN), fp32
#pragma unroll
  for (int nt = 0; nt < kUpdN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = srow0 + c_row(lane, e), col = col0 + (snt0 + nt) * 8 + c_col(lane, e);
      st[nt].reg[e] = state ? state[(size_t(h) * DK + row) * dv + col] : 0.f;
    }

  // this thread's pieces of a full chunk (StatePieces), as offsets from chunk 0
  const int prow = tid / Pc::kRowPieces, ppiece = (tid % Pc::kRowPieces) * 8;
  const bf16* w_src = w_ws + (size_t(h) * P + prow) * DK + ppiece;
  const bf16* k_src = k + (size_t(prow) * KH + kh) * DK + ppiece;
  const bf16* u_src = vnew + (size_t(tid / 4) * VH + h) * dv + col0 + (tid % 4) * 8;
  const size_t w_step = size_t(kChunk) * DK, k_step = size_t(kChunk) * KH * DK, u_step = size_t(kChunk) * VH * dv;
  const int wk_dst = prow * kK + ppiece, u_dst = (tid / 4) * kN + (tid % 4) * 8;

  // chunk c's W, K, U, γ into stage c % STAGES; a group is committed even past the end (the wait counts groups).
  // A full chunk with 16-byte aligned inputs takes the fixed pieces; the last partial chunk and misaligned
  // inputs the general loops (zeros past the chunk's end, plain loads).
  auto issue = [&](int c) {
    if (c < chunks) {
      unsigned char* s = smem + size_t(c % STAGES) * L::stage;
      bf16* Wd = reinterpret_cast<bf16*>(s + L::ws);
      bf16* Kd = reinterpret_cast<bf16*>(s + L::ks);
      bf16* Ud = reinterpret_cast<bf16*>(s + L::us);
      const int c0 = c * kChunk, n = min(kChunk, S - c0);
      if (async && n == kChunk) {
        const bf16* wsrc = w_src + size_t(c) * w_step;
        const bf16* ksrc = k_src + size_t(c) * k_step;
#pragma unroll
        for (int j = 0; j < Pc::kPasses; ++j) {
          cp_async_cg(Wd + wk_dst + j * Pc::kRowsPass * kK, wsrc + size_t(j) * Pc::kRowsPass * DK);
          cp_async_cg(Kd + wk_dst + j * Pc::kRowsPass * kK, ksrc + size_t(j) * Pc::kRowsPass * KH * DK);
        }
        cp_async_cg(Ud + u_dst, u_src + size_t(c) * u_step);
      } else {
        load_rows<kChunk, DK, kStateBlock>(Wd, kK, w_ws + (size_t(h) * P + c0) * DK, DK, kChunk, true, tid);
        load_rows<kChunk, DK, kStateBlock>(Kd, kK, k + (size_t(c0) * KH + kh) * DK, size_t(KH) * DK, n, async, tid);
        load_rows<kChunk, kStateCols, kStateBlock>(Ud, kN, vnew + (size_t(c0) * VH + h) * dv + col0, size_t(VH) * dv,
                                                   n, async, tid);
      }
      load_gamma(reinterpret_cast<float*>(s + L::gs), gamma_ws + size_t(h) * P + c0, tid);
    }
    cp_async_commit_group();
  };
#pragma unroll
  for (int c = 0; c < STAGES - 1; ++c) issue(c);

  for (int c = 0; c < chunks; ++c) {
    const int c0 = c * kChunk, n = min(kChunk, S - c0), tiles = (n + 15) / 16;
    const unsigned char* s = smem + size_t(c % STAGES) * L::stage;
    const bf16* Ws = reinterpret_cast<const bf16*>(s + L::ws);
    const bf16* Kt = reinterpret_cast<const bf16*>(s + L::ks);
    const bf16* Us = reinterpret_cast<const bf16*>(s + L::us);
    const float* gs = reinterpret_cast<const float*>(s + L::gs);
    cp_async_wait_group<STAGES - 2>();  // chunk c has landed (this thread's copies)
    // S₀ in bf16, the operand of V' (this warp's tiles)
#pragma unroll
    for (int nt = 0; nt < kUpdN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int row = srow0 + c_row(lane, e), col = (snt0 + nt) * 8 + c_col(lane, e);
        store_pair(Sb + size_t(row) * kN + col, st[nt].reg[e], st[nt].reg[e + 1]);
      }
    __syncthreads();  // chunk c and S₀ visible to all; every read of chunk c − 1 is done
    issue(c + STAGES - 1);

    // S₀ in bf16 → scratch (the output pass's operand), 16-byte pieces of whole rows
    {
      bf16* sc = states_ws + (size_t(h) * chunks + c) * DK * dv + col0;
#pragma unroll
      for (int j = 0; j < Pc::kSPasses; ++j) {
        const int row = tid / 4 + 64 * j, piece = (tid % 4) * 8;
        *reinterpret_cast<uint4*>(sc + size_t(row) * dv + piece) =
            *reinterpret_cast<const uint4*>(Sb + size_t(row) * kN + piece);
      }
    }

    // V' = U − W S₀ (this warp's 16 token rows × 16 columns), two accumulators over alternate k steps
    const float last = gs[n - 1];
    if (vrow0 < n) {
      MmaFragC acc[2][2];
      zero(acc[0][0]), zero(acc[0][1]), zero(acc[1][0]), zero(acc[1][1]);
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) {
        MmaFragA aw;
        load_a(aw, Ws, kK, vrow0, 16 * kk, lane);
        MmaFragB b0, b1;
        load_b_kn(b0, b1, Sb, kN, 16 * kk, vcol0, lane);
        mma_m16n8k16_bf16(acc[kk & 1][0], aw, b0, acc[kk & 1][0]);
        mma_m16n8k16_bf16(acc[kk & 1][1], aw, b1, acc[kk & 1][1]);
      }
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int i = vrow0 + c_row(lane, e);
        const float f = expf(last - gs[i]);  // once a row
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int col = vcol0 + nt * 8 + c_col(lane, e);
          const uint32_t u = *reinterpret_cast<const uint32_t*>(Us + size_t(i) * kN + col);
          const float v0 = __bfloat162float(bf16x2_lo(u)) - (acc[0][nt].reg[e] + acc[1][nt].reg[e]);
          const float v1 = __bfloat162float(bf16x2_hi(u)) - (acc[0][nt].reg[e + 1] + acc[1][nt].reg[e + 1]);
          if (i < n) store_pair(vnew + (size_t(c0 + i) * VH + h) * dv + col0 + col, v0, v1);
          store_pair(Vs + size_t(i) * kN + col, f * v0, f * v1);
        }
      }
    }
    const float decay = expf(last);
#pragma unroll
    for (int nt = 0; nt < kUpdN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt].reg[e] *= decay;
    __syncthreads();  // e^{γlast−γ} V' complete

    // S ← e^{γlast} S₀ + Kᵀ (e^{γlast−γ} V') (this warp's state tiles)
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
      if (kt < tiles) {
        MmaFragB bv[kUpdN];
#pragma unroll
        for (int np = 0; np < kUpdN / 2; ++np)
          load_b_kn(bv[2 * np], bv[2 * np + 1], Vs, kN, 16 * kt, (snt0 + 2 * np) * 8, lane);
        MmaFragA ak;
        load_a_trans(ak, Kt, kK, srow0, 16 * kt, lane);
#pragma unroll
        for (int nt = 0; nt < kUpdN; ++nt) mma_m16n8k16_bf16(st[nt], ak, bv[nt], st[nt]);
      }
  }
  cp_async_wait_group<0>();  // the empty groups past the end

  if (state)
#pragma unroll
    for (int nt = 0; nt < kUpdN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = srow0 + c_row(lane, e), col = col0 + (snt0 + nt) * 8 + c_col(lane, e);
        state[(size_t(h) * DK + row) * dv + col] = st[nt].reg[e];
      }
}

// ================================ 3. output ================================

template <int DK>
struct OutputSmem {
  static constexpr int kK = DK + kPad, kV = kOutCols + kPad;
  static constexpr size_t qs = 0;                              // Q [64, DK]
  static constexpr size_t ks = qs + size_t(kChunk) * kK * 2;   // K [64, DK]
  static constexpr size_t ss = ks + size_t(kChunk) * kK * 2;   // S₀ [DK, 64] (bf16, from the state pass)
  static constexpr size_t vp = ss + size_t(DK) * kV * 2;       // V' [64, 64]
  static constexpr size_t gs = vp + size_t(kChunk) * kV * 2;   // γ [64]
  static constexpr size_t bytes = gs + kChunk * 4;
  static_assert(ss % 16 == 0 && vp % 16 == 0 && gs % 16 == 0, "tiles 16-byte aligned");
};

// out [S, VH, dv]: V' on entry, O on return (each block reads its tile before it writes it).
template <int DK>
__global__ void __launch_bounds__(kBlock, 1)
    delta_chunk_output_kernel(bf16* out, const bf16* q, const bf16* k, const float* gamma_ws, const bf16* states_ws,
                              int S, int KH, int VH, int dv, int P, bool async) {
  using L = OutputSmem<DK>;
  constexpr int kK = L::kK, kV = L::kV;
  DFLASH_DYNAMIC_SHARED(uint4, smem_raw);
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem_raw);
  bf16* Qs = reinterpret_cast<bf16*>(smem + L::qs);
  bf16* Ks = reinterpret_cast<bf16*>(smem + L::ks);
  bf16* Ss = reinterpret_cast<bf16*>(smem + L::ss);
  bf16* Vp = reinterpret_cast<bf16*>(smem + L::vp);
  float* gs = reinterpret_cast<float*>(smem + L::gs);

  const int c = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * kOutCols, kh = h / (VH / KH);
  const int c0 = c * kChunk, n = min(kChunk, S - c0), tiles = (n + 15) / 16, chunks = P / kChunk;
  const int tid = threadIdx.x, lane = tid % kWarp, w = tid / kWarp;

  load_rows<kChunk, DK>(Qs, kK, q + (size_t(c0) * KH + kh) * DK, size_t(KH) * DK, n, async, tid);
  load_rows<kChunk, DK>(Ks, kK, k + (size_t(c0) * KH + kh) * DK, size_t(KH) * DK, n, async, tid);
  load_rows<DK, kOutCols>(Ss, kV, states_ws + (size_t(h) * chunks + c) * DK * dv + col0, dv, DK, true, tid);
  load_rows<kChunk, kOutCols>(Vp, kV, out + (size_t(c0) * VH + h) * dv + col0, size_t(VH) * dv, n, async, tid);
  load_gamma(gs, gamma_ws + size_t(h) * P + c0, tid);
  cp_async_wait_all();
  __syncthreads();
  if (w >= tiles) return;  // no token rows here (a partial last chunk); no barrier follows

  // Q S₀ (8 n-tiles) and Q Kᵀ (key blocks p ≤ w, 2 n-tiles each) over the same A fragments
  MmaFragC acc[kOutCols / 8], pk[8];
#pragma unroll
  for (int nt = 0; nt < kOutCols / 8; ++nt) zero(acc[nt]);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) zero(pk[nt]);
  for (int k0 = 0; k0 < DK; k0 += 16) {
    MmaFragA aq;
    load_a(aq, Qs, kK, 16 * w, k0, lane);
#pragma unroll
    for (int np = 0; np < kOutCols / 16; ++np) {
      MmaFragB b0, b1;
      load_b_kn(b0, b1, Ss, kV, k0, 16 * np, lane);
      mma_m16n8k16_bf16(acc[2 * np], aq, b0, acc[2 * np]);
      mma_m16n8k16_bf16(acc[2 * np + 1], aq, b1, acc[2 * np + 1]);
    }
#pragma unroll
    for (int p = 0; p < 4; ++p)
      if (p <= w) {
        MmaFragB b0, b1;
        load_b_nk(b0, b1, Ks, kK, k0, 16 * p, lane);
        mma_m16n8k16_bf16(pk[2 * p], aq, b0, pk[2 * p]);
        mma_m16n8k16_bf16(pk[2 * p + 1], aq, b1, pk[2 * p + 1]);
      }
  }
  // e^γ (Q S₀), then + (Q Kᵀ ⊙ D ⊙ causal) V' with the scores rounded to bf16 as A fragments (registers only:
  // an m16n8 accumulator pair is the m16k16 A layout)
#pragma unroll
  for (int nt = 0; nt < kOutCols / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt].reg[e] *= expf(gs[16 * w + c_row(lane, e)]);
#pragma unroll
  for (int p = 0; p < 4; ++p)
    if (p <= w) {
      float sc[2][4];
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * w + c_row(lane, e), j = 16 * p + half * 8 + c_col(lane, e);
          sc[half][e] = j <= i ? expf(gs[i] - gs[j]) * pk[2 * p + half].reg[e] : 0.f;
        }
      MmaFragA ap;
      ap.reg[0] = pack_bf16x2_rn(sc[0][0], sc[0][1]);
      ap.reg[1] = pack_bf16x2_rn(sc[0][2], sc[0][3]);
      ap.reg[2] = pack_bf16x2_rn(sc[1][0], sc[1][1]);
      ap.reg[3] = pack_bf16x2_rn(sc[1][2], sc[1][3]);
#pragma unroll
      for (int np = 0; np < kOutCols / 16; ++np) {
        MmaFragB b0, b1;
        load_b_kn(b0, b1, Vp, kV, 16 * p, 16 * np, lane);
        mma_m16n8k16_bf16(acc[2 * np], ap, b0, acc[2 * np]);
        mma_m16n8k16_bf16(acc[2 * np + 1], ap, b1, acc[2 * np + 1]);
      }
    }
#pragma unroll
  for (int nt = 0; nt < kOutCols / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int i = 16 * w + c_row(lane, e);
      if (i < n)
        store_pair(out + (size_t(c0 + i) * VH + h) * dv + col0 + nt * 8 + c_col(lane, e), acc[nt].reg[e],
                   acc[nt].reg[e + 1]);
    }
}

// ================================ host ================================

std::string shape_text(int S, int KH, int VH, int dk, int dv) {
  return "S " + std::to_string(S) + ", " + std::to_string(KH) + " key heads, " + std::to_string(VH) +
         " value heads, dk " + std::to_string(dk) + ", dv " + std::to_string(dv);
}

// Raises kernel K's dynamic shared memory to `bytes` where it is over the default 48 KiB, or refuses with the
// kernel, the shape and the device when the device cannot give it.
template <auto K>
void allow_smem(size_t bytes, const char* name, const std::string& shape) {
  const DeviceLimits& d = current_device_limits();
  if (bytes > d.smem_per_block_optin) {
    const std::string why = std::string(name) + " needs " + std::to_string(bytes) + " bytes of shared memory a block (" +
                            shape + "); " + d.name + " (sm_" + std::to_string(d.sm) + ") allows " +
                            std::to_string(d.smem_per_block_optin) + " (cudaDevAttrMaxSharedMemoryPerBlockOptin)";
    cuda_fail("launch_gated_delta_rule_chunked", __FILE__, __LINE__, why.c_str());
  }
  if (bytes > 48 * 1024) allow_dynamic_smem<K>(bytes, name);
}

template <int DK>
void launch_chunked(cudaStream_t st, bf16* out, const bf16* q, const bf16* k, const bf16* v, const float* g,
                    const float* beta, float* state, int S, int KH, int VH, int dv, unsigned char* scratch,
                    const ChunkedPassMarks* marks) {
  const DeltaChunkedScratch lay = delta_rule_chunked_scratch(S, VH, DK, dv);
  float* gamma_ws = reinterpret_cast<float*>(scratch + lay.gamma);
  bf16* w_ws = reinterpret_cast<bf16*>(scratch + lay.w);
  bf16* states_ws = reinterpret_cast<bf16*>(scratch + lay.states);
  const int chunks = (S + kChunk - 1) / kChunk, P = chunks * kChunk;
  const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  const bool async = ((addr(q) | addr(k) | addr(v) | addr(out)) & 15) == 0;
  const std::string shape = shape_text(S, KH, VH, DK, dv);

  allow_smem<delta_chunk_prepare_kernel<DK>>(PrepareSmem<DK>::bytes, "delta_chunk_prepare_kernel", shape);
  DFLASH_LAUNCH(dim3(unsigned(chunks), unsigned(VH)), kBlock, PrepareSmem<DK>::bytes, st,
                delta_chunk_prepare_kernel<DK>)(out, gamma_ws, w_ws, k, v, g, beta, S, KH, VH, dv, P, async);
  if (marks && marks->after_prepare) DFLASH_CUDA_CHECK(cudaEventRecord(marks->after_prepare, st));

  // the state pass: three stages where the device's shared memory holds them, else two
  const dim3 state_grid(unsigned(VH), unsigned(dv / kStateCols));
  constexpr size_t smem3 = StateSmem<DK, 3>::bytes, smem2 = StateSmem<DK, 2>::bytes;
  if (smem3 <= current_device_limits().smem_per_block_optin) {
    allow_smem<delta_chunk_state_kernel<DK, 3>>(smem3, "delta_chunk_state_kernel (3 stages)", shape);
    DFLASH_LAUNCH(state_grid, kStateBlock, smem3, st, delta_chunk_state_kernel<DK, 3>)(
        out, states_ws, state, k, gamma_ws, w_ws, S, KH, VH, dv, P, async);
  } else {
    allow_smem<delta_chunk_state_kernel<DK, 2>>(smem2, "delta_chunk_state_kernel (2 stages)", shape);
    DFLASH_LAUNCH(state_grid, kStateBlock, smem2, st, delta_chunk_state_kernel<DK, 2>)(
        out, states_ws, state, k, gamma_ws, w_ws, S, KH, VH, dv, P, async);
  }
  if (marks && marks->after_state) DFLASH_CUDA_CHECK(cudaEventRecord(marks->after_state, st));

  allow_smem<delta_chunk_output_kernel<DK>>(OutputSmem<DK>::bytes, "delta_chunk_output_kernel", shape);
  DFLASH_LAUNCH(dim3(unsigned(chunks), unsigned(VH), unsigned(dv / kOutCols)), kBlock, OutputSmem<DK>::bytes, st,
                delta_chunk_output_kernel<DK>)(out, q, k, gamma_ws, states_ws, S, KH, VH, dv, P, async);
}

}  // namespace

bool gated_delta_rule_chunked_supports(int k_heads, int v_heads, int dk, int dv) {
  return delta_rule_chunked_shape(k_heads, v_heads, dk, dv);
}

size_t gated_delta_rule_chunked_scratch_bytes(int S, int v_heads, int dk, int dv) {
  return delta_rule_chunked_scratch(S, v_heads, dk, dv).bytes;
}

ChunkedSmem gated_delta_rule_chunked_smem(int dk) {
  if (dk == 64) return {PrepareSmem<64>::bytes, StateSmem<64, 2>::bytes, StateSmem<64, 3>::bytes, OutputSmem<64>::bytes};
  return {PrepareSmem<128>::bytes, StateSmem<128, 2>::bytes, StateSmem<128, 3>::bytes, OutputSmem<128>::bytes};
}

void launch_gated_delta_rule_chunked(cudaStream_t st, bf16* out, const bf16* q, const bf16* k, const bf16* v,
                                     const float* g, const float* beta, float* state, int S, int k_heads, int v_heads,
                                     int dk, int dv, void* scratch, const ChunkedPassMarks* marks) {
  if (!gated_delta_rule_chunked_supports(k_heads, v_heads, dk, dv)) {
    const std::string why = shape_text(S, k_heads, v_heads, dk, dv) +
                            ": the chunked delta-rule kernels take dk 64 or 128, dv a multiple of 64 and value heads "
                            "a multiple of key heads";
    cuda_fail("launch_gated_delta_rule_chunked", __FILE__, __LINE__, why.c_str());
  }
  if (S <= 0) return;  // nothing to do: the state is unchanged
  if (!scratch || (reinterpret_cast<uintptr_t>(scratch) & 15) != 0) {
    const std::string why = shape_text(S, k_heads, v_heads, dk, dv) + ": the scratch (" +
                            std::to_string(gated_delta_rule_chunked_scratch_bytes(S, v_heads, dk, dv)) +
                            " bytes) must be device memory aligned to 16 bytes";
    cuda_fail("launch_gated_delta_rule_chunked", __FILE__, __LINE__, why.c_str());
  }
  unsigned char* ws = static_cast<unsigned char*>(scratch);
  if (dk == 64)
    launch_chunked<64>(st, out, q, k, v, g, beta, state, S, k_heads, v_heads, dv, ws, marks);
  else
    launch_chunked<128>(st, out, q, k, v, g, beta, state, S, k_heads, v_heads, dv, ws, marks);
}

}  // namespace dflash::kernels::cuda
