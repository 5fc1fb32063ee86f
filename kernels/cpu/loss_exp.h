#pragma once
// exp for the vocab loss's softmax loops, which run it C·V times per chunk: glibc's expf is a scalar call that
// blocks vectorisation and cost as much as a third of the GEMMs at H = 2048. The float version is the Cephes
// polynomial (range reduction by ln 2 in two parts, degree-6 polynomial, exponent by bit arithmetic), written so
// that `#pragma omp simd` loops vectorise it: relative error ≤ 2 ulp on [−87.3, 88.3], 0 below, clamped above.
// The double version is std::exp (the double path is for tests, where accuracy matters more than speed).
#include <bit>
#include <cmath>
#include <cstdint>

namespace dflash::cpu {

inline float loss_exp(float x) {
  // quiet comparisons (isgreater/isless): they cannot trap, so GCC if-converts them without -fno-trapping-math
  const float xc = std::isgreater(x, 88.3f) ? 88.3f : (std::isless(x, -87.3f) ? -87.3f : x);
  // n = round(x / ln 2) by the 1.5·2^23 trick: the low mantissa bits of t hold n.
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // x − n ln2, ln2 split for exactness
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r2 + r + 1.0f;
  const float scale = std::bit_cast<float>((ni + 127) << 23);
  const float e = y * scale;  // computed unconditionally so that the select below vectorises
  return std::isless(x, -87.3f) ? 0.0f : e;
}

inline double loss_exp(double x) { return std::exp(x); }

}  // namespace dflash::cpu
