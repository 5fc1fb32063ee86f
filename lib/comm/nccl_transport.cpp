#include "lib/comm/nccl_transport.h"

#include "lib/core/error.h"

#if DFLASH_WITH_CUDA

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <exception>
#include <vector>

#include "lib/core/timer.h"

namespace dflash::comm {

namespace {

void cuda_check(cudaError_t rc, const char* what, const std::string& who) {
  if (rc != cudaSuccess) DFLASH_FAIL("{}: {} failed: {}", who, what, cudaGetErrorString(rc));
}

// What one NCCL communicator of this rank shares with its pending requests (which may outlive a call).
struct NcclState {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;  // NCCL's operations, in issue order
  cudaStream_t copy = nullptr;    // staging copies host -> device: never queued behind a blocked NCCL kernel
  std::string name;  // "world", "target TP group 0", ...
  int rank = 0, size = 1, world_rank = 0;
  double timeout = 0;
  bool dead = false;  // aborted: every later call fails at once
  int* scratch = nullptr;  // one int on the device, for barrier()

  ~NcclState() {
    // a communicator still here was never finished by ~NcclTransport: its constructor threw after
    // ncclCommInitRankConfig (a failed initialisation, a failed allocation after it)
    if (comm) ncclCommAbort(comm);
    if (scratch) cudaFree(scratch);
    if (copy) cudaStreamDestroy(copy);
    if (stream) cudaStreamDestroy(stream);
  }

  std::string who() const {
    return fmt::format("NCCL {} (world rank {}, rank {} of {})", name, world_rank, rank, size);
  }

  // Unblocks this rank's kernels on this communicator; peers see the error on their next poll.
  void abort() {
    dead = true;
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }

  [[noreturn]] void abort_and_fail(const std::string& what, const std::string& why) {
    abort();
    DFLASH_FAIL("{}: {} failed: {}; the communicator is aborted (a peer rank died, stalled or its link failed; "
                "NCCL_DEBUG=WARN says more)", who(), what, why);
  }

  void require_alive(const char* what) const {
    DFLASH_CHECK(!dead, "{}: {} on an aborted communicator", who(), what);
  }

  // The result of a host call on a non-blocking communicator: ncclInProgress means "poll until settled".
  void settle(ncclResult_t rc, const std::string& what) {
    Timer t;
    while (rc == ncclInProgress) {
      ncclCommGetAsyncError(comm, &rc);
      if (rc != ncclInProgress) break;
      if (timeout > 0 && t.seconds() > timeout)
        abort_and_fail(what, fmt::format("still in progress after {:.0f} s", t.seconds()));
      usleep(100);
    }
    if (rc != ncclSuccess) abort_and_fail(what, ncclGetErrorString(rc));
  }

  // Blocks until `done` has completed on the stream, polling NCCL for asynchronous errors (a dead peer).
  void wait_event(cudaEvent_t done, const std::string& what) {
    Timer t;
    for (;;) {
      if (poll_event(done, what)) return;
      if (timeout > 0 && t.seconds() > timeout)
        abort_and_fail(what, fmt::format("no completion after {:.0f} s", t.seconds()));
      usleep(50);
    }
  }

  bool poll_event(cudaEvent_t done, const std::string& what) {
    require_alive(what.c_str());
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) abort_and_fail(what, cudaGetErrorString(q));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) abort_and_fail(what, ncclGetErrorString(async));
    return false;
  }
};

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // older drivers report plain host memory as an error: clear it
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// One issued operation: its completion event, and for a host buffer the device staging buffer and where the
// result goes back on completion.
struct NcclOp {
  std::shared_ptr<NcclState> s;
  std::string what;
  cudaEvent_t done = nullptr;
  bool recorded = false;
  void* staging = nullptr;    // device copy of a host buffer, or nullptr
  void* host_out = nullptr;   // host buffer to fill from staging once complete (receives, all-reduce, broadcast)
  size_t bytes = 0;

  ~NcclOp() {
    if (staging) cudaFreeAsync(staging, s->stream);
    if (done) cudaEventDestroy(done);
  }
  // After `done`: the result back into the host buffer, on the copy stream (cudaMemcpy on the legacy default
  // stream would also wait for the compute kernels of any blocking stream of this device).
  void complete() {
    if (host_out && bytes > 0) {
      cuda_check(cudaMemcpyAsync(host_out, staging, bytes, cudaMemcpyDeviceToHost, s->copy),
                 "cudaMemcpyAsync (staging to host)", s->who());
      cuda_check(cudaStreamSynchronize(s->copy), "cudaStreamSynchronize (staging to host)", s->who());
    }
    host_out = nullptr;
  }
};

