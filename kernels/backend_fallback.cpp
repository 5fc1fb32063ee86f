// make_cuda_backend / cuda_available in a build without the CUDA backend (DFLASH_CUDA=OFF or no toolkit):
// asking for CUDA is a clear error that says how to get it. With CUDA, kernels/cuda/backend_cuda.cpp defines them.
#if !DFLASH_CUDA_BACKEND
#include "kernels/backend.h"
#include "lib/core/error.h"

namespace dflash::kernels {

template <typename T>
std::unique_ptr<Backend<T>> make_cuda_backend() {
  DFLASH_USER_FAIL("run.device: cuda, but this dflash_mpi was built without the CUDA backend; rebuild with the CUDA "
                   "toolkit installed (cmake -DDFLASH_CUDA=ON) or set run.device: cpu");
}
template std::unique_ptr<Backend<float>> make_cuda_backend<float>();
template std::unique_ptr<Backend<bf16>> make_cuda_backend<bf16>();

bool cuda_available() { return false; }
std::string cuda_device_name() { return {}; }

int bind_cuda_device(int) {
  DFLASH_USER_FAIL("run.device: cuda, but this dflash_mpi was built without the CUDA backend; rebuild with the CUDA "
                   "toolkit installed (cmake -DDFLASH_CUDA=ON) or set run.device: cpu");
}

}  // namespace dflash::kernels
#endif
