#pragma once
// The CUDA side of an ExecContext: a CudaContext owns one stream, one cuBLASLt handle and a device workspace arena
// on one device, and hands out the ExecContext that every kernel call takes (lib/core/exec_context.h keeps these
// as opaque pointers so that lib/core needs no CUDA headers).
#include <cstddef>

#include "lib/core/buffer.h"
#include "lib/core/exec_context.h"

namespace dflash::kernels::cuda {

class CudaContext {
 public:
  // device: CUDA ordinal (made current on the calling thread); workspace_bytes: the device arena kernels may
  // use as scratch (cuBLASLt workspace, reduction partials). Throws dflash::Error when CUDA fails.
  explicit CudaContext(int device = 0, size_t workspace_bytes = size_t(64) << 20);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  ExecContext& exec() { return exec_; }
  Arena& workspace() { return workspace_; }

 private:
  Arena workspace_;
  ExecContext exec_;
};

// Number of visible CUDA devices; 0 when there is no driver, no device, or CUDA reports an error (never throws).
int cuda_device_count();

}  // namespace dflash::kernels::cuda
