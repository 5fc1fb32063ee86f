#include "lib/core/buffer.h"

#include <cstdlib>
#include <cstring>

#include "lib/core/error.h"

#if DFLASH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace dflash {

const char* memory_kind_name(MemoryKind kind) { return kind == MemoryKind::host ? "host" : "device"; }

void copy_bytes(void* dst, MemoryKind dst_kind, const void* src, MemoryKind src_kind, size_t bytes) {
  if (bytes == 0) return;
  if (dst_kind == MemoryKind::host && src_kind == MemoryKind::host) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if DFLASH_WITH_CUDA
  // From device memory: the legacy stream cudaMemcpy runs on is not ordered after the compute and NCCL streams
  // (cudaStreamNonBlocking), so the copy could read what their queued work has not written yet: wait for all of
  // the device's work first (a slow path: the step's own copies are stream-ordered).
  cudaError_t rc = src_kind == MemoryKind::device ? cudaDeviceSynchronize() : cudaSuccess;
  if (rc == cudaSuccess) rc = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);  // unified addressing: kinds implied
  // From pageable host memory cudaMemcpy returns once the source is staged, before the copy lands, and the legacy
  // stream it runs on is not ordered with the compute streams (cudaStreamNonBlocking): wait for it, so that the
  // copy is complete when this returns, as promised (the emulated GPU's reverse order caught a kernel reading a
  // packet before its upload).
  if (rc == cudaSuccess && dst_kind == MemoryKind::device) rc = cudaStreamSynchronize(cudaStreamLegacy);
  DFLASH_CHECK(rc == cudaSuccess, "cudaMemcpy of {} bytes ({} to {} memory): {}", bytes, memory_kind_name(src_kind),
               memory_kind_name(dst_kind), cudaGetErrorString(rc));
#else
  DFLASH_USER_FAIL("a copy from {} to {} memory needs the CUDA backend, which this build does not have",
                   memory_kind_name(src_kind), memory_kind_name(dst_kind));
#endif
}

Buffer::Buffer(MemoryKind kind, size_t bytes) : bytes_(bytes), kind_(kind) {
  if (bytes == 0) return;
  if (kind == MemoryKind::host) {
    data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    DFLASH_USER_CHECK(data_ != nullptr, "out of host memory: cannot allocate {:.3f} GiB", double(bytes) / (1 << 30));
    return;
  }
#if DFLASH_WITH_CUDA
  const cudaError_t rc = cudaMalloc(&data_, bytes);
  if (rc != cudaSuccess) {
    data_ = nullptr;
    DFLASH_USER_FAIL("out of GPU memory: cannot allocate {:.3f} GiB on the device ({}); lower loss.chunk_size, "
                     "loss.anchors_per_seq or data.max_seq_len",
                     double(bytes) / (1 << 30), cudaGetErrorString(rc));
  }
#else
  DFLASH_USER_FAIL("device memory requested, but this build has no CUDA backend (configure with -DDFLASH_CUDA=ON)");
#endif
}

Buffer Buffer::pinned_host(size_t bytes) {
#if DFLASH_WITH_CUDA
  Buffer b;
  if (bytes == 0) return b;
  const cudaError_t rc = cudaMallocHost(&b.data_, bytes);
  if (rc != cudaSuccess) {
    b.data_ = nullptr;
    DFLASH_USER_FAIL("cannot allocate {:.3f} GiB of page-locked host memory ({}); lower layout.packets_in_flight or "
                     "data.max_seq_len", double(bytes) / (1 << 30), cudaGetErrorString(rc));
  }
  b.bytes_ = bytes;
  b.pinned_ = true;
  return b;
#else
  return Buffer(MemoryKind::host, bytes);
#endif
}

Buffer::~Buffer() {
  if (!data_) return;
#if DFLASH_WITH_CUDA
  if (pinned_) {
    cudaFreeHost(data_);
    return;
  }
#endif
  if (kind_ == MemoryKind::host) {
    std::free(data_);
    return;
  }
#if DFLASH_WITH_CUDA
  cudaFree(data_);
#endif
}

Arena::Arena(MemoryKind kind, size_t bytes, std::string name) : buffer_(kind, bytes), name_(std::move(name)) {}

void* Arena::alloc_bytes(size_t bytes) {
  const size_t need = footprint(bytes);
  DFLASH_CHECK(used_ + need <= buffer_.bytes(),
               "{} arena ({} memory) exhausted: {} bytes in use, {} more requested, capacity {}; the run plan's "
               "sizing formula is short",
               name_, memory_kind_name(kind()), used_, need, buffer_.bytes());
  void* p = static_cast<char*>(buffer_.data()) + used_;
  used_ += need;
  if (used_ > peak_) peak_ = used_;
  return p;
}

}  // namespace dflash
