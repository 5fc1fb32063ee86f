// The gated delta rule in chunks of 64 tokens on tensor cores (bf16 operands, fp32 accumulation and state): the WY /
// UT form of flash-linear-attention's chunk_gated_delta_rule, whose CPU twin is kernels/cpu/gated_delta_chunked.h
// (the math, line by line). Unverified on GPU; first version, simple over fast:
//   grid (value head, 64-column slice of dv), 4 warps; the block walks the chunks in order. Per chunk (n ≤ 64
//   tokens, rows past n zero), with warp w owning token rows [16w, 16w + 16) of every [64, ·] product:
//   1. K, Q [64, dk] and V [64, 64] to shared memory (cp.async); γ (cumulative g, fp32, in order) and β;
//      the state S₀ (fp32 registers: warp w holds dk rows [w·dk/4, (w+1)·dk/4) as mma accumulators) to bf16 Sb.
//   2. K Kᵀ and Q Kᵀ (mma, only the key tiles at or below the diagonal): L = β_i e^{γi−γj} (k_i·k_j), j < i, in
//      fp32; P = e^{γi−γj} (q_i·k_j), j ≤ i, in bf16.
//   3. T = (I + L)⁻¹ on CUDA cores in fp32: thread j solves column j by forward substitution (no barrier; T's
//      strictly upper transpose shares L's tile); T to bf16. Meanwhile β e^γ K, β V and K e^{γlast−γ} in bf16.
//   4. W = T (β e^γ K), U = T (β V) (mma), W to bf16; V' = U − W S₀ (mma), V' to bf16.
//   5. O = e^γ (Q S₀) + P V' (mma) → out in bf16; S ← e^{γlast} S + (K e^{γlast−γ})ᵀ V' (mma into the registers).
// Five block barriers a chunk. Shared memory 100 KB (dk 64) / 159 KB (dk 128): one block per SM.
// The bf16 roundings (the same places fla rounds): T, β e^γ K, W, S₀, P, V', K e^{γlast−γ}; inputs and output.
#include "kernels/cuda/deltanet_chunked.h"

#include <cstdint>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_limits.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/mma.cuh"

