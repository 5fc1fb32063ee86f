// make_backend: which backend computes in which type. The CPU computes in float or double (double: the reference
// the gradient checks use), CUDA in float or bf16; every other pair is a user error that names the fix.
#include <type_traits>

#include "kernels/backend.h"
#include "lib/core/error.h"

namespace dflash::kernels {

template <typename T>
std::unique_ptr<Backend<T>> make_backend(Device device, const CpuBackendOptions& cpu_options) {
  if (device == Device::cpu) {
    if constexpr (std::is_same_v<T, bf16>) {
      DFLASH_USER_FAIL("precision bf16 needs the CUDA backend (run.device: cuda); the CPU backend computes in fp32 "
                       "(or fp64 for reference checks)");
    } else {
      return make_cpu_backend<T>(cpu_options);
    }
  }
  if constexpr (std::is_same_v<T, double>) {
    DFLASH_USER_FAIL("precision fp64 runs on the CPU backend only (a reference for tests); ask for fp32 or bf16 on "
                     "CUDA");
  } else {
    return make_cuda_backend<T>();
  }
}

template std::unique_ptr<Backend<float>> make_backend<float>(Device, const CpuBackendOptions&);
template std::unique_ptr<Backend<double>> make_backend<double>(Device, const CpuBackendOptions&);
template std::unique_ptr<Backend<bf16>> make_backend<bf16>(Device, const CpuBackendOptions&);

}  // namespace dflash::kernels
