#pragma once
// Device code on the emulated GPU: force-included (g++ -include) into every kernels/cuda/*.cu file that a
// -DDFLASH_CUDA=EMULATE build compiles as host C++. It turns the CUDA C++ dialect the kernels use into calls of
// the emulation (kernels/cuda/emu/block.cpp runs each thread of a block as a fiber):
//   __global__ / __device__ / __host__ / __forceinline__ / __launch_bounds__   plain C++ functions
//   threadIdx, blockIdx, blockDim, gridDim, warpSize                           the running fiber's
//   __syncthreads, __syncwarp, __shfl*_sync, __ballot_sync, __any_sync, __all_sync, __activemask
//                                                                              rendezvous of the fibers named
//   atomicAdd / Max / Min / Exch / CAS                                         plain read-modify-write (one OS
//                                                                              thread runs a block's fibers)
//   __int_as_float & co, min / max                                             host equivalents
// Shared memory follows the project's convention (kernels/cuda/kernel_launch.cuh): DFLASH_SHARED(type, name, dims)
// and DFLASH_DYNAMIC_SHARED(type, name) instead of __shared__, which is made an error here.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Kernels declare shared memory with DFLASH_SHARED / DFLASH_DYNAMIC_SHARED (kernel_launch.cuh).
#define __shared__ __shared___is_not_emulated_use_DFLASH_SHARED

