#pragma once
// The GPU architectures the CUDA backend is built for, the per-block limits a kernel launch must respect, and the
// rule that decides whether a block fits (CUDA C++ Programming Guide, "Compute Capabilities": the technical
// specifications table; register allocation per warp in units of 256). One copy for three users: the emulated GPU
// (kernels/cuda/emu refuses what the real GPU refuses), the launchers (which variant fits the device) and --check
// (which kernel fits a named GPU before any step). No CUDA header: lib/ reads it in every build.
#include <cstddef>
#include <string>
#include <string_view>

namespace dflash::kernels {

struct GpuArch {
  int sm;                       // compute capability × 10: 90, 100, 120
  const char* name;             // "sm_90"
  const char* example;          // a GPU of this architecture, for messages
  int max_threads_per_block;    // 1024
  int max_threads_per_sm;       // 2048 (sm_90, sm_100), 1536 (sm_120)
  int max_blocks_per_sm;        // 32
  int regs_per_sm;              // 64 K 32-bit registers
  int regs_per_block;           // 64 K
  int max_regs_per_thread;      // 255
  int reg_alloc_unit;           // registers are allocated per warp in units of 256
  size_t static_smem_per_block;  // 48 KiB of __shared__ declarations
  size_t smem_per_block_optin;  // static + dynamic with cudaFuncAttributeMaxDynamicSharedMemorySize raised
  size_t smem_per_sm;           // the SM's shared memory (the L1 carve-out at its largest)
  size_t reserved_smem_per_block;  // 1 KiB the system reserves per resident block (counts for occupancy only)
};

inline constexpr GpuArch kGpuArchs[] = {
    {90, "sm_90", "H100/H200", 1024, 2048, 32, 65536, 65536, 255, 256, 48 * 1024, 227 * 1024, 228 * 1024, 1024},
    {100, "sm_100", "B200", 1024, 2048, 32, 65536, 65536, 255, 256, 48 * 1024, 227 * 1024, 228 * 1024, 1024},
    {120, "sm_120", "RTX PRO 6000 Blackwell", 1024, 1536, 32, 65536, 65536, 255, 256, 48 * 1024, 99 * 1024,
     128 * 1024, 1024},
};

// The architecture of compute capability sm (90, 100, 120), or null.
inline const GpuArch* find_gpu_arch(int sm) {
  for (const GpuArch& a : kGpuArchs)
    if (a.sm == sm) return &a;
  return nullptr;
}
// By name: "sm_90", "sm_100", "sm_120", or null.
inline const GpuArch* find_gpu_arch(std::string_view name) {
  for (const GpuArch& a : kGpuArchs)
    if (name == a.name) return &a;
  return nullptr;
}

// What ptxas reports for one kernel on one architecture (nvcc --resource-usage, and .maxntid in its PTX).
struct KernelResources {
  int regs = 0;              // registers a thread
  size_t static_smem = 0;    // bytes of __shared__ declarations
  size_t local_bytes = 0;    // stack frame a thread (spills, local arrays)
  int launch_bounds = 0;     // __launch_bounds__ max threads a block; 0 = none declared
};

// Registers a block of `threads` threads takes: per warp, regs × 32 rounded up to the allocation unit.
inline long long block_registers(const KernelResources& k, const GpuArch& a, int threads) {
  const long long per_warp = (static_cast<long long>(k.regs) * 32 + a.reg_alloc_unit - 1) / a.reg_alloc_unit *
                             a.reg_alloc_unit;
  return per_warp * ((threads + 31) / 32);
}

// The most threads a block of this kernel may have on `a` (what cudaFuncGetAttributes reports as
// maxThreadsPerBlock): the architecture's limit, the kernel's __launch_bounds__, and what its registers leave of
// the block's register file, in whole warps.
inline int max_threads_per_block(const KernelResources& k, const GpuArch& a) {
  int n = a.max_threads_per_block;
  if (k.launch_bounds > 0 && k.launch_bounds < n) n = k.launch_bounds;
  while (n > 0 && block_registers(k, a, n) > a.regs_per_block) n -= 32;
  return n;
}

// The dynamic shared memory this kernel may be allowed on `a` (the largest value of
// cudaFuncAttributeMaxDynamicSharedMemorySize): the opt-in limit less its static shared memory.
inline size_t max_dynamic_smem(const KernelResources& k, const GpuArch& a) {
  return k.static_smem >= a.smem_per_block_optin ? 0 : a.smem_per_block_optin - k.static_smem;
}

// Why a block of `threads` threads with `dynamic_smem` bytes of dynamic shared memory does not fit on `a`, or ""
// when it does. Registers and __launch_bounds__ are what a GPU refuses with cudaErrorLaunchOutOfResources ("too
// many resources requested for launch"); shared memory with cudaErrorInvalidValue.
inline std::string launch_refusal(const KernelResources& k, const GpuArch& a, int threads, size_t dynamic_smem) {
  if (k.launch_bounds > 0 && threads > k.launch_bounds)
    return std::to_string(threads) + " threads a block, above the kernel's __launch_bounds__(" +
           std::to_string(k.launch_bounds) + ")";
  if (block_registers(k, a, threads) > a.regs_per_block)
    return std::to_string(threads) + " threads × " + std::to_string(k.regs) + " registers = " +
           std::to_string(block_registers(k, a, threads)) + " registers (allocated " +
           std::to_string(a.reg_alloc_unit) + " a warp), above " + a.name + "'s " +
           std::to_string(a.regs_per_block) + " a block: at most " + std::to_string(max_threads_per_block(k, a)) +
           " threads";
  if (k.static_smem + dynamic_smem > a.smem_per_block_optin)
    return std::to_string(k.static_smem) + " bytes of static + " + std::to_string(dynamic_smem) +
           " of dynamic shared memory, above " + a.name + "'s " + std::to_string(a.smem_per_block_optin) +
           " a block (" + a.example + ")";
  return {};
}

// Blocks of this kernel one SM holds at once (occupancy; 0: the block does not fit at all).
inline int blocks_per_sm(const KernelResources& k, const GpuArch& a, int threads, size_t dynamic_smem) {
  if (!launch_refusal(k, a, threads, dynamic_smem).empty()) return 0;
  int n = a.max_blocks_per_sm;
  const int by_threads = a.max_threads_per_sm / (((threads + 31) / 32) * 32);
  if (by_threads < n) n = by_threads;
  const long long regs = block_registers(k, a, threads);
  if (regs > 0 && a.regs_per_sm / regs < n) n = int(a.regs_per_sm / regs);
  const size_t smem = k.static_smem + dynamic_smem + a.reserved_smem_per_block;
  if (smem > 0 && a.smem_per_sm / smem < size_t(n)) n = int(a.smem_per_sm / smem);
  return n;
}

}  // namespace dflash::kernels
