#pragma once
// exp for the vocab loss's softmax loops, which run it C·V times per chunk. The float version is the Cephes
// polynomial (range reduction by ln 2 in two parts, degree-6 polynomial, exponent by bit arithmetic): relative error
// ≤ 2 ulp on [−87.3, 88.3], 0 below, clamped above. It is one function for the CPU and the CUDA row passes, so the
// two softmaxes differ only by nvcc's fused multiply-adds (g++ on x86-64 does not fuse). On the CPU glibc's expf is
// a scalar call that blocks vectorisation and cost as much as a third of the GEMMs at H = 2048; this one
// vectorises under `#pragma omp simd`. The double version is exp (the double path is for tests, where accuracy
// matters more than speed).
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>

#include "kernels/math/hd.h"

namespace dflash::kernels::math {

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

// x > 88.3, x < −87.3 as quiet comparisons on the host (std::isgreater / isless cannot trap, so GCC if-converts
// them without -fno-trapping-math and the loops vectorise); plain comparisons on the device. Both are false for NaN,
// which therefore reaches the polynomial and comes out NaN (a NaN logit must poison the sums).
DFLASH_HD inline bool exp_above(float x) {
#if defined(__CUDA_ARCH__)
  return x > 88.3f;
#else
  return std::isgreater(x, 88.3f);
#endif
}
DFLASH_HD inline bool exp_below(float x) {
#if defined(__CUDA_ARCH__)
  return x < -87.3f;
#else
  return std::isless(x, -87.3f);
#endif
}

DFLASH_HD inline float loss_exp(float x) {
  const float xc = exp_above(x) ? 88.3f : (exp_below(x) ? -87.3f : x);
  // n = round(x / ln 2) by the 1.5·2^23 trick: the low mantissa bits of t hold n.
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const int32_t ni = bits_from_float(t) - 0x4B400000;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // x − n ln2, ln2 split for exactness
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r2 + r + 1.0f;
  const float e = y * float_from_bits((ni + 127) << 23);  // computed unconditionally so that the select vectorises
  return exp_below(x) ? 0.0f : e;
}

DFLASH_HD inline double loss_exp(double x) { return exp(x); }

}  // namespace dflash::kernels::math
