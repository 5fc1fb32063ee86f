#pragma once
// 16-byte loads and stores for the streaming kernels (elementwise.cu, vocab_loss_rows.cu): a thread moves
// kPack<T> elements of T (8 bf16 or 4 float) per access where every pointer involved is aligned to its pack, and
// the scalar loop takes the tail (and everything when a pointer is not aligned). The per-element arithmetic is the
// scalar loop's, so the results are the same bits.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace dflash::kernels::cuda {

// Elements of T in 16 bytes.
template <typename T>
constexpr int kPack = int(16 / sizeof(T));

// W consecutive elements of U, aligned to their size (16 bytes for T; 32 for the float side of an 8-wide bf16
// conversion, which the compiler moves as two 16-byte accesses).
template <typename U, int W>
struct alignas(sizeof(U) * W) Pack {
  U v[W];
};

template <typename U, int W>
__device__ __forceinline__ bool pack_aligned(const U* p) {
  return (reinterpret_cast<uintptr_t>(p) % sizeof(Pack<U, W>)) == 0;
}
// Pack j of p, i.e. elements [j·W, j·W + W).
template <int W, typename U>
__device__ __forceinline__ Pack<U, W> load_pack(const U* p, size_t j) {
  return reinterpret_cast<const Pack<U, W>*>(p)[j];
}
template <int W, typename U>
__device__ __forceinline__ void store_pack(U* p, size_t j, const Pack<U, W>& v) {
  reinterpret_cast<Pack<U, W>*>(p)[j] = v;
}

}  // namespace dflash::kernels::cuda