namespace dflash::kernels::cuda {

namespace {

constexpr int kChunk = 64;  // tokens a chunk
constexpr int kCols = 64;   // state (value) columns a block
constexpr int kWarps = 4;
constexpr int kBlock = kWarps * kWarp;
constexpr int kPad = 8;  // bf16 row padding: rows stay 16-byte aligned and 8 ldmatrix rows hit distinct banks

// Dynamic shared memory of the kernel for key dim DK: byte offsets of its tiles.
template <int DK>
struct ChunkSmem {
  static constexpr int kK = DK + kPad;     // row stride (elements) of the [64, DK] bf16 tiles
  static constexpr int kC = kCols + kPad;  // row stride of the [64, 64] and [DK, 64] bf16 tiles
  static constexpr int kL = kChunk + 1;    // row stride of the fp32 [64, 64] tile
  static constexpr size_t kRowsK = size_t(kChunk) * kK * 2, kRowsC = size_t(kChunk) * kC * 2;
  static constexpr size_t ks = 0;             // K [64, DK], then K e^{γlast−γ}
  static constexpr size_t qs = ks + kRowsK;   // Q [64, DK]
  static constexpr size_t xs = qs + kRowsK;   // β e^γ K [64, DK]
  static constexpr size_t ws = xs + kRowsK;   // W [64, DK]
  static constexpr size_t vs = ws + kRowsK;   // V, then β V [64, 64]
  static constexpr size_t vp = vs + kRowsC;   // V' [64, 64]
  static constexpr size_t tb = vp + kRowsC;   // T [64, 64]
  static constexpr size_t pb = tb + kRowsC;   // P [64, 64]
  static constexpr size_t sb = pb + kRowsC;   // S₀ [DK, 64]
  static constexpr size_t lf = sb + size_t(DK) * kC * 2;  // fp32 [64, 64]: L strictly lower, Tᵀ strictly upper
  static constexpr size_t gm = lf + size_t(kChunk) * kL * 4;  // γ [64]
  static constexpr size_t bt = gm + kChunk * 4;               // β [64]
  static constexpr size_t eg = bt + kChunk * 4;               // e^γ [64]
  static constexpr size_t el = eg + kChunk * 4;               // e^{γlast−γ} [64]
  static constexpr size_t bytes = el + kChunk * 4;
  static_assert(lf % 16 == 0 && sb % 16 == 0, "tiles 16-byte aligned");
};

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

// dst[64, W] (row stride ld) = rows [0, n) of src (row stride src_ld elements), zeros after; W a multiple of 8.
template <int W>
__device__ __forceinline__ void load_rows(bf16* dst, int ld, const bf16* src, size_t src_ld, int n, bool aligned,
                                          int tid) {
  constexpr int kPieces = W / 8;  // 16-byte pieces a row
  for (int idx = tid; idx < kChunk * kPieces; idx += kBlock) {
    const int r = idx / kPieces, p = idx % kPieces;
    bf16* d = dst + size_t(r) * ld + p * 8;
    if (r >= n) {
      for (int e = 0; e < 8; ++e) d[e] = __float2bfloat16_rn(0.f);
    } else if (aligned) {
      cp_async_cg(d, src + size_t(r) * src_ld + p * 8);
    } else {
      for (int e = 0; e < 8; ++e) d[e] = src[size_t(r) * src_ld + p * 8 + e];
    }
  }
}

template <int DK>
__global__ void __launch_bounds__(kBlock)
    delta_rule_chunked_kernel(bf16* out, const bf16* q, const bf16* k, const bf16* v, const float* g,
                              const float* beta, float* state, int S, int KH, int VH, int dv, bool aligned) {
  using L = ChunkSmem<DK>;
  constexpr int kK = L::kK, kC = L::kC, kL = L::kL;
  constexpr int kRowsPerWarp = DK / kWarps;          // state rows a warp holds
  constexpr int kStateTiles = kRowsPerWarp / 16;     // 1 (dk 64) or 2 (dk 128)
  constexpr int kColTiles = kCols / 8;               // 8 n-tiles of the block's columns
  DFLASH_DYNAMIC_SHARED(uint4, smem_raw);
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem_raw);
  bf16* Ks = reinterpret_cast<bf16*>(smem + L::ks);
  bf16* Qs = reinterpret_cast<bf16*>(smem + L::qs);
  bf16* Xs = reinterpret_cast<bf16*>(smem + L::xs);
  bf16* Ws = reinterpret_cast<bf16*>(smem + L::ws);
  bf16* Vs = reinterpret_cast<bf16*>(smem + L::vs);
  bf16* Vp = reinterpret_cast<bf16*>(smem + L::vp);
  bf16* Tb = reinterpret_cast<bf16*>(smem + L::tb);
  bf16* Pb = reinterpret_cast<bf16*>(smem + L::pb);
  bf16* Sb = reinterpret_cast<bf16*>(smem + L::sb);
  float* Lf = reinterpret_cast<float*>(smem + L::lf);
  float* gam = reinterpret_cast<float*>(smem + L::gm);
  float* bet = reinterpret_cast<float*>(smem + L::bt);
  float* eg = reinterpret_cast<float*>(smem + L::eg);
  float* el = reinterpret_cast<float*>(smem + L::el);

  const int h = blockIdx.x, col0 = blockIdx.y * kCols, kh = h / (VH / KH);
  const int tid = threadIdx.x, lane = tid % kWarp, w = tid / kWarp;
  const int srow0 = w * kRowsPerWarp;  // this warp's first state row

  MmaFragC st[kStateTiles][kColTiles];  // S rows [srow0, srow0 + kRowsPerWarp) × columns [col0, col0 + 64), fp32
#pragma unroll
  for (int mt = 0; mt < kStateTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kColTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = srow0 + mt * 16 + c_row(lane, e), col = nt * 8 + c_col(lane, e);
        st[mt][nt].reg[e] = state ? state[(size_t(h) * DK + row) * dv + col0 + col] : 0.f;
      }

