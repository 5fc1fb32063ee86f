#pragma once
// Warp-level matrix instructions for the tensor-core kernels (FlashAttention-2-style attention, the chunked delta
// rule): bf16 mma.sync m16n8k16 with fp32 accumulation, ldmatrix (shared memory → mma fragments) and cp.async
// (global → shared without registers). With nvcc each wrapper is one inline-PTX instruction; on the emulated GPU
// (DFLASH_CUDA_EMULATED) the same calls go to kernels/cuda/emu/warp_mma.h, which rebuilds the warp's tiles from
// the lanes' registers with the layouts below (mma_*_coord, ldmatrix_coord: one definition for both).
//
// API (namespace dflash::kernels::cuda). mma and ldmatrix are warp-wide (.sync.aligned): all 32 lanes of the
// warp call the same wrapper, converged; cp.async is per thread.
//   MmaFragA a; MmaFragB b; MmaFragC c, d;       registers of A (16×16, row-major), B (16×8, K×N), C/D (16×8)
//   mma_m16n8k16_bf16(d, a, b, c);               d = a·b + c in fp32 (d may be c)
//   ldmatrix_x1 / _x2 / _x4(r, row)              1, 2 or 4 8×8 matrices of b16 from shared memory into
//   ldmatrix_x1_trans / _x2_trans / _x4_trans    uint32_t r[1|2|4]: lane 8·m + i gives the address of row i of
//                                                matrix m (16 bytes, 16-byte aligned); lanes ≥ 8·count are ignored
//   cp_async_ca<4|8|16>(smem_dst, gmem_src)      an asynchronous copy of 4, 8 or 16 bytes (cached in L1 and L2);
//   cp_async_cg(smem_dst, gmem_src)              16 bytes, cached in L2 only; both addresses aligned to the size
//   cp_async_commit_group()                      closes the thread's group of the copies issued since the last one
//   cp_async_wait_group<N>()                     waits until at most the N newest groups are pending (N constant)
//   cp_async_wait_all()                          commit_group + wait_group<0>
//   pack_bf16x2(lo, hi), pack_bf16x2_rn(lo, hi)  a b32 register of two bf16 (lo: the lower-index element, bits 0–15)
//   bf16x2_lo(r), bf16x2_hi(r)                   its halves
//   mma_a_coord / mma_b_coord / mma_c_coord(lane, i), ldmatrix_coord(lane, half, trans)
//                                                which element of the tile a lane's register holds
// A shared-memory read of a cp.async destination before the wait that covers its group is a race: on the emulated
// GPU it reads the 0xFF fill (a NaN) until then. Plain host C++ (neither nvcc nor the emulation) sees only the
// fragment types, the layouts and the bf16x2 helpers.
#include <cuda_bf16.h>

#include <cstdint>

#if defined(__CUDACC__) && !defined(DFLASH_CUDA_EMULATED)
#define DFLASH_MMA_FN __host__ __device__ __forceinline__
#else
#define DFLASH_MMA_FN inline
#endif

