#include "kernels/cuda/context.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "kernels/backend.h"
#include "kernels/cuda/check.h"
#include "lib/core/error.h"

namespace dflash::kernels::cuda {

void cuda_fail(const char* what, const char* file, int line, const char* error) {
  throw Error(fmt::format("CUDA: {} failed at {}:{}: {}", what, file, line, error));
}

namespace {
// Makes `device` current before the workspace arena allocates on it (a member initialiser runs before the body).
int select_device(int device) {
  DFLASH_CUDA_CHECK(cudaSetDevice(device));
  return device;
}
}  // namespace

CudaContext::CudaContext(int device, size_t workspace_bytes)
    : workspace_((select_device(device), MemoryKind::device), workspace_bytes, "CUDA kernel workspace") {
  exec_.memory = MemoryKind::device;
  exec_.device = device;
  exec_.workspace = &workspace_;
  cudaStream_t stream = nullptr;
  DFLASH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  exec_.stream = stream;
  cublasLtHandle_t lt = nullptr;
  const cublasStatus_t st = cublasLtCreate(&lt);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    cuda_fail("cublasLtCreate", __FILE__, __LINE__, cublasLtGetStatusString(st));
  }
  exec_.blaslt = lt;
}

CudaContext::~CudaContext() {
  // No throwing from a destructor: errors here (a dead context at exit) have nowhere useful to go.
  if (exec_.stream) cudaStreamSynchronize(static_cast<cudaStream_t>(exec_.stream));
  if (exec_.blaslt) cublasLtDestroy(static_cast<cublasLtHandle_t>(exec_.blaslt));
  if (exec_.stream) cudaStreamDestroy(static_cast<cudaStream_t>(exec_.stream));
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error so later calls start clean
    return 0;
  }
  return n;
}

}  // namespace dflash::kernels::cuda

namespace dflash::kernels {
bool cuda_available() { return cuda::cuda_device_count() > 0; }

std::string cuda_device_name() {
  int dev = 0;
  cudaDeviceProp p{};
  if (cuda::cuda_device_count() == 0 || cudaGetDevice(&dev) != cudaSuccess ||
      cudaGetDeviceProperties(&p, dev) != cudaSuccess)
    return {};
  return p.name;
}

int bind_cuda_device(int node_local_rank) {
  const int n = cuda::cuda_device_count();
  DFLASH_USER_CHECK(n > 0, "the CUDA device was asked for (run.device: cuda, --device cuda), but no CUDA device is visible "
                    "(cudaGetDeviceCount found none); check "
                           "nvidia-smi and CUDA_VISIBLE_DEVICES, or run on the CPU (run.device: cpu, --device cpu)");
  const int device = node_local_rank % n;
  DFLASH_CUDA_CHECK(cudaSetDevice(device));
  return device;
}
}  // namespace dflash::kernels
