#include "kernels/cuda/gemm_lt.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "lib/core/error.h"

namespace dflash::kernels::cuda {

struct LtGemm::Algo {
  cublasLtMatmulHeuristicResult_t result;
  bool fallback = false;  // cuBLASLt has no algorithm for this key: gemm_fallback.cu
};

namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

// Largest power of two ≤ 256 dividing the address: the alignment the chosen algorithm may assume.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

// RAII holders so that a throw in the middle releases every descriptor.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() { if (d) cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() { if (l) cublasLtMatrixLayoutDestroy(l); }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() { if (p) cublasLtMatmulPreferenceDestroy(p); }
};

}  // namespace

LtGemm::LtGemm() = default;

LtGemm::~LtGemm() {
  for (auto& [key, algo] : cache_) delete algo;
}

size_t LtGemm::cached_algorithms() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.size();
}

size_t LtGemm::fallback_layouts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& [key, algo] : cache_) n += algo->fallback;
  return n;
}

namespace {

void run_fallback(cudaStream_t st, DType ab, DType c, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  const void* a, int lda, const void* b, int ldb, float beta, void* cmat, int ldc) {
  if (ab == DType::f32)
    launch_gemm_fallback(st, trans_a, trans_b, M, N, K, alpha, static_cast<const float*>(a), lda,
                         static_cast<const float*>(b), ldb, beta, static_cast<float*>(cmat), ldc);
  else if (c == DType::bf16)
    launch_gemm_fallback(st, trans_a, trans_b, M, N, K, alpha, static_cast<const bf16*>(a), lda,
                         static_cast<const bf16*>(b), ldb, beta, static_cast<bf16*>(cmat), ldc);
  else
    launch_gemm_fallback(st, trans_a, trans_b, M, N, K, alpha, static_cast<const bf16*>(a), lda,
                         static_cast<const bf16*>(b), ldb, beta, static_cast<float*>(cmat), ldc);
}

}  // namespace

void LtGemm::run(ExecContext& ctx, DType ab, DType c, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                 const void* a, int lda, const void* b, int ldb, float beta, void* cmat, int ldc) {
  cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // no product: C = beta · C
    if (c == DType::bf16)
      launch_scale_matrix(stream, static_cast<bf16*>(cmat), M, N, ldc, beta);
    else
      launch_scale_matrix(stream, static_cast<float*>(cmat), M, N, ldc, beta);
    return;
  }
  DFLASH_CHECK(ctx.blaslt != nullptr, "CUDA GEMM: the ExecContext has no cuBLASLt handle (make it with CudaContext)");
  cublasLtHandle_t handle = static_cast<cublasLtHandle_t>(ctx.blaslt);

  // Column-major view: C'[N, M] = op'(B')[N, K] · op'(A')[K, M], where X' is the stored row-major X read
  // column-major. The stored B is [K, N] (no trans) or [N, K] (trans) row-major = [N, K] or [K, N] column-major.
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   // Lt's "A" = our B
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // Lt's "B" = our A
  const uint64_t first_rows = trans_b ? K : N, first_cols = trans_b ? N : K;
  const uint64_t second_rows = trans_a ? M : K, second_cols = trans_a ? K : M;

  MatmulDesc desc;
  DFLASH_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  DFLASH_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  DFLASH_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  Layout la, lb, lc;
  DFLASH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la.l, cuda_type(ab), first_rows, first_cols, ldb));
  DFLASH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb.l, cuda_type(ab), second_rows, second_cols, lda));
  DFLASH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc.l, cuda_type(c), uint64_t(N), uint64_t(M), ldc));

  // Workspace: the context's arena when it has room (scoped to this call; the stream orders reuse), else ours.
  void* workspace = nullptr;
  Arena* arena = ctx.workspace;
  const bool from_arena = arena && arena->kind() == MemoryKind::device &&
                          arena->capacity() - arena->used() >= Arena::footprint(kWorkspaceBytes);
  const Arena::Mark mark = from_arena ? arena->mark() : 0;
  if (from_arena) {
    workspace = arena->alloc_bytes(kWorkspaceBytes);
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!own_workspace_.data()) own_workspace_ = Buffer(MemoryKind::device, kWorkspaceBytes);
    workspace = own_workspace_.data();
  }
  struct Rewind {
    Arena* a;
    Arena::Mark m;
    ~Rewind() { if (a) a->rewind(m); }
  } rewind{from_arena ? arena : nullptr, mark};

  const uint32_t al_first = alignment_of(b), al_second = alignment_of(a), al_c = alignment_of(cmat);
  const Key key{M, N, K, int(trans_a), int(trans_b), lda, ldb, ldc, int(ab), int(c),
                int(al_first), int(al_second), int(al_c)};
  cublasLtMatmulHeuristicResult_t result{};
  bool cached = false, fallback = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      result = it->second->result;
      fallback = it->second->fallback;
      cached = true;
    }
  }
  if (!cached) {
    Preference pref;
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
    const uint64_t ws = kWorkspaceBytes;
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                             sizeof(ws)));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                             &al_first, sizeof(al_first)));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                             &al_second, sizeof(al_second)));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                             &al_c, sizeof(al_c)));
    DFLASH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                             &al_c, sizeof(al_c)));
    int found = 0;
    // No algorithm comes back as CUBLAS_STATUS_NOT_SUPPORTED or as zero results: both take the fallback kernel,
    // announced once per layout (it is correct but slow); any other status is an error.
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle, desc.d, la.l, lb.l, lc.l, lc.l, pref.p, 1, &result, &found);
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) DFLASH_CUBLAS_CHECK(st);
    fallback = st == CUBLAS_STATUS_NOT_SUPPORTED || found <= 0;
    if (fallback)
      std::fprintf(stderr,
                   "warning: cuBLASLt has no algorithm for C[%d, %d] = op(A)·op(B), K = %d, trans_a %d, trans_b %d, "
                   "lda %d, ldb %d, ldc %d, %s inputs, %s output: this GEMM runs on the CUDA-core fallback kernel "
                   "(kernels/cuda/gemm_fallback.cu; correct, slow)\n",
                   M, N, K, int(trans_a), int(trans_b), lda, ldb, ldc, ab == DType::bf16 ? "bf16" : "fp32",
                   c == DType::bf16 ? "bf16" : "fp32");
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = cache_[key];
    if (!slot) slot = new Algo{result, fallback};
  }
  if (fallback) return run_fallback(stream, ab, c, trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, cmat, ldc);
  DFLASH_CUBLAS_CHECK(cublasLtMatmul(handle, desc.d, &alpha, b, la.l, a, lb.l, &beta, cmat, lc.l, cmat, lc.l,
                                     &result.algo, workspace, result.workspaceSize, stream));
}

}  // namespace dflash::kernels::cuda