namespace dflash::kernels::cuda {

// ---- fragments: the registers one lane holds (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
// type"; groupID = lane >> 2 and threadID_in_group = lane % 4 are the ISA's names) ----
struct MmaFragA {
  uint32_t reg[4];  // A 16×16 bf16 (row-major, .row): reg[j] holds a_{2j} (bits 0–15) and a_{2j+1}
};
struct MmaFragB {
  uint32_t reg[2];  // B 16×8 bf16 (K×N, .col: each lane's elements run along K): reg[j] holds b_{2j}, b_{2j+1}
};
struct MmaFragC {
  float reg[4];  // C or D 16×8 f32: reg[j] is c_j
};

// (row, col) of one fragment element in its tile.
struct FragCoord {
  int row, col;
};

// A (row = m, col = k) of element a_i, i in [0, 8) (register i / 2, half i % 2):
// row = groupID for i in {0, 1, 4, 5}, groupID + 8 otherwise; col = threadID_in_group·2 + (i & 1), + 8 for i ≥ 4.
DFLASH_MMA_FN constexpr FragCoord mma_a_coord(int lane, int i) {
  return FragCoord{(lane >> 2) + ((i >> 1) & 1) * 8, (lane & 3) * 2 + (i & 1) + (i >> 2) * 8};
}
// B (row = k, col = n) of element b_i, i in [0, 4) (register i / 2, half i % 2):
// row = threadID_in_group·2 + (i & 1), + 8 for i ≥ 2; col = groupID.
DFLASH_MMA_FN constexpr FragCoord mma_b_coord(int lane, int i) {
  return FragCoord{(lane & 3) * 2 + (i & 1) + (i >> 1) * 8, lane >> 2};
}
// C / D (row = m, col = n) of element c_i, i in [0, 4) (register i):
// row = groupID for i < 2, groupID + 8 otherwise; col = threadID_in_group·2 + (i & 1).
DFLASH_MMA_FN constexpr FragCoord mma_c_coord(int lane, int i) {
  return FragCoord{(lane >> 2) + (i >> 1) * 8, (lane & 3) * 2 + (i & 1)};
}
// ldmatrix .m8n8.b16 (PTX ISA, ldmatrix, "ldmatrix fragment layout for one 8x8 Matrix with 16-bit elements"): the
// element that half `half` of a lane's register for one matrix holds, as (row, col) of that matrix in shared
// memory, row i being the 16 bytes at the address lane 8·m + i gave. Lane l gets row l / 4, columns 2·(l % 4) and
// + 1; .trans loads the matrix column-major: row 2·(l % 4) + half, column l / 4.
DFLASH_MMA_FN constexpr FragCoord ldmatrix_coord(int lane, int half, bool trans) {
  return trans ? FragCoord{(lane & 3) * 2 + half, lane >> 2} : FragCoord{lane >> 2, (lane & 3) * 2 + half};
}

// ---- b32 registers of two bf16 ----
DFLASH_MMA_FN uint32_t pack_bf16x2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  const __nv_bfloat16_raw l = lo, h = hi;
  return uint32_t(l.x) | uint32_t(h.x) << 16;
}
// Rounds each float to the nearest bf16 (ties to even).
DFLASH_MMA_FN uint32_t pack_bf16x2_rn(float lo, float hi) {
  return pack_bf16x2(__float2bfloat16_rn(lo), __float2bfloat16_rn(hi));
}
DFLASH_MMA_FN __nv_bfloat16 bf16x2_lo(uint32_t r) {
  __nv_bfloat16_raw v;
  v.x = static_cast<unsigned short>(r & 0xffffu);
  return __nv_bfloat16(v);
}
DFLASH_MMA_FN __nv_bfloat16 bf16x2_hi(uint32_t r) {
  __nv_bfloat16_raw v;
  v.x = static_cast<unsigned short>(r >> 16);
  return __nv_bfloat16(v);
}

}  // namespace dflash::kernels::cuda

#if defined(DFLASH_CUDA_EMULATED)
// ---- the emulated GPU: each call passes its call site on, for the messages of a misuse ----
#include <source_location>

#include "kernels/cuda/emu/warp_mma.h"

namespace dflash::kernels::cuda {

inline void mma_m16n8k16_bf16(MmaFragC& d, const MmaFragA& a, const MmaFragB& b, const MmaFragC& c,
                              const std::source_location& at = std::source_location::current()) {
  ::dflash::emu::mma_m16n8k16_bf16(at.file_name(), int(at.line()), d.reg, a.reg, b.reg, c.reg);
}

inline void ldmatrix_x1(uint32_t (&r)[1], const void* row,
                        const std::source_location& at = std::source_location::current()) {
  ::dflash::emu::ldmatrix_m8n8_b16(at.file_name(), int(at.line()), 1, false, r, row);
}
inline void ldmatrix_x2(uint32_t (&r)[2], const void* row,
                        const std::source_location& at = std::source_location::current()) {
  ::dflash::emu::ldmatrix_m8n8_b16(at.file_name(), int(at.line()), 2, false, r, row);
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row,
                        const std::source_location& at = std::source_location::current()) {
  ::dflash::emu::ldmatrix_m8n8_b16(at.file_name(), int(at.line()), 4, false, r, row);
}
inline void ldmatrix_x1_trans(uint32_t (&r)[1], const void* row,
                              const std::source_location& at = std::source_location::current()) {
  ::dflash::emu::ldmatrix_m8n8_b16(at.file_name(), int(at.line()), 1, true, r, row);
}
inline void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row,
                              const std::source_location& at = std::source_location::current()) {
  ::dflash::emu::ldmatrix_m8n8_b16(at.file_name(), int(at.line()), 2, true, r, row);
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row,
                              const std::source_location& at = std::source_location::current()) {
  ::dflash::emu::ldmatrix_m8n8_b16(at.file_name(), int(at.line()), 4, true, r, row);
}

