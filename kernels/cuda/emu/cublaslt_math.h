#pragma once
// The arithmetic of the emulated cuBLASLt (cublaslt.cpp): one GEMM over strided host-addressable matrices, as
// cublasLtMatmul computes it with CUBLAS_COMPUTE_32F and a CUDA_R_32F scale type. Pure: no runtime, no
// descriptors, so the tests can also call it directly.
//   D[m, n] = alpha · A[m, k] · B[k, n] + beta · C[m, n]
// Every D element is one fp32 sum over k in ascending order (inputs widened to fp32), scaled in fp32, then
// rounded once to D's type (bf16: nearest, ties to even). beta == 0: C is not read, so NaN in C cannot leak.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dflash::emu::lt {

enum class Element : uint8_t { f32, bf16 };

inline size_t element_bytes(Element e) { return e == Element::f32 ? 4 : 2; }

// Element (r, c) at data[r·row_stride + c·col_stride] (in elements): column-major is (1, ld), row-major (ld, 1),
// a transpose swaps the two.
template <class Pointer>
struct Strided {
  Pointer data = nullptr;
  Element type = Element::f32;
  int64_t row_stride = 1;
  int64_t col_stride = 1;
};
using ConstMatrix = Strided<const void*>;
using Matrix = Strided<void*>;

inline float load(const ConstMatrix& x, int64_t r, int64_t c) {
  const int64_t at = r * x.row_stride + c * x.col_stride;
  if (x.type == Element::f32) return static_cast<const float*>(x.data)[at];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(x.data)[at]);
}

inline void store(const Matrix& x, int64_t r, int64_t c, float v) {
  const int64_t at = r * x.row_stride + c * x.col_stride;
  if (x.type == Element::f32)
    static_cast<float*>(x.data)[at] = v;
  else
    static_cast<__nv_bfloat16*>(x.data)[at] = __float2bfloat16_rn(v);
}

// D columns per pass: kPanel accumulators and a k × kPanel panel of B stay in cache while A's rows stream by.
inline constexpr int64_t kPanel = 64;

// D[m, n] = alpha · a[m, k] · b[k, n] + beta · c[m, n] (c unused when beta == 0). d may be c (in place).
inline void gemm(int64_t m, int64_t n, int64_t k, float alpha, const ConstMatrix& a, const ConstMatrix& b, float beta,
                 const ConstMatrix& c, const Matrix& d) {
  if (m <= 0 || n <= 0) return;
  // op(A) as fp32 rows [m, k] and op(B) as fp32 panels [n / kPanel][k, kPanel]: the inner loop is contiguous.
  std::vector<float> a_rows(size_t(m) * size_t(k));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) a_rows[size_t(i * k + p)] = load(a, i, p);
  std::vector<float> b_panels(size_t(k) * size_t(n));
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const int64_t w = std::min(kPanel, n - j0);
    float* panel = b_panels.data() + j0 * k;
    for (int64_t p = 0; p < k; ++p)
      for (int64_t jj = 0; jj < w; ++jj) panel[p * w + jj] = load(b, p, j0 + jj);
  }
  const bool read_c = beta != 0.0f;
  float acc[kPanel];
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const int64_t w = std::min(kPanel, n - j0);
    const float* panel = b_panels.data() + j0 * k;
    for (int64_t i = 0; i < m; ++i) {
      std::fill(acc, acc + w, 0.0f);
      const float* a_row = a_rows.data() + i * k;
      for (int64_t p = 0; p < k; ++p) {  // ascending k for every element: the documented fp32 accumulation order
        const float av = a_row[p];
        const float* b_row = panel + p * w;
        for (int64_t jj = 0; jj < w; ++jj) acc[jj] += av * b_row[jj];
      }
      for (int64_t jj = 0; jj < w; ++jj) {
        const float scaled = alpha * acc[jj];
        store(d, i, j0 + jj, read_c ? scaled + beta * load(c, i, j0 + jj) : scaled);
      }
    }
  }
}

}  // namespace dflash::emu::lt