namespace dflash::emu {

constexpr int kWarpSize = 32;

// What one emulated thread (fiber) knows about itself; block.cpp sets tls_thread before resuming a fiber.
struct ThreadState {
  uint3 thread_idx{};
  uint3 block_idx{};
  dim3 block_dim{};
  dim3 grid_dim{};
  int linear_tid = 0;  // x + y·Dx + z·Dx·Dy
  int lane = 0;        // linear_tid % 32
  int warp = 0;        // linear_tid / 32
  void* slots[4] = {};  // per-thread state of extensions (cp.async groups, ...), null at thread start
};
extern thread_local ThreadState* tls_thread;

// __syncthreads at file:line: every live thread of the block must reach a barrier of the same site.
void syncthreads(const char* file, int line);

// A warp-collective operation: every lane in `mask` calls it (the calling lane must be in the mask); once all of
// them have arrived at a collective of the same `what` and mask, `combine` runs once with the lanes' inputs
// (ins[lane], null for lanes outside the mask) and fills their outputs (outs[lane]); then every lane goes on.
// A lane of the mask that exits, waits at a block barrier or at another collective instead is an error naming
// the kernel, block, warp, lanes and lines. __syncwarp, the shuffles, votes and the mma wrappers are built on it.
using WarpCombine = void (*)(const void* const* ins, void* const* outs, unsigned mask, void* ctx);
void warp_collective(unsigned mask, const char* what, const char* file, int line, const void* in, void* out,
                     WarpCombine combine, void* ctx);

// The storage of one static shared-memory declaration (`key`: the address of a static tag at that declaration),
// per block: allocated on first use in the block, filled with 0xFF bytes (a NaN pattern) at block start.
void* block_shared(const void* key, size_t bytes, size_t align);
// The launch's dynamic shared memory: its bytes end at a guard page (an access past the end faults with a message
// naming the kernel, block and thread), 0xFF-filled at block start.
void* dynamic_shared();

// "kernel K (launched at file:line, grid …, block …), block (x,y,z)" of the block being run, for messages of
// extensions (warp_mma.cpp); "" outside a kernel.
std::string running_kernel();

// Queues a kernel launch (kernel_launch.cuh's DFLASH_LAUNCH): checks the configuration against the emulated
// architecture (DFLASH_EMU_ARCH = sm_90 | sm_100 | sm_120) and the kernel's record (registers, static shared
// memory, __launch_bounds__ as nvcc compiled it: kernels/cuda/records/kernel_records.h) and returns the launch
// error, as <<<>>> does through cudaGetLastError. `func` identifies the kernel for cudaFuncSetAttribute, `id` is
// its name in the records; `body` runs the kernel in one thread.
cudaError_t launch(const char* kernel, const char* file, int line, const void* func, const char* id, dim3 grid,
                   dim3 block, size_t dynamic_smem, cudaStream_t stream, std::function<void()> body);
// Tells the runtime the records name of a kernel (cudaFuncGetAttributes / cudaFuncSetAttribute look it up).
void register_kernel(const void* func, const char* id);

// ---- the CUDA builtins (the macros below pass the call site first) ----
void syncwarp_at(const char* file, int line, unsigned mask = 0xffffffffu);
unsigned ballot_at(const char* file, int line, const char* what, unsigned mask, bool pred);
unsigned activemask();  // the lanes of the warp that have not exited

// mode: 0 idx (src lane), 1 xor (lane mask), 2 up, 3 down (delta); width: a power of two ≤ 32 (warp segments)
uint64_t shfl_bits(const char* file, int line, const char* what, int mode, unsigned mask, uint64_t bits, int arg,
                   int width);
template <typename T>
inline T shfl_at(const char* file, int line, const char* what, int mode, unsigned mask, T v, int arg,
                 int width = kWarpSize) {
  static_assert(sizeof(T) <= 8, "__shfl of a value wider than 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = shfl_bits(file, line, what, mode, mask, bits, arg, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// Atomics: the fibers of a block run one at a time on one OS thread, and blocks one at a time: a plain
// read-modify-write is atomic here.
template <typename T, typename U>
inline T atomic_add(T* p, U v) {
  const T old = *p;
  *p = T(old + v);
  return old;
}
template <typename T, typename U>
inline T atomic_max(T* p, U v) {
  const T old = *p;
  *p = old < T(v) ? T(v) : old;
  return old;
}
template <typename T, typename U>
inline T atomic_min(T* p, U v) {
  const T old = *p;
  *p = T(v) < old ? T(v) : old;
  return old;
}
template <typename T, typename U>
inline T atomic_exch(T* p, U v) {
  const T old = *p;
  *p = T(v);
  return old;
}
template <typename T, typename U, typename V>
inline T atomic_cas(T* p, U compare, V v) {
  const T old = *p;
  if (old == T(compare)) *p = T(v);
  return old;
}

inline float int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
inline int float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

}  // namespace dflash::emu

#define threadIdx (::dflash::emu::tls_thread->thread_idx)
#define blockIdx (::dflash::emu::tls_thread->block_idx)
#define blockDim (::dflash::emu::tls_thread->block_dim)
#define gridDim (::dflash::emu::tls_thread->grid_dim)
#define warpSize (::dflash::emu::kWarpSize)

#define __syncthreads() ::dflash::emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::dflash::emu::syncwarp_at(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(...) ::dflash::emu::shfl_at(__FILE__, __LINE__, "__shfl_sync", 0, __VA_ARGS__)
#define __shfl_xor_sync(...) ::dflash::emu::shfl_at(__FILE__, __LINE__, "__shfl_xor_sync", 1, __VA_ARGS__)
#define __shfl_up_sync(...) ::dflash::emu::shfl_at(__FILE__, __LINE__, "__shfl_up_sync", 2, __VA_ARGS__)
#define __shfl_down_sync(...) ::dflash::emu::shfl_at(__FILE__, __LINE__, "__shfl_down_sync", 3, __VA_ARGS__)
#define __ballot_sync(mask, pred) ::dflash::emu::ballot_at(__FILE__, __LINE__, "__ballot_sync", mask, pred)
#define __any_sync(mask, pred) (::dflash::emu::ballot_at(__FILE__, __LINE__, "__any_sync", mask, pred) != 0u)
#define __all_sync(mask, pred) \
  (::dflash::emu::ballot_at(__FILE__, __LINE__, "__all_sync", mask, pred) == (mask))
#define __activemask() ::dflash::emu::activemask()
#define __threadfence() ((void)0)
#define __threadfence_block() ((void)0)

#define atomicAdd(p, v) ::dflash::emu::atomic_add(p, v)
#define atomicMax(p, v) ::dflash::emu::atomic_max(p, v)
#define atomicMin(p, v) ::dflash::emu::atomic_min(p, v)
#define atomicExch(p, v) ::dflash::emu::atomic_exch(p, v)
#define atomicCAS(p, c, v) ::dflash::emu::atomic_cas(p, c, v)

#define __int_as_float(i) ::dflash::emu::int_as_float(i)
#define __float_as_int(f) ::dflash::emu::float_as_int(f)
#define __expf(x) ::expf(x)
#define __logf(x) ::logf(x)
#define __fdividef(a, b) ((a) / (b))

using std::max;
using std::min;
