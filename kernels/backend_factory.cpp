// make_backend: which backend computes in which type. The CPU computes in float or double (double: the reference
// the gradient checks use), CUDA in float or bf16; every other pair is a user error that names the fix. The pairs
// are written here once (backend_refusal); the config's check and the programs' options ask it.
#include <type_traits>

#include "kernels/backend.h"
#include "lib/core/error.h"

namespace dflash::kernels {

std::string backend_refusal(Device device, Precision precision) {
  if (device == Device::cpu && precision == Precision::bf16)
    return "precision bf16 needs the CUDA backend (run.device: cuda); the CPU backend computes in fp32 (or fp64 for "
           "reference checks)";
  if (device == Device::cuda && precision == Precision::fp64)
    return "precision fp64 runs on the CPU backend only (a reference for tests); ask for fp32 or bf16 on CUDA";
  return "";
}

Precision default_precision(Device device) { return device == Device::cuda ? Precision::bf16 : Precision::fp32; }

template <typename T>
std::unique_ptr<Backend<T>> make_backend(Device device, const CpuBackendOptions& cpu_options) {
  const std::string refusal = backend_refusal(device, precision_of<T>());
  DFLASH_USER_CHECK(refusal.empty(), "{}", refusal);
  if (device == Device::cpu) {
    if constexpr (!std::is_same_v<T, bf16>) return make_cpu_backend<T>(cpu_options);
  } else {
    if constexpr (!std::is_same_v<T, double>) return make_cuda_backend<T>();
  }
  DFLASH_FAIL("make_backend: backend_refusal let through a pair no backend has");
}

template std::unique_ptr<Backend<float>> make_backend<float>(Device, const CpuBackendOptions&);
template std::unique_ptr<Backend<double>> make_backend<double>(Device, const CpuBackendOptions&);
template std::unique_ptr<Backend<bf16>> make_backend<bf16>(Device, const CpuBackendOptions&);

}  // namespace dflash::kernels
