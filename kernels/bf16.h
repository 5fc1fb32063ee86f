#pragma once
// bf16 as the models see it: 16 bits of storage (the top half of an IEEE binary32, "bfloat16"), bit for bit the
// layout of CUDA's __nv_bfloat16, with no arithmetic. lib/model and lib/train instantiate their templates over it
// and never include a CUDA header; only kernels/cuda computes with it (reinterpreting the pointers as
// __nv_bfloat16, backend_cuda.cpp). The CPU backend has no bf16 path (make_backend says so).
#include <cstdint>
#include <cstring>

namespace dflash::kernels {

struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  // Round to nearest even, as CUDA's host __float2bfloat16 does (a NaN becomes the canonical 0x7fff).
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = 0x7fff;
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = uint16_t(u >> 16);
  }
  // Exact: every bf16 is a binary32.
  explicit operator float() const {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2, "bf16 is two bytes, laid out as __nv_bfloat16");

}  // namespace dflash::kernels