template <int Bytes>
inline void cp_async_ca(void* smem_dst, const void* gmem_src,
                        const std::source_location& at = std::source_location::current()) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  ::dflash::emu::cp_async(at.file_name(), int(at.line()), false, Bytes, smem_dst, gmem_src);
}
inline void cp_async_cg(void* smem_dst, const void* gmem_src,
                        const std::source_location& at = std::source_location::current()) {
  ::dflash::emu::cp_async(at.file_name(), int(at.line()), true, 16, smem_dst, gmem_src);
}
inline void cp_async_commit_group(const std::source_location& at = std::source_location::current()) {
  ::dflash::emu::cp_async_commit_group(at.file_name(), int(at.line()));
}
template <int N>
inline void cp_async_wait_group(const std::source_location& at = std::source_location::current()) {
  static_assert(N >= 0, "cp.async.wait_group N: N counts groups left pending");
  ::dflash::emu::cp_async_wait_group(at.file_name(), int(at.line()), N);
}
inline void cp_async_wait_all(const std::source_location& at = std::source_location::current()) {
  ::dflash::emu::cp_async_wait_all(at.file_name(), int(at.line()));
}

}  // namespace dflash::kernels::cuda

#elif defined(__CUDACC__)
// ---- nvcc: one PTX instruction each (PTX ISA: mma, ldmatrix, cp.async, cp.async.commit_group,
// cp.async.wait_group / cp.async.wait_all) ----
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "kernels/cuda/mma.cuh: bf16 mma.sync m16n8k16 and cp.async need sm_80 or newer"
#endif

namespace dflash::kernels::cuda {

namespace mma_detail {
// The .shared window address of a generic pointer into shared memory (the operand ldmatrix and cp.async take).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
}  // namespace mma_detail

__device__ __forceinline__ void mma_m16n8k16_bf16(MmaFragC& d, const MmaFragA& a, const MmaFragB& b,
                                                  const MmaFragC& c) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d.reg[0]), "=f"(d.reg[1]), "=f"(d.reg[2]), "=f"(d.reg[3])
      : "r"(a.reg[0]), "r"(a.reg[1]), "r"(a.reg[2]), "r"(a.reg[3]), "r"(b.reg[0]), "r"(b.reg[1]), "f"(c.reg[0]),
        "f"(c.reg[1]), "f"(c.reg[2]), "f"(c.reg[3]));
}

// "memory": the compiler must not move shared-memory stores of this thread across the load.
__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(mma_detail::shared_address(row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(mma_detail::shared_address(row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(mma_detail::shared_address(row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&r)[1], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(mma_detail::shared_address(row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(mma_detail::shared_address(row))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(mma_detail::shared_address(row))
               : "memory");
}

template <int Bytes>
__device__ __forceinline__ void cp_async_ca(void* smem_dst, const void* gmem_src) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(mma_detail::shared_address(smem_dst)),
               "l"(__cvta_generic_to_global(gmem_src)), "n"(Bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_cg(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(mma_detail::shared_address(smem_dst)),
               "l"(__cvta_generic_to_global(gmem_src))
               : "memory");
}
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// "memory": shared-memory reads after the wait must not be hoisted above it.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  static_assert(N >= 0, "cp.async.wait_group N: N counts groups left pending");
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace dflash::kernels::cuda

#endif
