#pragma once
// Point-to-point and collective communication inside one communicator (a target TP group, the drafter DP group,
// the world), behind one interface. Ranks are ranks of that communicator. Byte calls are the primitive; the typed
// templates count elements. Two implementations carry the data plane (lib/comm/data_plane.h): MpiTransport (host
// buffers, anywhere) and the NCCL transport (lib/comm/nccl_transport.h, CUDA builds); the control plane (layout,
// stop protocol, packet headers, small messages) is always MPI.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace dflash::comm {

// Which transport carries the data plane (lib/comm/data_plane.h chooses it).
enum class DataPlane { Mpi, Nccl };
const char* data_plane_name(DataPlane p);  // "mpi" | "nccl"
// What layout.transport asks for: auto lets choose_data_plane decide from the job's shape.
enum class TransportChoice { automatic, mpi, nccl };
constexpr std::array<const char*, 3> names_of(TransportChoice) { return {"auto", "mpi", "nccl"}; }

// A pending non-blocking send or receive. wait() blocks until the buffer may be reused (send) or read (receive).
// Move-only; destroying a pending request waits for it, so a buffer is never released under a transfer.
class Request {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;  // true once complete (then wait() returns at once)
    virtual void cancel() = 0;  // gives up an unmatched receive (a send is waited for: MPI cannot cancel it)
  };
  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& o) noexcept {
    if (this != &o) {
      finish();
      impl_ = std::move(o.impl_);
    }
    return *this;
  }
  ~Request() { finish(); }

  void wait() {
    if (impl_) {
      impl_->wait();
      impl_.reset();
    }
  }
  bool test() {
    if (impl_ && impl_->test()) impl_.reset();
    return !impl_;
  }
  bool pending() const { return impl_ != nullptr; }
  // Withdraws a receive nobody will match (e.g. prefetched packets after a stop); completed ones are just released.
  void cancel() {
    if (impl_) {
      impl_->cancel();
      impl_.reset();
    }
  }

 private:
  void finish() noexcept {
    try {
      wait();
    } catch (...) {
      // a failed transfer in a destructor cannot be reported; MPI's default handler aborts the job anyway
    }
  }
  std::unique_ptr<Impl> impl_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[n] (=) sum over the ranks of data[n]; every rank gets the same values.
  virtual void allreduce_sum(float* data, size_t n) = 0;
  virtual void allreduce_sum(double* data, size_t n) = 0;
  // data[bytes] (=) root's data[bytes] on every rank
  virtual void broadcast_bytes(void* data, size_t bytes, int root) = 0;
  virtual void send_bytes(const void* data, size_t bytes, int dest, int tag) = 0;
  virtual void recv_bytes(void* data, size_t bytes, int src, int tag) = 0;
  virtual Request isend_bytes(const void* data, size_t bytes, int dest, int tag) = 0;
  virtual Request irecv_bytes(void* data, size_t bytes, int src, int tag) = 0;
  virtual void barrier() = 0;
  // True when a message with `tag` from `src` (-1 = any source) is waiting to be received; does not receive it.
  virtual bool probe(int src, int tag) = 0;
  // False where a posted receive cannot be withdrawn (NCCL): callers then post a receive only once they know the
  // matching send was issued (the packet receiver waits for the header on the control plane).
  virtual bool cancellable_receives() const { return true; }
  // True where the buffers may be device memory of the calling rank's GPU (NCCL): a caller holding its data on the
  // device then hands the device pointer and saves the copies through the host. MPI here is not CUDA-aware: host only.
  virtual bool takes_device_pointers() const { return false; }
  // data[n] (=) sum over the ranks of data[n]: n bf16 values (the bits of kernels::bf16) in this rank's device
  // memory, summed in bf16 (NCCL: ncclBfloat16; its ring rounds each hop's partial sum to bf16, n_ranks - 1
  // roundings instead of one: the target's layout.tp_allreduce: bf16). Only where sums_bf16_on_device() is true
  // (NCCL); elsewhere an error.
  virtual bool sums_bf16_on_device() const { return false; }
  virtual void allreduce_sum_bf16_device(uint16_t* data, size_t n);
  // A stream-ordered all-reduce on the device (NCCL): data[n] (=) sum over the ranks, data in this rank's device
  // memory, n values of `type` (fp32 summed in fp32; bf16 as allreduce_sum_bf16_device sums it). It runs after the
  // work queued so far on `compute_stream` (a cudaStream_t; events, not a host wait), and the work queued there
  // afterwards runs after the sum; the call returns once the sum is queued. The Request completes with the sum:
  // its wait() is the transport's bounded wait (the watchdog: an error naming the operation and the ranks, the
  // communicator aborted), so a caller about to wait for compute_stream on the host (a download, a synchronize)
  // waits for its pending requests first, and an all-reduce that never completes ends in that error rather than in
  // an unbounded stream synchronisation. Only where orders_on_device_streams() is true (NCCL); elsewhere an error.
  enum class DeviceSum { fp32, bf16 };
  virtual bool orders_on_device_streams() const { return false; }
  virtual Request allreduce_sum_ordered(void* data, size_t n, DeviceSum type, void* compute_stream);
  // Point-to-point calls between group_start and group_end are issued together (NCCL: ncclGroupStart/End, so the
  // transfers to or from several peers progress at once); their requests may be waited for only after group_end.
  // MPI needs no grouping: no-ops.
  virtual void group_start() {}
  virtual void group_end() {}

  template <typename T>
  void broadcast(T* data, size_t count, int root) { broadcast_bytes(data, count * sizeof(T), root); }
  template <typename T>
  void send(const T* data, size_t count, int dest, int tag) { send_bytes(data, count * sizeof(T), dest, tag); }
  template <typename T>
  void recv(T* data, size_t count, int src, int tag) { recv_bytes(data, count * sizeof(T), src, tag); }
  template <typename T>
  Request isend(const T* data, size_t count, int dest, int tag) {
    return isend_bytes(data, count * sizeof(T), dest, tag);
  }
  template <typename T>
  Request irecv(T* data, size_t count, int src, int tag) {
    return irecv_bytes(data, count * sizeof(T), src, tag);
  }
};

// A transport of one rank: collectives are the identity, point-to-point is an error. What a TP group of one
// uses when there is no MPI (unit tests, tools).
class SelfTransport : public Transport {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(float*, size_t) override {}
  void allreduce_sum(double*, size_t) override {}
  void broadcast_bytes(void*, size_t, int) override {}
  void send_bytes(const void*, size_t, int, int) override;
  void recv_bytes(void*, size_t, int, int) override;
  Request isend_bytes(const void*, size_t, int, int) override;
  Request irecv_bytes(void*, size_t, int, int) override;
  void barrier() override {}
  bool probe(int, int) override { return false; }
};

}  // namespace dflash::comm
