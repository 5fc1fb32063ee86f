#pragma once
// Where and how kernels run: every kernel call takes one ExecContext. On the CPU it only names the memory kind
// and the scratch arena; on CUDA it also carries the stream and the cuBLASLt handle (opaque here so that lib/core
// needs no CUDA headers; kernels/cuda owns their creation, see kernels/cuda/context.h).
#include "lib/core/buffer.h"

namespace dflash {

struct ExecContext {
  MemoryKind memory = MemoryKind::host;
  Arena* workspace = nullptr;   // kernel scratch (cuBLASLt workspace, loss row buffers); may be null on the CPU
  void* stream = nullptr;       // cudaStream_t (CUDA); null = the CPU, or CUDA's default stream
  void* blaslt = nullptr;       // cublasLtHandle_t (CUDA)
  int device = -1;              // CUDA device ordinal; -1 on the CPU
};

}  // namespace dflash
