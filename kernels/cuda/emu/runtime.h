#pragma once
// The emulated GPU's internals shared by its parts: runtime.cpp (the CUDA runtime: devices, memory, streams,
// events, copies, the device worker), block.cpp (kernels: thread blocks as fibers), cublaslt.cpp, nccl.cpp.
// Host code never includes this: it includes the toolkit's own <cuda_runtime.h>, <cublasLt.h>, <nccl.h>, whose
// functions the emulation defines (kernels/cuda/emu/README.md).
//
// The model: every stream is a FIFO of work items; one device worker thread per process runs them, choosing among
// the heads that are ready (stream order, event waits, the legacy default stream's implicit barriers) in the order
// DFLASH_EMU_ORDER says. Work runs only when the host waits for something (a synchronize, a query, a blocking
// copy) or once it has been queued DFLASH_EMU_LAG_MS, so a missing wait reads stale data instead of a lucky
// result. Device memory is inaccessible (PROT_NONE) while the worker is idle: host code that dereferences it
// faults with a message naming the allocation.
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <string>

#include "kernels/cuda/records/kernel_records.h"
#include "kernels/gpu_arch.h"

namespace dflash::emu {

// One item of stream work. run() executes once on the device worker, with device memory accessible. When poll is
// set (work that waits on another process: NCCL), the worker calls poll() after run() until it returns true; the
// stream stays blocked meanwhile and the worker goes on with other streams (poll() must not block).
struct Work {
  std::string what;              // names it in errors: "cublasLtMatmul(m 64, n 32, k 16)", "ncclSend(64 B to rank 1)"
  std::function<void()> run;
  std::function<bool()> poll;    // empty: done when run() returns
};

// Queues `w` on `stream` (0 / cudaStreamLegacy / cudaStreamPerThread or a created stream) of its device.
// cudaErrorInvalidResourceHandle for a destroyed or unknown stream; the sticky error once a device fault happened.
cudaError_t enqueue(cudaStream_t stream, Work w);

// Wakes the worker now (the host is about to wait on something that only the worker can finish).
void kick();

// The memory the emulation handed out (cudaMalloc*, cudaMallocHost/HostAlloc).
struct Allocation {
  const char* base = nullptr;
  size_t bytes = 0;
  int device = -1;           // device of device memory; -1 for host memory
  bool device_memory = false;
  bool pinned = false;       // page-locked host memory (cudaMallocHost / cudaHostAlloc)
  char* mapping = nullptr;   // device memory: the mapping it sits at the end of (before its guard page)
  size_t mapping_bytes = 0;
};
// The live allocation holding all of [p, p + bytes), or nullptr (plain host memory, freed memory, or a range that
// runs past the end of its allocation).
const Allocation* find_allocation(const void* p, size_t bytes = 1);
inline bool is_device_range(const void* p, size_t bytes) {
  const Allocation* a = find_allocation(p, bytes);
  return a && a->device_memory;
}

// A fault of device work (a kernel, a library call on the device): prints "emulated GPU: <msg>" to stderr, makes
// `err` the sticky error of the process (every later runtime call returns it, as a real context after an illegal
// address) and drops the queued work. Called on the worker thread.
void device_fault(cudaError_t err, const std::string& msg);

// The calling thread's current device (cudaSetDevice), and the number of emulated devices (DFLASH_EMU_DEVICES,
// default 1; 0 emulates a machine without a GPU).
int current_device();
int device_count();

// "[rank 3] " when running under MPI (OMPI_COMM_WORLD_RANK / PMI_RANK), else "": a prefix for messages.
std::string rank_prefix();

// DFLASH_EMU_ORDER: the order threads of a block run between barriers, blocks of a grid run, and ready stream
// heads are picked: forward | reverse | shuffle:SEED.
enum class Order { forward, reverse, shuffle };
struct OrderPolicy {
  Order order = Order::forward;
  unsigned long long seed = 0;
};
const OrderPolicy& order_policy();

// DFLASH_EMU_ARCH: the architecture the emulated GPU answers for and whose limits it enforces: sm_90 (the
// default: an H100/H200, 132 SMs), sm_100 (a B200, 148 SMs) or sm_120 (an RTX PRO 6000 Blackwell, 188 SMs).
const kernels::GpuArch& emu_arch();
int emu_sm_count();
// The record of a registered kernel on emu_arch() (kernels/cuda/records/kernel_records.h): null when the build has
// no records (kernel_records_available() says why) or, with `missing` set, when the records lack the kernel.
const kernels::cuda::KernelRecord* kernel_record(const void* func, const char* id, bool* missing);

}  // namespace dflash::emu
