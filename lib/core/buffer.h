#pragma once
// Memory the compute runs on: a Buffer owns one allocation of host or device memory; an Arena hands out aligned
// pieces of one Buffer, sized up front from the run plan (one arena per role), so that a step never allocates
// and running out is a clear error at the first step rather than a fragmentation failure hours in.
#include <cstddef>
#include <string>
#include <utility>

namespace dflash {

enum class MemoryKind {
  host,    // malloc'd, 64-byte aligned
  device,  // cudaMalloc'd on the calling thread's current device (needs a build with CUDA)
};

const char* memory_kind_name(MemoryKind kind);

// dst[bytes] (=) src[bytes] between any two kinds of memory (device: the calling thread's current GPU), blocking:
// complete when it returns; from device memory it first waits for all work queued on the device (every stream),
// so it reads what that work wrote. For data outside a compute stream (packets, test fixtures, captures); kernels
// use the backend's upload/download on their stream.
void copy_bytes(void* dst, MemoryKind dst_kind, const void* src, MemoryKind src_kind, size_t bytes);

class Buffer {
 public:
  Buffer() = default;
  Buffer(MemoryKind kind, size_t bytes);  // throws dflash::Error when the allocation fails, naming the size
  // Host memory that is page-locked in a build with CUDA (cudaMallocHost), so that copies to and from a GPU run
  // asynchronously at the bus's speed; ordinary host memory without CUDA. kind() is host either way.
  static Buffer pinned_host(size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemoryKind kind() const { return kind_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(kind_, o.kind_);
    std::swap(pinned_, o.pinned_);
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::host;
  bool pinned_ = false;  // host memory from cudaMallocHost
};

// Bump allocator over one Buffer. alloc() never touches the memory (device memory is not host-addressable);
// Mark / rewind() free everything allocated after the mark (scratch of one backward stage).
class Arena {
 public:
  static constexpr size_t kAlign = 256;  // cuBLASLt wants 16 B; 256 keeps every tensor on its own cache lines

  Arena() = default;
  // name: what the arena is for, in the error when it runs out ("drafter activations").
  Arena(MemoryKind kind, size_t bytes, std::string name);

  template <typename T>
  T* alloc(size_t count) {
    return static_cast<T*>(alloc_bytes(count * sizeof(T)));
  }
  void* alloc_bytes(size_t bytes);

  using Mark = size_t;
  Mark mark() const { return used_; }
  void rewind(Mark m) { used_ = m; }
  void reset() { used_ = 0; }

  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t capacity() const { return buffer_.bytes(); }
  MemoryKind kind() const { return buffer_.kind(); }
  const std::string& name() const { return name_; }

  // Bytes alloc(count) takes of the arena for an array of `bytes` bytes (alignment included): sizing formulas add
  // these up so that the arena's capacity equals its peak use.
  static size_t footprint(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  Buffer buffer_;
  size_t used_ = 0, peak_ = 0;
  std::string name_;
};

// Rewinds an arena to where it stood at construction (scratch scoped to a block of code).
class ArenaScope {
 public:
  explicit ArenaScope(Arena& a) : arena_(a), mark_(a.mark()) {}
  ~ArenaScope() { arena_.rewind(mark_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  Arena& arena_;
  Arena::Mark mark_;
};

}  // namespace dflash