class NcclRequest final : public Request::Impl {
 public:
  explicit NcclRequest(std::shared_ptr<NcclOp> op) : op_(std::move(op)) {}
  void wait() override {
    if (std::uncaught_exceptions() > 0) {
      // a request destroyed while an error unwinds (the job is about to be aborted): waiting for a peer that may
      // never come would only delay the abort, so the communicator goes now
      op_->s->abort();
      return;
    }
    check_recorded();
    op_->s->wait_event(op_->done, op_->what);
    op_->complete();
  }
  bool test() override {
    check_recorded();
    if (!op_->s->poll_event(op_->done, op_->what)) return false;
    op_->complete();
    return true;
  }
  void cancel() override {
    DFLASH_FAIL("{}: {} cannot be cancelled (NCCL has no cancel; post receives only for sends that were issued)",
                op_->s->who(), op_->what);
  }

 private:
  void check_recorded() const {
    DFLASH_CHECK(op_->recorded, "{}: {} waited for before group_end()", op_->s->who(), op_->what);
  }
  std::shared_ptr<NcclOp> op_;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(MPI_Comm bootstrap, const std::string& name, double timeout_seconds)
      : s_(std::make_shared<NcclState>()) {
    s_->name = name;
    s_->timeout = timeout_seconds;
    MPI_Comm_rank(MPI_COMM_WORLD, &s_->world_rank);
    MPI_Comm_rank(bootstrap, &s_->rank);
    MPI_Comm_size(bootstrap, &s_->size);
    ncclUniqueId id{};
    if (s_->rank == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&id);
      DFLASH_CHECK(rc == ncclSuccess, "{}: ncclGetUniqueId failed: {}", s_->who(), ncclGetErrorString(rc));
    }
    DFLASH_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, bootstrap) == MPI_SUCCESS,
                 "{}: MPI_Bcast of the NCCL unique id failed", s_->who());
    cuda_check(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking), "cudaStreamCreate", s_->who());
    cuda_check(cudaStreamCreateWithFlags(&s_->copy, cudaStreamNonBlocking), "cudaStreamCreate", s_->who());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; waits poll (and time out) here
    const ncclResult_t rc = ncclCommInitRankConfig(&s_->comm, s_->size, id, s_->rank, &config);
    if (rc != ncclSuccess && rc != ncclInProgress)
      DFLASH_FAIL("{}: ncclCommInitRankConfig failed: {} (one GPU per rank? NCCL refuses two ranks on one GPU)",
                  s_->who(), ncclGetErrorString(rc));
    s_->settle(rc, "ncclCommInitRankConfig (bootstrap)");
    cuda_check(cudaMalloc(&s_->scratch, sizeof(int)), "cudaMalloc (barrier scratch)", s_->who());
  }

  ~NcclTransport() override {  // the streams go with the last pending request (NcclState)
    if (s_->comm && std::uncaught_exceptions() > 0) s_->abort();  // an error unwinds: no waiting for peers
    if (s_->comm) {
      // queued NCCL work (a receive nobody will match after an error) must not hang the exit: bounded waits for
      // the stream and the finalize, then abort
      const double limit = s_->timeout > 0 ? s_->timeout : 60;
      Timer t;
      while (cudaStreamQuery(s_->stream) == cudaErrorNotReady && t.seconds() < limit) usleep(100);
      ncclResult_t rc = cudaStreamQuery(s_->stream) == cudaSuccess ? ncclCommFinalize(s_->comm) : ncclInternalError;
      while (rc == ncclInProgress && t.seconds() < limit) {
        usleep(100);
        ncclCommGetAsyncError(s_->comm, &rc);
      }
      if (rc == ncclSuccess) ncclCommDestroy(s_->comm);
      else ncclCommAbort(s_->comm);
      s_->comm = nullptr;
    }
  }

  int rank() const override { return s_->rank; }
  int size() const override { return s_->size; }

  void allreduce_sum(float* data, size_t n) override {
    reduce(data, n, ncclFloat32, sizeof(float), "ncclAllReduce(float)");
  }
  void allreduce_sum(double* data, size_t n) override {
    reduce(data, n, ncclFloat64, sizeof(double), "ncclAllReduce(double)");
  }
  bool sums_bf16_on_device() const override { return true; }
  void allreduce_sum_bf16_device(uint16_t* data, size_t n) override {
    reduce(data, n, ncclBfloat16, sizeof(uint16_t), "ncclAllReduce(bf16)");
  }

  bool orders_on_device_streams() const override { return true; }
  Request allreduce_sum_ordered(void* data, size_t n, DeviceSum type, void* compute_stream) override {
    const bool bf16 = type == DeviceSum::bf16;
    const std::string what =
        fmt::format("ncclAllReduce({}) of {} elements (stream-ordered)", bf16 ? "bf16" : "float", n);
    s_->require_alive(what.c_str());
    DFLASH_CHECK(group_depth_ == 0, "{}: {} inside a point-to-point group", s_->who(), what);
    if (n == 0) return Request();
    DFLASH_CHECK(is_device_pointer(data), "{}: {} on a host buffer: the stream-ordered all-reduce sums device memory "
                 "in place (host buffers take allreduce_sum)", s_->who(), what);
    auto compute = static_cast<cudaStream_t>(compute_stream);
    auto op = std::make_shared<NcclOp>();
    op->s = s_;
    op->what = what;
    // NCCL's stream starts the sum once the compute stream has written the partial sums; the compute stream's
    // later work (the residual add, the next layer rewriting the buffer) starts once the sum is done
    wait_on_device(s_->stream, compute, "the partial sums");
    s_->settle(ncclAllReduce(data, data, n, bf16 ? ncclBfloat16 : ncclFloat32, ncclSum, s_->comm, s_->stream),
               op->what);
    record(*op);
    cuda_check(cudaStreamWaitEvent(compute, op->done, 0), "cudaStreamWaitEvent (the compute stream on the sum)",
               s_->who());
    return Request(std::make_unique<NcclRequest>(op));
  }

  void broadcast_bytes(void* data, size_t bytes, int root) override {
    if (bytes == 0) return;
    auto op = begin_op(fmt::format("ncclBroadcast({} bytes from rank {})", bytes, root), data, bytes, true,
                       s_->rank == root);
    s_->settle(ncclBroadcast(op->staging ? op->staging : data, op->staging ? op->staging : data, bytes, ncclUint8,
                             root, s_->comm, s_->stream),
               op->what);
    finish_blocking(op);
  }

  void send_bytes(const void* data, size_t bytes, int dest, int tag) override {
    isend_bytes(data, bytes, dest, tag).wait();
  }
  void recv_bytes(void* data, size_t bytes, int src, int tag) override { irecv_bytes(data, bytes, src, tag).wait(); }

  Request isend_bytes(const void* data, size_t bytes, int dest, int tag) override {
    auto op = begin_op(fmt::format("ncclSend({} bytes to rank {})", bytes, dest), const_cast<void*>(data), bytes,
                       false, true);
    if (bytes > 0)
      s_->settle(ncclSend(op->staging ? op->staging : data, bytes, ncclUint8, dest, s_->comm, s_->stream), op->what);
    return finish_async(op);
  }

  Request irecv_bytes(void* data, size_t bytes, int src, int tag) override {
    auto op = begin_op(fmt::format("ncclRecv({} bytes from rank {})", bytes, src), data, bytes, true, false);
    if (bytes > 0)
      s_->settle(ncclRecv(op->staging ? op->staging : data, bytes, ncclUint8, src, s_->comm, s_->stream), op->what);
    return finish_async(op);
  }

  void barrier() override {
    s_->require_alive("barrier");
    auto op = std::make_shared<NcclOp>();
    op->s = s_;
    op->what = "barrier (ncclAllReduce of one int)";
    s_->settle(ncclAllReduce(s_->scratch, s_->scratch, 1, ncclInt32, ncclSum, s_->comm, s_->stream), op->what);
    finish_blocking(op);
  }

  bool probe(int, int) override {
    DFLASH_FAIL("{}: probe() is a control-plane call: NCCL has none (probe the MPI world instead)", s_->who());
  }
  bool cancellable_receives() const override { return false; }
  bool takes_device_pointers() const override { return true; }

  void group_start() override {
    s_->require_alive("ncclGroupStart");
    DFLASH_CHECK(ncclGroupStart() == ncclSuccess, "{}: ncclGroupStart failed", s_->who());
    ++group_depth_;
  }
  void group_end() override {
    DFLASH_CHECK(group_depth_ > 0, "{}: group_end() without group_start()", s_->who());
    --group_depth_;
    s_->settle(ncclGroupEnd(), "ncclGroupEnd (point-to-point group)");
    if (group_depth_ == 0) {
      for (auto& op : grouped_) record(*op);
      grouped_.clear();
    }
  }

 private:
  // A new operation on `bytes` at `data`: a host buffer gets a device staging buffer, filled now when `copy_in`.
  std::shared_ptr<NcclOp> begin_op(std::string what, void* data, size_t bytes, bool copy_out, bool copy_in) {
    s_->require_alive(what.c_str());
    auto op = std::make_shared<NcclOp>();
    op->s = s_;
    op->what = std::move(what);
    op->bytes = bytes;
    if (bytes > 0 && !is_device_pointer(data)) {
      // allocated and filled on the copy stream (a pageable copy on the NCCL stream could wait behind a send
      // whose receiver has not posted yet); the NCCL stream waits for it with an event
      cuda_check(cudaMallocAsync(&op->staging, bytes, s_->copy), "cudaMallocAsync (staging)", s_->who());
      if (copy_in)
        cuda_check(cudaMemcpyAsync(op->staging, data, bytes, cudaMemcpyHostToDevice, s_->copy),
                   "cudaMemcpyAsync (host to staging)", s_->who());
      wait_on_device(s_->stream, s_->copy, "staged");
      if (copy_out) op->host_out = data;
    }
    return op;
  }

  // `waiter`'s later work runs after the work queued on `producer` so far, with no host wait: an event recorded
  // on `producer`, waited for by `waiter`, then released (CUDA frees it once the wait is resolved).
  void wait_on_device(cudaStream_t waiter, cudaStream_t producer, const char* what) {
    cudaEvent_t ready = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate", s_->who());
    cuda_check(cudaEventRecord(ready, producer), fmt::format("cudaEventRecord ({})", what).c_str(), s_->who());
    cuda_check(cudaStreamWaitEvent(waiter, ready, 0), fmt::format("cudaStreamWaitEvent ({})", what).c_str(),
               s_->who());
    cudaEventDestroy(ready);
  }

  void record(NcclOp& op) {
    cuda_check(cudaEventCreateWithFlags(&op.done, cudaEventDisableTiming), "cudaEventCreate", s_->who());
    cuda_check(cudaEventRecord(op.done, s_->stream), "cudaEventRecord", s_->who());
    op.recorded = true;
  }

  Request finish_async(const std::shared_ptr<NcclOp>& op) {
    if (group_depth_ > 0) grouped_.push_back(op);  // its event is recorded after ncclGroupEnd issued the group
    else record(*op);
    return Request(std::make_unique<NcclRequest>(op));
  }

  void finish_blocking(const std::shared_ptr<NcclOp>& op) {
    DFLASH_CHECK(group_depth_ == 0, "{}: {} inside a point-to-point group", s_->who(), op->what);
    record(*op);
    s_->wait_event(op->done, op->what);
    op->complete();
  }

  void reduce(void* data, size_t n, ncclDataType_t type, size_t elem, const char* what) {
    if (n == 0) return;
    auto op = begin_op(fmt::format("{} of {} elements", what, n), data, n * elem, true, true);
    void* p = op->staging ? op->staging : data;
    s_->settle(ncclAllReduce(p, p, n, type, ncclSum, s_->comm, s_->stream), op->what);
    finish_blocking(op);
  }

  std::shared_ptr<NcclState> s_;
  int group_depth_ = 0;
  std::vector<std::shared_ptr<NcclOp>> grouped_;
};

}  // namespace

bool nccl_built() { return true; }

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Transport> make_nccl_transport(MPI_Comm bootstrap, const std::string& name, double timeout_seconds) {
  DFLASH_CHECK(bootstrap != MPI_COMM_NULL, "NCCL {}: null bootstrap communicator (this rank has no such role)", name);
  return std::make_unique<NcclTransport>(bootstrap, name, timeout_seconds);
}

}  // namespace dflash::comm

#else  // a build without CUDA: no NCCL

namespace dflash::comm {

bool nccl_built() { return false; }
int visible_gpus() { return 0; }

std::unique_ptr<Transport> make_nccl_transport(MPI_Comm, const std::string& name, double) {
  DFLASH_USER_FAIL("layout.transport nccl ({}): this build has no CUDA/NCCL (configure with the CUDA toolkit and "
                   "NCCL installed, or set layout.transport: mpi)", name);
}

}  // namespace dflash::comm

#endif