  for (int c0 = 0; c0 < S; c0 += kChunk) {
    const int n = min(kChunk, S - c0), tiles = (n + 15) / 16;  // 16-token tiles holding the chunk's tokens
    __syncthreads();  // every read of the previous chunk's tiles is done
    // 1. S₀ in bf16 (each warp its rows), K, Q, V, γ, β
#pragma unroll
    for (int mt = 0; mt < kStateTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kColTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          Sb[size_t(srow0 + mt * 16 + c_row(lane, e)) * kC + nt * 8 + c_col(lane, e)] =
              __float2bfloat16_rn(st[mt][nt].reg[e]);
    load_rows<DK>(Ks, kK, k + (size_t(c0) * KH + kh) * DK, size_t(KH) * DK, n, aligned, tid);
    load_rows<DK>(Qs, kK, q + (size_t(c0) * KH + kh) * DK, size_t(KH) * DK, n, aligned, tid);
    load_rows<kCols>(Vs, kC, v + (size_t(c0) * VH + h) * dv + col0, size_t(VH) * dv, n, aligned, tid);
    if (aligned) cp_async_commit_group();
    if (tid == 0) {  // in token order, as the CPU twin: padded rows keep γ_{n−1} (finite exponents) and β = 0
      float acc = 0;
      for (int i = 0; i < kChunk; ++i) {
        if (i < n) acc += g[size_t(c0 + i) * VH + h];
        gam[i] = acc;
        bet[i] = i < n ? beta[size_t(c0 + i) * VH + h] : 0.f;
      }
      for (int i = 0; i < kChunk; ++i) {
        eg[i] = expf(gam[i]);
        el[i] = expf(acc - gam[i]);
      }
    }
    if (aligned) cp_async_wait_group<0>();
    __syncthreads();

    // 2. L = β_i e^{γi−γj} K Kᵀ (j < i, fp32) and P = e^{γi−γj} Q Kᵀ (j ≤ i, bf16); key tiles p ≤ w only
    if (w < tiles) {
      MmaFragC acc_a[8], acc_p[8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) zero(acc_a[nt]), zero(acc_p[nt]);
      for (int kk = 0; kk < DK; kk += 16) {
        MmaFragA ak, aq;
        load_a(ak, Ks, kK, 16 * w, kk, lane);
        load_a(aq, Qs, kK, 16 * w, kk, lane);
#pragma unroll
        for (int p = 0; p < 4; ++p)
          if (p <= w) {
            MmaFragB b0, b1;
            load_b_nk(b0, b1, Ks, kK, kk, 16 * p, lane);
            mma_m16n8k16_bf16(acc_a[2 * p], ak, b0, acc_a[2 * p]);
            mma_m16n8k16_bf16(acc_a[2 * p + 1], ak, b1, acc_a[2 * p + 1]);
            mma_m16n8k16_bf16(acc_p[2 * p], aq, b0, acc_p[2 * p]);
            mma_m16n8k16_bf16(acc_p[2 * p + 1], aq, b1, acc_p[2 * p + 1]);
          }
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
        if (nt < 2 * (w + 1))
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = 16 * w + c_row(lane, e), j = nt * 8 + c_col(lane, e);
            const float d = j <= i ? expf(gam[i] - gam[j]) : 0.f;
            if (j < i) Lf[i * kL + j] = bet[i] * d * acc_a[nt].reg[e];
            Pb[i * kC + j] = __float2bfloat16_rn(d * acc_p[nt].reg[e]);
          }
    }
    __syncthreads();

    // 3. T = (I + L)⁻¹, column j by thread j: T_ij = −(L_ij + Σ_{j<m<i} L_im T_mj), T_mj kept at Lf[j][m]
    const int rows = 16 * tiles;  // the rows of T the products read
    if (tid < kChunk) {
      const int j = tid;
      for (int i = 0; i < j && i < rows; ++i) Tb[i * kC + j] = __float2bfloat16_rn(0.f);
      if (j < rows) Tb[j * kC + j] = __float2bfloat16_rn(1.f);
      for (int i = j + 1; i < rows; ++i) {
        float s = Lf[i * kL + j];
        for (int m = j + 1; m < i; ++m) s += Lf[i * kL + m] * Lf[j * kL + m];
        Lf[j * kL + i] = -s;
        Tb[i * kC + j] = __float2bfloat16_rn(-s);
      }
    }
    for (int idx = tid; idx < kChunk * DK; idx += kBlock) {  // β e^γ K, and K e^{γlast−γ} in place
      const int i = idx / DK, d = idx % DK;
      const float kv = __bfloat162float(Ks[i * kK + d]);
      Xs[i * kK + d] = __float2bfloat16_rn(bet[i] * eg[i] * kv);
      Ks[i * kK + d] = __float2bfloat16_rn(el[i] * kv);
    }
    for (int idx = tid; idx < kChunk * kCols; idx += kBlock) {  // β V in place
      const int i = idx / kCols, c = idx % kCols;
      Vs[i * kC + c] = __float2bfloat16_rn(bet[i] * __bfloat162float(Vs[i * kC + c]));
    }
    __syncthreads();

    // 4. W = T (β e^γ K), U = T (β V); V' = U − W S₀ (this warp's rows)
    if (w < tiles) {
      MmaFragC accw[DK / 8], accu[kColTiles];
#pragma unroll
      for (int nt = 0; nt < DK / 8; ++nt) zero(accw[nt]);
#pragma unroll
      for (int nt = 0; nt < kColTiles; ++nt) zero(accu[nt]);
#pragma unroll
      for (int kt = 0; kt < 4; ++kt)
        if (kt <= w) {  // T is lower triangular
          MmaFragA at;
          load_a(at, Tb, kC, 16 * w, 16 * kt, lane);
#pragma unroll
          for (int np = 0; np < DK / 16; ++np) {
            MmaFragB b0, b1;
            load_b_kn(b0, b1, Xs, kK, 16 * kt, 16 * np, lane);
            mma_m16n8k16_bf16(accw[2 * np], at, b0, accw[2 * np]);
            mma_m16n8k16_bf16(accw[2 * np + 1], at, b1, accw[2 * np + 1]);
          }
#pragma unroll
          for (int np = 0; np < kCols / 16; ++np) {
            MmaFragB b0, b1;
            load_b_kn(b0, b1, Vs, kC, 16 * kt, 16 * np, lane);
            mma_m16n8k16_bf16(accu[2 * np], at, b0, accu[2 * np]);
            mma_m16n8k16_bf16(accu[2 * np + 1], at, b1, accu[2 * np + 1]);
          }
        }
#pragma unroll
      for (int nt = 0; nt < DK / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          Ws[(16 * w + c_row(lane, e)) * kK + nt * 8 + c_col(lane, e)] = __float2bfloat16_rn(accw[nt].reg[e]);
      __syncwarp();  // W's rows of this warp, written by its lanes, read back as A fragments
      MmaFragC accs[kColTiles];
#pragma unroll
      for (int nt = 0; nt < kColTiles; ++nt) zero(accs[nt]);
      for (int kk = 0; kk < DK; kk += 16) {
        MmaFragA aw;
        load_a(aw, Ws, kK, 16 * w, kk, lane);
#pragma unroll
        for (int np = 0; np < kCols / 16; ++np) {
          MmaFragB b0, b1;
          load_b_kn(b0, b1, Sb, kC, kk, 16 * np, lane);
          mma_m16n8k16_bf16(accs[2 * np], aw, b0, accs[2 * np]);
          mma_m16n8k16_bf16(accs[2 * np + 1], aw, b1, accs[2 * np + 1]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kColTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          Vp[(16 * w + c_row(lane, e)) * kC + nt * 8 + c_col(lane, e)] =
              __float2bfloat16_rn(accu[nt].reg[e] - accs[nt].reg[e]);
    }
    __syncthreads();

    // 5a. O = e^γ (Q S₀) + P V' (this warp's rows), rows < n to out
    if (w < tiles) {
      MmaFragC acco[kColTiles];
#pragma unroll
      for (int nt = 0; nt < kColTiles; ++nt) zero(acco[nt]);
      for (int kk = 0; kk < DK; kk += 16) {
        MmaFragA aq;
        load_a(aq, Qs, kK, 16 * w, kk, lane);
#pragma unroll
        for (int np = 0; np < kCols / 16; ++np) {
          MmaFragB b0, b1;
          load_b_kn(b0, b1, Sb, kC, kk, 16 * np, lane);
          mma_m16n8k16_bf16(acco[2 * np], aq, b0, acco[2 * np]);
          mma_m16n8k16_bf16(acco[2 * np + 1], aq, b1, acco[2 * np + 1]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kColTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acco[nt].reg[e] *= eg[16 * w + c_row(lane, e)];
#pragma unroll
      for (int kt = 0; kt < 4; ++kt)
        if (kt <= w) {  // P is causal
          MmaFragA ap;
          load_a(ap, Pb, kC, 16 * w, 16 * kt, lane);
#pragma unroll
          for (int np = 0; np < kCols / 16; ++np) {
            MmaFragB b0, b1;
            load_b_kn(b0, b1, Vp, kC, 16 * kt, 16 * np, lane);
            mma_m16n8k16_bf16(acco[2 * np], ap, b0, acco[2 * np]);
            mma_m16n8k16_bf16(acco[2 * np + 1], ap, b1, acco[2 * np + 1]);
          }
        }
#pragma unroll
      for (int nt = 0; nt < kColTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * w + c_row(lane, e);
          if (i < n)
            out[(size_t(c0 + i) * VH + h) * dv + col0 + nt * 8 + c_col(lane, e)] =
                __float2bfloat16_rn(acco[nt].reg[e]);
        }
    }

    // 5b. S ← e^{γlast} S₀ + (K e^{γlast−γ})ᵀ V' (every warp: its state rows)
    const float decay = eg[n - 1];
#pragma unroll
    for (int mt = 0; mt < kStateTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kColTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[mt][nt].reg[e] *= decay;
#pragma unroll
    for (int kt = 0; kt < 4; ++kt)
      if (kt < tiles) {
        MmaFragB bv[kColTiles];
#pragma unroll
        for (int np = 0; np < kCols / 16; ++np) load_b_kn(bv[2 * np], bv[2 * np + 1], Vp, kC, 16 * kt, 16 * np, lane);
#pragma unroll
        for (int mt = 0; mt < kStateTiles; ++mt) {
          MmaFragA ak;
          load_a_trans(ak, Ks, kK, srow0 + mt * 16, 16 * kt, lane);
#pragma unroll
          for (int nt = 0; nt < kColTiles; ++nt) mma_m16n8k16_bf16(st[mt][nt], ak, bv[nt], st[mt][nt]);
        }
      }
  }

  if (state)
#pragma unroll
    for (int mt = 0; mt < kStateTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kColTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = srow0 + mt * 16 + c_row(lane, e), col = nt * 8 + c_col(lane, e);
          state[(size_t(h) * DK + row) * dv + col0 + col] = st[mt][nt].reg[e];
        }
}

template <int DK>
void launch_chunked(cudaStream_t st, bf16* out, const bf16* q, const bf16* k, const bf16* v, const float* g,
                    const float* beta, float* state, int S, int KH, int VH, int dv) {
  const size_t smem = ChunkSmem<DK>::bytes;
  allow_dynamic_smem<delta_rule_chunked_kernel<DK>>(smem, "gated_delta_rule_forward (chunked)");
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v)) & 15) == 0;
  const dim3 grid(unsigned(VH), unsigned(dv / kCols));
  DFLASH_LAUNCH(grid, kBlock, smem, st, delta_rule_chunked_kernel<DK>)(out, q, k, v, g, beta, state, S, KH, VH, dv,
                                                                       aligned);
}

}  // namespace

bool gated_delta_rule_chunked_supports(int k_heads, int v_heads, int dk, int dv) {
  if (!((dk == 64 || dk == 128) && dv > 0 && dv % kCols == 0 && k_heads >= 1 && v_heads >= k_heads &&
        v_heads % k_heads == 0))
    return false;
  // the block's tiles must fit the device's shared memory (dk 128: 139 KiB, over sm_120's 99 KiB): else the
  // per-token kernel runs instead of a launch the device refuses
  return gated_delta_rule_chunked_smem(dk) <= current_device_limits().smem_per_block_optin;
}

size_t gated_delta_rule_chunked_smem(int dk) { return dk == 64 ? ChunkSmem<64>::bytes : ChunkSmem<128>::bytes; }

void launch_gated_delta_rule_chunked(cudaStream_t st, bf16* out, const bf16* q, const bf16* k, const bf16* v,
                                     const float* g, const float* beta, float* state, int S, int k_heads, int v_heads,
                                     int dk, int dv) {
  if (!gated_delta_rule_chunked_supports(k_heads, v_heads, dk, dv)) {
    const std::string why = "key head dim " + std::to_string(dk) + ", value head dim " + std::to_string(dv) + ", " +
                            std::to_string(k_heads) + " key heads, " + std::to_string(v_heads) +
                            " value heads: the chunked delta-rule kernel takes dk 64 or 128, dv a multiple of " +
                            std::to_string(kCols) + " and value heads a multiple of key heads";
    cuda_fail("launch_gated_delta_rule_chunked", __FILE__, __LINE__, why.c_str());
  }
  if (S <= 0) return;  // nothing to do: the state is unchanged
  if (dk == 64)
    launch_chunked<64>(st, out, q, k, v, g, beta, state, S, k_heads, v_heads, dv);
  else
    launch_chunked<128>(st, out, q, k, v, g, beta, state, S, k_heads, v_heads, dv);
}

}  // namespace dflash::kernels::cuda
