#include "lib/core/copy_stream.h"

#include <utility>

#include "lib/core/error.h"

#if DFLASH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace dflash {

#if DFLASH_WITH_CUDA

namespace {
void check(cudaError_t rc, const char* what) {
  DFLASH_CHECK(rc == cudaSuccess, "copy stream: {} failed: {}", what, cudaGetErrorString(rc));
}
cudaEvent_t event_of(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace

CopyStream::Fence::Fence(Fence&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
CopyStream::Fence& CopyStream::Fence::operator=(Fence&& o) noexcept {
  if (this != &o) {
    Fence old(std::move(*this));
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}
CopyStream::Fence::~Fence() {
  if (!event_) return;
  cudaEventSynchronize(event_of(event_));  // an error here cannot be reported; the next CUDA call sees it
  cudaEventDestroy(event_of(event_));
}
bool CopyStream::Fence::reached() {
  if (!event_) return true;
  const cudaError_t rc = cudaEventQuery(event_of(event_));
  if (rc == cudaErrorNotReady) return false;
  check(rc, "a host-device copy");
  return true;
}
void CopyStream::Fence::wait() {
  if (event_) check(cudaEventSynchronize(event_of(event_)), "waiting for a host-device copy");
}

CopyStream::CopyStream() {
  cudaStream_t s = nullptr;
  // non-blocking: no implicit ordering with the legacy default stream, so the copies never wait behind compute
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
}
CopyStream::~CopyStream() {
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}
void CopyStream::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)), "cudaMemcpyAsync");
}
CopyStream::Fence CopyStream::fence() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  Fence f;
  f.event_ = e;
  check(cudaEventRecord(e, static_cast<cudaStream_t>(stream_)), "cudaEventRecord");
  return f;
}

#else

CopyStream::Fence::Fence(Fence&&) noexcept {}
CopyStream::Fence& CopyStream::Fence::operator=(Fence&&) noexcept { return *this; }
CopyStream::Fence::~Fence() = default;
bool CopyStream::Fence::reached() { return true; }
void CopyStream::Fence::wait() {}
CopyStream::CopyStream() {
  DFLASH_USER_FAIL("a host-device copy stream needs the CUDA backend, which this build does not have (configure with "
                   "-DDFLASH_CUDA=ON)");
}
CopyStream::~CopyStream() = default;
void CopyStream::copy(void*, const void*, size_t) {}
CopyStream::Fence CopyStream::fence() { return {}; }

#endif

}  // namespace dflash
