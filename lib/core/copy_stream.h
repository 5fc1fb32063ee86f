#pragma once
// Host↔device copies on a CUDA stream of their own, so that they run while the compute streams work: a GPU drafter
// fed over the MPI data plane uploads the next packet during the current packet's compute (lib/train/packet.h).
// Each batch of copies ends in a Fence the host polls or waits for. Only in a build with CUDA: constructing a
// CopyStream elsewhere is a dflash::Error naming the fix. The host side of an asynchronous copy should be pinned
// (Buffer::pinned_host): from pageable memory the driver copies synchronously.
#include <cstddef>
#include <memory>

namespace dflash {

class CopyStream {
 public:
  // The end of the copies queued before it. Move-only; a default Fence is reached.
  class Fence {
   public:
    Fence() = default;
    Fence(Fence&&) noexcept;
    Fence& operator=(Fence&&) noexcept;
    ~Fence();  // waits for the copies first: their memory may be freed right after
    bool reached();  // polls; a failed copy is a dflash::Error
    void wait();

   private:
    friend class CopyStream;
    void* event_ = nullptr;  // cudaEvent_t
  };

  CopyStream();  // on the calling thread's current device
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // dst[bytes] (=) src[bytes], queued (either may be host or device memory of the current device).
  void copy(void* dst, const void* src, size_t bytes);
  Fence fence();  // marks everything queued so far

 private:
  void* stream_ = nullptr;  // cudaStream_t
};

}  // namespace dflash
