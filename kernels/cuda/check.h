#pragma once
// Error checks of the CUDA backend. A failed CUDA or cuBLASLt call, or a failed kernel launch, becomes a
// dflash::Error thrown from host code with the file:line of the call and the library's own error string.
// Device code never throws: kernels validate nothing (callers do); a launch's configuration is checked by
// DFLASH_LAUNCH (kernel_launch.cuh) right after it, through cudaGetLastError().
#include <cublasLt.h>
#include <cuda_runtime.h>

namespace dflash::kernels::cuda {

// Throws dflash::Error: "<what> failed at file:line: <error>" (defined in context.cpp, outside nvcc's sight).
[[noreturn]] void cuda_fail(const char* what, const char* file, int line, const char* error);

}  // namespace dflash::kernels::cuda

#define DFLASH_CUDA_CHECK(expr)                                                                \
  do {                                                                                         \
    const cudaError_t dflash_rc_ = (expr);                                                     \
    if (dflash_rc_ != cudaSuccess)                                                             \
      ::dflash::kernels::cuda::cuda_fail(#expr, __FILE__, __LINE__, cudaGetErrorString(dflash_rc_)); \
  } while (0)

#define DFLASH_CUBLAS_CHECK(expr)                                                                   \
  do {                                                                                              \
    const cublasStatus_t dflash_st_ = (expr);                                                       \
    if (dflash_st_ != CUBLAS_STATUS_SUCCESS)                                                        \
      ::dflash::kernels::cuda::cuda_fail(#expr, __FILE__, __LINE__, cublasLtGetStatusString(dflash_st_)); \
  } while (0)
