#pragma once
// How the kernels of kernels/cuda are launched and declare shared memory, so that the same sources build with nvcc
// for a GPU and with the host compiler for the emulated GPU (-DDFLASH_CUDA=EMULATE, kernels/cuda/emu/README.md):
//
//   DFLASH_LAUNCH(grid, block, dynamic_smem, stream, kernel)(args...);
//       kernel<<<grid, block, dynamic_smem, stream>>>(args...), then the launch checked: a bad configuration
//       throws dflash::Error naming the kernel and the launch's file:line. `kernel` may be a template-id with
//       commas (it is the macro's last argument).
//   DFLASH_SHARED(type, name, dims);        __shared__ type name dims;          e.g. DFLASH_SHARED(float, k_s, [256]);
//   DFLASH_SHARED_ALIGNED(align, type, name, dims);   __shared__ alignas(align) type name dims;  (raw bytes for
//                                           types with constructors, which __shared__ variables cannot run)
//   DFLASH_DYNAMIC_SHARED(type, name);      extern __shared__ type name[];
//
// On the emulated GPU the launch goes to dflash::emu::launch (each thread a fiber), DFLASH_SHARED to the block's
// shared memory (0xFF-filled at block start: a read before any write is a NaN), and the dynamic shared memory
// ends at a guard page.
#include <cuda_runtime.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/cuda/check.h"
#if defined(DFLASH_CUDA_EMULATED)
#include "kernels/cuda/records/kernel_records.h"
#endif

namespace dflash::kernels::cuda {

template <typename... P>
struct KernelLaunch {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  const char* name;
  const char* file;
  int line;
  const char* id;  // the emulated GPU's key of the kernel in the kernel records (null on a real GPU)

  template <typename... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "DFLASH_LAUNCH: the argument count differs from the kernel's");
#if defined(DFLASH_CUDA_EMULATED)
    std::tuple<std::decay_t<P>...> values(std::forward<A>(args)...);  // by value, as a real launch copies them
    auto* k = kernel;
    const cudaError_t rc = ::dflash::emu::launch(name, file, line, reinterpret_cast<const void*>(kernel), id, grid,
                                                 block, smem, stream, [k, values] { std::apply(k, values); });
    if (rc != cudaSuccess) cuda_fail(name, file, line, cudaGetErrorString(rc));
#else
    kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
    const cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) cuda_fail(name, file, line, cudaGetErrorString(rc));
#endif
  }
};

template <typename... P>
KernelLaunch<P...> make_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               const char* name, const char* file, int line, const char* id) {
  return KernelLaunch<P...>{kernel, grid, block, smem, stream, name, file, line, id};
}

// The emulated GPU's name of kernel K (its key in the kernel records); null on a real GPU, which knows its kernels.
template <auto K>
const char* kernel_id() {
#if defined(DFLASH_CUDA_EMULATED)
  static const std::string id = [] {
    std::string n = ::dflash_kernel_name::of<K>();
    ::dflash::emu::register_kernel(reinterpret_cast<const void*>(K), n.c_str());
    return n;
  }();
  return id.c_str();
#else
  return nullptr;
#endif
}

// Kernel K's attributes on the current device (cudaFuncGetAttributes): numRegs, sharedSizeBytes (static),
// localSizeBytes, maxThreadsPerBlock (its __launch_bounds__ and registers), maxDynamicSharedSizeBytes. Throws a
// dflash::Error naming `what` when the device has no code for it.
template <auto K>
cudaFuncAttributes kernel_attributes(const char* what) {
  kernel_id<K>();
  cudaFuncAttributes a{};
  const cudaError_t rc = cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(K));
  if (rc != cudaSuccess) cuda_fail(what, __FILE__, __LINE__, cudaGetErrorString(rc));
  return a;
}

// Lets K launch with `bytes` of dynamic shared memory (cudaFuncAttributeMaxDynamicSharedMemorySize) on the current
// device; throws a dflash::Error naming `what`, the bytes and the device's limit when it cannot.
template <auto K>
void allow_dynamic_smem(size_t bytes, const char* what) {
  kernel_id<K>();
  const cudaError_t rc =
      cudaFuncSetAttribute(reinterpret_cast<const void*>(K), cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (rc != cudaSuccess) {
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    const std::string why = std::to_string(bytes) + " bytes of dynamic shared memory asked; this device allows " +
                            std::to_string(optin) + " a block (static included): " + cudaGetErrorString(rc);
    cuda_fail(what, __FILE__, __LINE__, why.c_str());
  }
}

}  // namespace dflash::kernels::cuda

#define DFLASH_LAUNCH(grid, block, smem, stream, ...)                                                        \
  ::dflash::kernels::cuda::make_launch(__VA_ARGS__, dim3(grid), dim3(block), size_t(smem), stream,           \
                                       "launch of " #__VA_ARGS__, __FILE__, __LINE__,                        \
                                       ::dflash::kernels::cuda::kernel_id<__VA_ARGS__>())

#if defined(DFLASH_CUDA_EMULATED)
#define DFLASH_SHARED_ALIGNED(align, type, name, dims)                                                        \
  static const char dflash_shared_tag_##name = 0;                                                            \
  type(&name) dims = *static_cast<type(*) dims>(                                                             \
      ::dflash::emu::block_shared(&dflash_shared_tag_##name, sizeof(type dims), align))
#define DFLASH_SHARED(type, name, dims) DFLASH_SHARED_ALIGNED(alignof(type), type, name, dims)
#define DFLASH_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::dflash::emu::dynamic_shared())
#else
#define DFLASH_SHARED(type, name, dims) __shared__ type name dims
#define DFLASH_SHARED_ALIGNED(align, type, name, dims) __shared__ alignas(align) type name dims
#define DFLASH_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
