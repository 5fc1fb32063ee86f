#pragma once
// Row-major GEMMs through cuBLASLt. cuBLASLt is column-major; a row-major X[r, c] with row stride ld is the
// column-major Xᵀ[c, r] with the same ld, so C = op(A)·op(B) (row-major) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ
// (column-major): the operands swap places and keep their transpose flags, M and N swap.
// Compute is CUBLAS_COMPUTE_32F always: fp32 inputs stay fp32 (no TF32: the twin tests compare with the CPU at
// fp32 ulp), bf16 inputs accumulate in fp32 and write bf16 or fp32. The heuristic's algorithm is cached per
// (shape, transposes, leading dimensions, types, pointer alignment); the workspace comes from the ExecContext's
// arena when it has room, else from a buffer this object owns. A layout the heuristic has no algorithm for (odd
// leading dimensions) runs on a CUDA-core kernel instead, with a warning on stderr once per layout.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "lib/core/buffer.h"
#include "lib/core/exec_context.h"

namespace dflash::kernels::cuda {

enum class DType : int { f32 = 0, bf16 = 1 };

class LtGemm {
 public:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;

  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // C[M, N] = alpha · op(A) op(B) + beta · C, row-major, op(X) = Xᵀ when trans_x; A, B of type ab, C of type c.
  // beta = 0: C is not read. K = 0: C = beta · C. Throws dflash::Error when cuBLASLt fails.
  void run(ExecContext& ctx, DType ab, DType c, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
           const void* a, int lda, const void* b, int ldb, float beta, void* cmat, int ldc);

  size_t cached_algorithms() const;
  // Layouts cuBLASLt had no algorithm for, which run on the CUDA-core fallback (kernels/cuda/gemm_fallback.cu).
  size_t fallback_layouts() const;

 private:
  struct Algo;
  using Key = std::tuple<int, int, int, int, int, int, int, int, int, int, int, int, int>;
  std::map<Key, Algo*> cache_;
  mutable std::mutex mutex_;
  Buffer own_workspace_;
};

}  // namespace dflash::kernels::cuda
