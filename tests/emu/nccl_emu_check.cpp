// The emulated NCCL (kernels/cuda/emu/nccl.cpp) against NCCL's documented semantics, one case per run:
//   mpirun -np N nccl_emu_check CASE
// Each rank binds its own emulated device (DFLASH_EMU_DEVICES >= ranks; rank r uses device r % devices), buffers
// are emulated device memory (cudaMalloc) filled and read with cudaMemcpy, and every check compares exact values or
// measured times. Cases:
//   sendrecv        a send completes only once its receive is posted (receiver 0.5 s late: the sender's stream
//                   takes >= 0.4 s), a receive waits for a late send, fan-in of sends to rank 0 outside groups
//   ring            one group: send to next, receive from previous, twice per peer (same-peer calls keep order)
//   allreduce       sum / prod / max / min / avg over int8 .. float64, bf16 and fp16, in and out of place, exact
//   bf16_sum        bf16 sums as NCCL's ring rounds them (one rounding per hop), the same bits on every rank, and
//                   their error at the 27B's hidden size against fp32 + one rounding (the TP all-reduce's choice)
//   broadcast       from the last rank, out of place (non-roots pass no sendbuff) and in place
//   order           one stream: recv, recv, all-reduce of what was received; one communicator on two streams with
//                   the first stream held back by an event: its all-reduces still run in issue order
//   two_comms       world and a split sub-communicator (reversed rank order, its own root) created in one group,
//                   used at once on two streams; point-to-point by sub-communicator rank; finalize and destroy
//   bad_args        refusals with ncclInvalidArgument: host / freed / too small buffers, peers and roots out of
//                   range, bad init arguments; a failed call fails its group; the communicator still works after
//   abort_recv      ncclCommAbort while a receive is pending: returns at once, the stream drains, the CUDA context
//                   stays usable, the communicator is refused afterwards, a new one works
//   abort_init      ncclCommAbort of a non-blocking init whose peer never joins: in progress until then, returns at
//                   once, the next communicator works
//   thread_single   MPI without MPI_THREAD_MULTIPLE: ncclCommInitRank refuses with the reason (exit 77 when the MPI
//                   library gives MULTIPLE anyway)
// Planted defects: the emulation must report them with a clear message (the ctest entries match it), then the
// program exits 1 as a real one would:
//   unmatched_send  rank 0 sends, rank 1 never receives: the timeout names both ranks and the operation
//   send_send       ranks 0 and 1 both send then receive outside a group: the deadlock is reported on both
//   duplicate_device two ranks on one emulated device: ncclInvalidUsage, "Duplicate GPU detected"
// Any failed check prints "nccl_emu_check [rank r] CASE: FAILED: ..." (the ctest entries fail on it).
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/mpi_init.h"

namespace {

int wrank = 0, wsize = 1, failures = 0;
std::string case_name;

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

bool expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "nccl_emu_check [rank %d] %s: FAILED: %s\n", wrank, case_name.c_str(), what.c_str());
    ++failures;
  }
  return ok;
}

void note(const std::string& what) {
  std::printf("nccl_emu_check [rank %d] %s: %s\n", wrank, case_name.c_str(), what.c_str());
  std::fflush(stdout);
}

std::string str(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string str(const char* f, ...) {
  va_list ap;
  va_start(ap, f);
  char b[1024];
  std::vsnprintf(b, sizeof b, f, ap);
  va_end(ap);
  return b;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    expect(false, str("%s: %s", what, cudaGetErrorString(e)));
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

// A non-blocking call's result, settled as lib/comm/nccl_transport.cpp does: poll ncclCommGetAsyncError.
ncclResult_t settle(ncclComm_t comm, ncclResult_t rc, const char* what) {
  const auto t0 = Clock::now();
  while (rc == ncclInProgress) {
    ncclCommGetAsyncError(comm, &rc);
    if (rc != ncclInProgress) break;
    if (since(t0) > 60) {
      expect(false, str("%s still in progress after 60 s", what));
      return ncclInternalError;
    }
    usleep(100);
  }
  return rc;
}

void nccl_ok(ncclComm_t comm, ncclResult_t rc, const char* what) {
  rc = settle(comm, rc, what);
  if (rc != ncclSuccess) {
    expect(false, str("%s: %s (%s)", what, ncclGetErrorString(rc), ncclGetLastError(comm)));
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

// A communicator over `boot` (its rank 0 makes the id, MPI broadcasts it), as the project's NcclTransport does.
ncclComm_t make_comm(MPI_Comm boot, bool blocking, const char* name = nullptr) {
  int r = 0, n = 1;
  MPI_Comm_rank(boot, &r);
  MPI_Comm_size(boot, &n);
  ncclUniqueId id{};
  if (r == 0 && ncclGetUniqueId(&id) != ncclSuccess) expect(false, "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, boot);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  config.commName = name;
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, n, id, r, &config);
  if (blocking) expect(rc == ncclSuccess, str("blocking init returned %d", int(rc)));
  else expect(rc == ncclInProgress, str("non-blocking init returned %d, not ncclInProgress", int(rc)));
  nccl_ok(comm, rc, "ncclCommInitRankConfig");
  return comm;
}

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { cuda_ok(cudaMalloc(&p, n * sizeof(T) + (n ? 0 : 1)), "cudaMalloc"); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { put(h); }
  ~Dev() { cudaFree(p); }
  // cudaMemcpy from pageable memory may return before the copy lands (CUDA's "API synchronization behavior"), and
  // the NCCL streams here do not wait for the legacy stream: wait for it
  void put(const std::vector<T>& h) {
    cuda_ok(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), "H2D");
    cuda_ok(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize(legacy)");
  }
  std::vector<T> get() const {
    std::vector<T> h(n);
    cuda_ok(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
    return h;
  }
};

cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}

void sync(cudaStream_t s) { cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }

template <typename T>
bool same(const std::vector<T>& a, const std::vector<T>& b, const char* what) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (!(a[i] == b[i]))
      return expect(false, str("%s: element %zu is %.17g, expected %.17g", what, i, double(a[i]), double(b[i])));
  return expect(a.size() == b.size(), str("%s: %zu elements, expected %zu", what, a.size(), b.size()));
}

// ---------------------------------------------------------------------------------------------------------------
int case_sendrecv() {
  if (!expect(wsize >= 2, "needs 2 ranks")) return 1;
  ncclComm_t comm = make_comm(MPI_COMM_WORLD, false);
  int count = 0, rank = -1, dev = -1, mydev = -1;
  ncclCommCount(comm, &count);
  ncclCommUserRank(comm, &rank);
  ncclCommCuDevice(comm, &dev);
  cudaGetDevice(&mydev);
  expect(count == wsize && rank == wrank && dev == mydev,
         str("count %d rank %d device %d (expected %d %d %d)", count, rank, dev, wsize, wrank, mydev));
  cudaStream_t s = new_stream();
  const size_t n = 64;
  std::vector<float> pattern(n);
  for (size_t i = 0; i < n; ++i) pattern[i] = 1000.0f + float(i);

  // 0 -> 1 with the receiver 0.5 s late: NCCL's send completes only once the receive is posted
  MPI_Barrier(MPI_COMM_WORLD);
  if (wrank == 0) {
    Dev<float> a(pattern);
    const auto t0 = Clock::now();
    nccl_ok(comm, ncclSend(a.p, n, ncclFloat32, 1, comm, s), "ncclSend");
    sync(s);
    const double t = since(t0);
    note(str("ncclSend to a receiver 0.5 s late completed after %.3f s", t));
    expect(t >= 0.4, str("the send completed after %.3f s, before rank 1 posted its receive (0.5 s late)", t));
  } else if (wrank == 1) {
    Dev<float> b(n);
    sleep_s(0.5);
    nccl_ok(comm, ncclRecv(b.p, n, ncclFloat32, 0, comm, s), "ncclRecv");
    sync(s);
    same(b.get(), pattern, "received from rank 0");
  }

  // 1 -> 0 with the sender 0.3 s late: the receive waits for it
  MPI_Barrier(MPI_COMM_WORLD);
  if (wrank == 0) {
    Dev<float> b(n);
    const auto t0 = Clock::now();
    nccl_ok(comm, ncclRecv(b.p, n, ncclFloat32, 1, comm, s), "ncclRecv");
    sync(s);
    const double t = since(t0);
    note(str("ncclRecv from a sender 0.3 s late completed after %.3f s", t));
    expect(t >= 0.2, str("the receive completed after %.3f s, before rank 1 sent (0.3 s late)", t));
    std::vector<float> want(pattern);
    for (auto& v : want) v = -v;
    same(b.get(), want, "received from rank 1");
  } else if (wrank == 1) {
    std::vector<float> neg(pattern);
    for (auto& v : neg) v = -v;
    Dev<float> a(neg);
    sleep_s(0.3);
    nccl_ok(comm, ncclSend(a.p, n, ncclFloat32, 0, comm, s), "ncclSend");
    sync(s);
  }

  // fan-in outside groups: every rank r > 0 sends r's pattern; rank 0 receives them in rank order on one stream
  MPI_Barrier(MPI_COMM_WORLD);
  const size_t m = 5000;  // 20 kB: past the eager limit of shared memory transports
  auto mine = [&](int r) {
    std::vector<int32_t> v(m);
    for (size_t i = 0; i < m; ++i) v[i] = int32_t(r * 1000003 + int(i));
    return v;
  };
  if (wrank == 0) {
    std::vector<std::unique_ptr<Dev<int32_t>>> in;
    for (int r = 1; r < wsize; ++r) {
      in.push_back(std::make_unique<Dev<int32_t>>(m));
      nccl_ok(comm, ncclRecv(in.back()->p, m, ncclInt32, r, comm, s), "ncclRecv");
    }
    sync(s);
    for (int r = 1; r < wsize; ++r) same(in[size_t(r - 1)]->get(), mine(r), str("fan-in from rank %d", r).c_str());
  } else {
    Dev<int32_t> a(mine(wrank));
    nccl_ok(comm, ncclSend(a.p, m, ncclInt32, 0, comm, s), "ncclSend");
    sync(s);
  }
  // count 0: a no-op that still takes its place on the stream (NULL buffers allowed)
  nccl_ok(comm, ncclSend(nullptr, 0, ncclFloat32, (wrank + 1) % wsize, comm, s), "ncclSend of 0 elements");
  sync(s);
  ncclResult_t async = ncclInternalError;
  ncclCommGetAsyncError(comm, &async);
  expect(async == ncclSuccess, str("async error %d after the exchanges", int(async)));
  expect(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy (flushes without ncclCommFinalize)");
  cudaStreamDestroy(s);
  return 0;
}

int case_ring() {
  ncclComm_t comm = make_comm(MPI_COMM_WORLD, false);
  cudaStream_t s = new_stream();
  const int to = (wrank + 1) % wsize, from = (wrank + wsize - 1) % wsize;
  const size_t n = 3000;
  auto pattern = [&](int r, int k) {
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = int32_t(k * 10000000 + r * 100000 + int(i));
    return v;
  };
  Dev<int32_t> a(pattern(wrank, 1)), b(pattern(wrank, 2)), x(n), y(n);
  // in one group: receives before sends (would deadlock outside a group), two operations per peer: same-peer
  // calls of a group run in order, so x gets the peer's first send and y its second
  nccl_ok(comm, ncclGroupStart(), "ncclGroupStart");
  nccl_ok(comm, ncclGroupStart(), "ncclGroupStart (nested)");
  nccl_ok(comm, ncclRecv(x.p, n, ncclInt32, from, comm, s), "ncclRecv");
  nccl_ok(comm, ncclRecv(y.p, n, ncclInt32, from, comm, s), "ncclRecv");
  nccl_ok(comm, ncclGroupEnd(), "ncclGroupEnd (nested)");
  nccl_ok(comm, ncclSend(a.p, n, ncclInt32, to, comm, s), "ncclSend");
  nccl_ok(comm, ncclSend(b.p, n, ncclInt32, to, comm, s), "ncclSend");
  const auto t0 = Clock::now();
  nccl_ok(comm, ncclGroupEnd(), "ncclGroupEnd");
  sync(s);
  note(str("ring of %d ranks in one group: %.3f s", wsize, since(t0)));
  same(x.get(), pattern(from, 1), "first receive from the previous rank");
  same(y.get(), pattern(from, 2), "second receive from the previous rank");
  expect(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");
  cudaStreamDestroy(s);
  return 0;
}

// One all-reduce checked against the fold of every rank's contribution gen(r, i), computed here.
template <typename T>
void check_reduce(ncclComm_t comm, cudaStream_t s, ncclDataType_t dt, ncclRedOp_t op, const char* what,
                  const std::function<T(int, size_t)>& gen, bool in_place, size_t n = 257) {
  std::vector<T> x(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = gen(wrank, i);
    T acc = gen(0, i);
    for (int r = 1; r < wsize; ++r) {
      const T v = gen(r, i);
      acc = op == ncclProd ? T(acc * v) : op == ncclMax ? std::max(acc, v) : op == ncclMin ? std::min(acc, v)
                                                                             : T(acc + v);
    }
    want[i] = op == ncclAvg ? T(acc / T(wsize)) : acc;
  }
  Dev<T> in(x), out(n);
  T* dst = in_place ? in.p : out.p;
  nccl_ok(comm, ncclAllReduce(in.p, dst, n, dt, op, comm, s), what);
  sync(s);
  same(in_place ? in.get() : out.get(), want, what);
}

uint16_t bf16(float f) {  // exact for the small integers used here
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}
float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t fp16_int(int v) {  // small non-negative integers as IEEE half
  if (v == 0) return 0;
  int e = 0;
  while ((v >> e) > 1) ++e;
  const int mant = (v << (10 - e)) & 0x3ff;
  return uint16_t(((e + 15) << 10) | mant);
}

int case_allreduce() {
  ncclComm_t comm = make_comm(MPI_COMM_WORLD, false);
  cudaStream_t s = new_stream();
  const int n = wsize;
  // the production sums, exact: sum over r of (r + 1)(i + 1) = (i + 1) n (n + 1) / 2
  check_reduce<float>(comm, s, ncclFloat32, ncclSum, "float32 sum",
                      [](int r, size_t i) { return float((r + 1) * (int(i) + 1)); }, false, 1000);
  check_reduce<double>(comm, s, ncclFloat64, ncclSum, "float64 sum in place",
                       [](int r, size_t i) { return double((r + 1) * (int(i) + 1)) + 0.25; }, true, 1000);
  check_reduce<int32_t>(comm, s, ncclInt32, ncclSum, "int32 sum",
                        [](int r, size_t i) { return int32_t((r + 1) * (int(i) - 500)); }, false, 1000);
  {  // spot values, independent of the generic fold
    Dev<float> one(std::vector<float>{float(wrank + 1), -2.5f});
    nccl_ok(comm, ncclAllReduce(one.p, one.p, 2, ncclFloat32, ncclSum, comm, s), "spot sum");
    sync(s);
    same(one.get(), std::vector<float>{float(n * (n + 1) / 2), -2.5f * float(n)}, "spot float32 sum");
  }
  check_reduce<int8_t>(comm, s, ncclInt8, ncclMax, "int8 max",
                       [](int r, size_t i) { return int8_t(int((r * 37 + int(i) * 11) % 200) - 100); }, false);
  check_reduce<uint8_t>(comm, s, ncclUint8, ncclMin, "uint8 min",
                        [](int r, size_t i) { return uint8_t((r * 53 + int(i) * 7) % 251); }, true);
  check_reduce<uint32_t>(comm, s, ncclUint32, ncclMax, "uint32 max",
                         [](int r, size_t i) { return uint32_t(4000000000u - uint32_t(r) * 977u * uint32_t(i)); },
                         false);
  check_reduce<int64_t>(comm, s, ncclInt64, ncclProd, "int64 prod",
                        [](int r, size_t i) { return int64_t(r + 2) * (i % 2 ? -1 : 1); }, false);
  check_reduce<uint64_t>(comm, s, ncclUint64, ncclSum, "uint64 sum",
                         [](int r, size_t i) { return (uint64_t(1) << 40) + uint64_t(r) * 1000 + i; }, false);
  check_reduce<float>(comm, s, ncclFloat32, ncclMin, "float32 min",
                      [](int r, size_t i) { return float(r) * 0.5f - float(i % 7); }, false);
  check_reduce<double>(comm, s, ncclFloat64, ncclProd, "float64 prod",
                       [](int r, size_t i) { return double(r + 1) * 0.5; }, false);
  check_reduce<double>(comm, s, ncclFloat64, ncclAvg, "float64 avg",
                       [](int r, size_t i) { return double((r + 1) * 2) + double(i); }, false);
  check_reduce<int32_t>(comm, s, ncclInt32, ncclAvg, "int32 avg (truncating)",
                        [](int r, size_t i) { return int32_t(r + int(i)); }, false);
  {  // bf16 and fp16 sums of small integers are exact
    std::vector<uint16_t> b(9), h(9);
    for (int i = 0; i < 9; ++i) b[size_t(i)] = bf16(float((wrank + 1) * i)), h[size_t(i)] = fp16_int((wrank + 1) * i);
    Dev<uint16_t> db(b), dh(h);
    nccl_ok(comm, ncclAllReduce(db.p, db.p, 9, ncclBfloat16, ncclSum, comm, s), "bf16 sum");
    nccl_ok(comm, ncclAllReduce(dh.p, dh.p, 9, ncclFloat16, ncclSum, comm, s), "fp16 sum");
    sync(s);
    const auto gb = db.get(), gh = dh.get();
    for (int i = 0; i < 9; ++i) {
      const int want = i * n * (n + 1) / 2;
      expect(from_bf16(gb[size_t(i)]) == float(want), str("bf16 sum [%d]: %g, expected %d", i,
                                                           double(from_bf16(gb[size_t(i)])), want));
      expect(gh[size_t(i)] == fp16_int(want), str("fp16 sum [%d]: 0x%04x, expected 0x%04x", i, gh[size_t(i)],
                                                  fp16_int(want)));
    }
  }
  // count 0: no-op, NULL buffers allowed
  nccl_ok(comm, ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm, s), "all-reduce of 0 elements");
  sync(s);
  expect(ncclCommFinalize(comm) == ncclInProgress, "non-blocking ncclCommFinalize returns ncclInProgress");
  nccl_ok(comm, ncclInProgress, "ncclCommFinalize (polled)");
  expect(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");
  cudaStreamDestroy(s);
  return 0;
}

uint16_t bf16_rne(float f) {  // round to nearest even (finite inputs), as a GEMM's bf16 output and NCCL's sum
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// bf16_sum: NCCL's bf16 ring sum (one rounding per hop: kernels/cuda/emu/nccl.cpp, ring_sum16) and what it costs
// the target's TP all-reduce (layout.tp_allreduce). Each rank's partial row-parallel output, rows x H = 5120 (the
// 27B's hidden size): in fp32 as the GEMM accumulates it, sigma_c * z with z ~ N(0, 1) independent per rank
// (channel c's sigma 1, every 512th channel an outlier of sigma 50 whose partials share a sign across ranks, as the
// massive activations of Qwen's residual stream), then rounded to bf16 as the bf16 GEMM writes it. Two paths:
//   fp32: widened, all-reduced in fp32, rounded once to bf16 (what the MPI path and tp_allreduce: fp32 do)
//   bf16: ncclBfloat16 sum (n - 1 roundings of partial sums)
// Checked: the bf16 result is the ring's, recomputed here from every rank's input (chunk c of ceil(count / n)
// starts on rank c + 1), the same bits on every rank; both paths within their first-order bounds against the
// exact sum of the bf16 partials (fp32: 2^-9 |sum| + the fp32 sum's own; bf16: 2^-9 times the sum of the |partial
// sums| each hop rounds, the error so far included). Printed: RMS and max errors relative to rms(sum), for the partials' own rounding too.
int case_bf16_sum() {
  ncclComm_t comm = make_comm(MPI_COMM_WORLD, false);
  cudaStream_t s = new_stream();
  const int n = wsize, H = 5120, rows = 64;
  const size_t count = size_t(rows) * H;
  // every rank's partials (each rank draws all of them from one seed, so it knows its peers' inputs)
  std::vector<std::vector<float>> exact(static_cast<size_t>(n), std::vector<float>(count));
  std::vector<std::vector<uint16_t>> part(static_cast<size_t>(n), std::vector<uint16_t>(count));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  const auto uniform = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (double((state >> 11) & ((1ull << 53) - 1)) + 0.5) / double(1ull << 53);
  };
  const auto normal = [&] { return std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); };
  for (size_t i = 0; i < count; ++i) {
    const bool outlier = (i % H) % 512 == 7;
    const double sign = uniform() < 0.5 ? -1 : 1;
    for (int r = 0; r < n; ++r) {
      const double v = outlier ? 50 * sign * (1 + 0.3 * normal()) : normal();
      exact[size_t(r)][i] = float(v);
      part[size_t(r)][i] = bf16_rne(float(v));
    }
  }
  Dev<uint16_t> d16(part[size_t(wrank)]);
  std::vector<float> wide(count);
  for (size_t i = 0; i < count; ++i) wide[i] = from_bf16(part[size_t(wrank)][i]);
  Dev<float> d32(wide);
  nccl_ok(comm, ncclAllReduce(d16.p, d16.p, count, ncclBfloat16, ncclSum, comm, s), "bf16 sum");
  nccl_ok(comm, ncclAllReduce(d32.p, d32.p, count, ncclFloat32, ncclSum, comm, s), "fp32 sum");
  sync(s);
  const std::vector<uint16_t> got16 = d16.get();
  const std::vector<float> got32 = d32.get();

  // the ring, recomputed: chunk c starts on rank c + 1, each hop adds the next rank's value and rounds
  const size_t chunk = (count + size_t(n) - 1) / size_t(n);
  const double u = std::ldexp(1.0, -8);  // bf16's unit roundoff (8 significant bits, round to nearest)
  double se16 = 0, se32 = 0, separt = 0, sf16 = 0, sf32 = 0, ssum = 0, max16 = 0, max32 = 0;
  size_t ring_mismatch = 0, bound16 = 0, bound32 = 0;
  for (size_t i = 0; i < count; ++i) {
    const int c = int(i / chunk);
    float acc = from_bf16(part[size_t((c + 1) % n)][i]);
    double hop_bound = 0, sum = from_bf16(part[size_t((c + 1) % n)][i]), full = 0;
    for (int k = 2; k <= n; ++k) {
      sum += double(from_bf16(part[size_t((c + k) % n)][i]));
      acc = from_bf16(bf16_rne(acc + from_bf16(part[size_t((c + k) % n)][i])));
      // this hop's rounding of a value within hop_bound of the exact partial sum (+ the float add's own rounding)
      hop_bound += (u + std::ldexp(1.0, -23)) * (std::fabs(sum) + hop_bound);
    }
    double abs_sum = 0;
    for (int r = 0; r < n; ++r) {
      full += double(exact[size_t(r)][i]);
      abs_sum += std::fabs(double(from_bf16(part[size_t(r)][i])));
    }
    ring_mismatch += got16[i] != bf16_rne(acc) || (n == 1 && got16[i] != part[0][i]);
    const double e16 = double(from_bf16(got16[i])) - sum;
    const double e32 = double(from_bf16(bf16_rne(got32[i]))) - sum;
    bound16 += std::fabs(e16) > hop_bound + 1e-30;
    const double fp32_sum = n * std::ldexp(1.0, -24) * abs_sum;  // the fp32 ring's own error, before the rounding
    bound32 += std::fabs(e32) > u * (std::fabs(sum) + fp32_sum) + fp32_sum + 1e-30;
    se16 += e16 * e16;
    se32 += e32 * e32;
    separt += (sum - full) * (sum - full);
    sf16 += (e16 + sum - full) * (e16 + sum - full);
    sf32 += (e32 + sum - full) * (e32 + sum - full);
    ssum += sum * sum;
    max16 = std::max(max16, std::fabs(e16));
    max32 = std::max(max32, std::fabs(e32));
  }
  expect(ring_mismatch == 0, str("%zu of %zu bf16 sums differ from NCCL's ring", ring_mismatch, count));
  expect(bound16 == 0 && bound32 == 0, str("outside the first-order bound: bf16 %zu, fp32 %zu", bound16, bound32));
  // the same bits on every rank
  std::vector<uint16_t> rank0 = got16;
  MPI_Bcast(rank0.data(), int(count), MPI_UINT16_T, 0, MPI_COMM_WORLD);
  same(got16, rank0, "bf16 sum, against rank 0's");
  const double rms = std::sqrt(ssum / double(count));
  const double r16 = std::sqrt(se16 / double(count)) / rms, r32 = std::sqrt(se32 / double(count)) / rms;
  const auto rel = [&](double se) { return std::sqrt(se / double(count)) / rms; };
  if (wrank == 0)
    note(str("TP %d, %d x %d, error / rms(sum): against the exact sum of the bf16 partials: bf16 ring RMS %.3e max "
             "%.3e, fp32 + one rounding RMS %.3e max %.3e (ring / fp32 RMS %.2f); against the sum of the fp32 "
             "partials (the GEMMs' bf16 rounding included, RMS %.3e alone): bf16 ring RMS %.3e, fp32 path RMS "
             "%.3e (ratio %.2f)", n, rows, H, r16, max16 / rms, r32, max32 / rms, r32 > 0 ? r16 / r32 : 0.0,
             rel(separt), rel(sf16), rel(sf32), sf32 > 0 ? std::sqrt(sf16 / sf32) : 0.0));
  // one rounding to bf16 is ~2^-7 / sqrt(12) ~ 1.1e-3 .. 2.3e-3 RMS relative (the ulp is 2^-8 .. 2^-7 of the
  // value); n - 1 hops over partial sums of 2 .. n terms: at most sqrt(n) times the fp32 path's one rounding
  expect(r32 < 2.5e-3 && r16 < std::sqrt(double(n)) * 2.5e-3,
         str("RMS errors %.3e (fp32 path) and %.3e (bf16 ring) above 2.5e-3 and sqrt(n) 2.5e-3", r32, r16));
  expect(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");
  cudaStreamDestroy(s);
  return 0;
}

int case_broadcast() {
  ncclComm_t comm = make_comm(MPI_COMM_WORLD, false);
  cudaStream_t s = new_stream();
  const int root = wsize - 1;
  std::vector<int64_t> pattern(17);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = 7000 + int64_t(i) * (root + 1);
  Dev<int64_t> src(wrank == root ? pattern : std::vector<int64_t>(17, -1)), dst(17);
  // out of place; non-roots pass no sendbuff (NCCL reads it on the root only)
  nccl_ok(comm, ncclBroadcast(wrank == root ? src.p : nullptr, dst.p, 17, ncclInt64, root, comm, s), "ncclBroadcast");
  sync(s);
  same(dst.get(), pattern, "broadcast from the last rank");
  // in place from rank 1 % size, doubles
  const int root2 = 1 % wsize;
  std::vector<double> d(5, -1.0), want{0.5, 1.5, 2.5, 3.5, 4.5};
  if (wrank == root2) d = want;
  Dev<double> inplace(d);
  nccl_ok(comm, ncclBroadcast(inplace.p, inplace.p, 5, ncclFloat64, root2, comm, s), "ncclBroadcast in place");
  sync(s);
  same(inplace.get(), want, "in-place broadcast");
  expect(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");
  cudaStreamDestroy(s);
  return 0;
}

int case_order() {
  if (!expect(wsize >= 2, "needs 2 ranks")) return 1;
  ncclComm_t comm = make_comm(MPI_COMM_WORLD, false, "order-a");
  ncclComm_t other = make_comm(MPI_COMM_WORLD, true, "order-b");
  cudaStream_t s = new_stream();
  const size_t n = 100;
  std::vector<float> A(n), B(n), zero(n, 0.0f);
  for (size_t i = 0; i < n; ++i) A[i] = 11.0f + float(i), B[i] = 22.0f + float(i);
  // one stream: rank 0 sends A then B; rank 1 receives X then Y, then all ranks all-reduce what rank 1 got in Y
  Dev<float> a(A), b(B), x(n), y(wrank == 1 ? std::vector<float>(n, -7.0f) : zero), z(n);
  if (wrank == 0) {
    nccl_ok(comm, ncclSend(a.p, n, ncclFloat32, 1, comm, s), "ncclSend A");
    nccl_ok(comm, ncclSend(b.p, n, ncclFloat32, 1, comm, s), "ncclSend B");
  } else if (wrank == 1) {
    nccl_ok(comm, ncclRecv(x.p, n, ncclFloat32, 0, comm, s), "ncclRecv X");
    nccl_ok(comm, ncclRecv(y.p, n, ncclFloat32, 0, comm, s), "ncclRecv Y");
  }
  nccl_ok(comm, ncclAllReduce(y.p, z.p, n, ncclFloat32, ncclSum, comm, s), "ncclAllReduce of Y");
  sync(s);
  if (wrank == 1) {
    same(x.get(), A, "first receive got the first send");
    same(y.get(), B, "second receive got the second send");
  }
  same(z.get(), B, "the all-reduce queued after the receives reduced the received data");
  // a group's sends to one peer go in issue order (NCCL: same-peer calls of a group run in order), as seen by a
  // receiver outside any group
  std::vector<float> C(n), D(n);
  for (size_t i = 0; i < n; ++i) C[i] = 33.0f + float(i), D[i] = 44.0f + float(i);
  Dev<float> c(C), d(D), x2(n), y2(n);
  if (wrank == 0) {
    nccl_ok(comm, ncclGroupStart(), "ncclGroupStart");
    nccl_ok(comm, ncclSend(c.p, n, ncclFloat32, 1, comm, s), "ncclSend C");
    nccl_ok(comm, ncclSend(d.p, n, ncclFloat32, 1, comm, s), "ncclSend D");
    nccl_ok(comm, ncclGroupEnd(), "ncclGroupEnd");
  } else if (wrank == 1) {
    nccl_ok(comm, ncclRecv(x2.p, n, ncclFloat32, 0, comm, s), "ncclRecv X2");
    nccl_ok(comm, ncclRecv(y2.p, n, ncclFloat32, 0, comm, s), "ncclRecv Y2");
  }
  sync(s);
  if (wrank == 1) {
    same(x2.get(), C, "the first receive got the group's first send");
    same(y2.get(), D, "the second receive got the group's second send");
  }

  // One communicator on two streams: rank 0 holds its first stream back behind an event that completes only when
  // a message from rank 1 arrives (0.3 s late, on another communicator). Its two all-reduces must still be posted
  // in issue order, or they would pair with rank 1's in the wrong order.
  MPI_Barrier(MPI_COMM_WORLD);
  cudaStream_t s1 = new_stream(), s2 = new_stream(), gate = new_stream();
  cudaEvent_t opened;
  cuda_ok(cudaEventCreateWithFlags(&opened, cudaEventDisableTiming), "cudaEventCreate");
  Dev<int32_t> token(1), first(std::vector<int32_t>(8, 1 + wrank)), second(std::vector<int32_t>(8, 100 * (wrank + 1)));
  if (wrank == 0) {
    nccl_ok(other, ncclRecv(token.p, 1, ncclInt32, 1, other, gate), "ncclRecv (gate)");
    cuda_ok(cudaEventRecord(opened, gate), "cudaEventRecord");
    cuda_ok(cudaStreamWaitEvent(s1, opened, 0), "cudaStreamWaitEvent");
    nccl_ok(comm, ncclAllReduce(first.p, first.p, 8, ncclInt32, ncclSum, comm, s1), "first all-reduce (held back)");
    nccl_ok(comm, ncclAllReduce(second.p, second.p, 8, ncclInt32, ncclSum, comm, s2), "second all-reduce");
    sync(s2);  // returns only once the first one could go
  } else {
    nccl_ok(comm, ncclAllReduce(first.p, first.p, 8, ncclInt32, ncclSum, comm, s2), "first all-reduce");
    nccl_ok(comm, ncclAllReduce(second.p, second.p, 8, ncclInt32, ncclSum, comm, s1), "second all-reduce");
    if (wrank == 1) {
      sleep_s(0.3);
      nccl_ok(other, ncclSend(token.p, 1, ncclInt32, 0, other, gate), "ncclSend (gate)");
      sync(gate);  // waited for first: with DFLASH_EMU_LAG_MS large, queued work runs only once waited for
    }
    sync(s1);
    sync(s2);
  }
  sync(s1);
  sync(gate);
  const int n1 = wsize * (wsize + 1) / 2;
  same(first.get(), std::vector<int32_t>(8, n1), "first all-reduce across streams");
  same(second.get(), std::vector<int32_t>(8, 100 * n1), "second all-reduce across streams");
  cudaEventDestroy(opened);
  expect(ncclCommDestroy(comm) == ncclSuccess && ncclCommDestroy(other) == ncclSuccess, "ncclCommDestroy");
  for (cudaStream_t t : {s, s1, s2, gate}) cudaStreamDestroy(t);
  return 0;
}

int case_two_comms() {
  // sub-communicators: world ranks {0, 1} and {2, ...}, numbered in reverse world order (rank != world rank)
  MPI_Comm sub_mpi;
  const int color = wrank < 2 ? 0 : 1;
  MPI_Comm_split(MPI_COMM_WORLD, color, -wrank, &sub_mpi);
  int srank = 0, ssize = 1;
  MPI_Comm_rank(sub_mpi, &srank);
  MPI_Comm_size(sub_mpi, &ssize);
  ncclUniqueId wid{}, sid{};
  if (wrank == 0) ncclGetUniqueId(&wid);
  if (srank == 0) ncclGetUniqueId(&sid);  // the sub-communicator's root is not world rank 0
  MPI_Bcast(&wid, sizeof wid, MPI_BYTE, 0, MPI_COMM_WORLD);
  MPI_Bcast(&sid, sizeof sid, MPI_BYTE, 0, sub_mpi);
  // both created in one group: ncclGroupEnd waits for the blocking ones (NCCL: "waits for all communicators")
  ncclConfig_t wcfg = NCCL_CONFIG_INITIALIZER, scfg = NCCL_CONFIG_INITIALIZER;
  wcfg.blocking = 0;
  wcfg.commName = "world";
  scfg.blocking = 1;
  scfg.commName = "sub";
  ncclComm_t world = nullptr, sub = nullptr;
  nccl_ok(nullptr, ncclGroupStart(), "ncclGroupStart");
  expect(ncclCommInitRankConfig(&world, wsize, wid, wrank, &wcfg) == ncclSuccess, "init in a group returns success");
  expect(ncclCommInitRankConfig(&sub, ssize, sid, srank, &scfg) == ncclSuccess, "init in a group returns success");
  const ncclResult_t ge = ncclGroupEnd();
  expect(ge == ncclInProgress, str("ncclGroupEnd with a non-blocking init returned %d", int(ge)));
  nccl_ok(world, ge, "world init");
  int r = -1, c = -1;
  ncclCommUserRank(sub, &r);
  ncclCommCount(sub, &c);
  expect(r == srank && c == ssize, str("sub rank %d of %d, expected %d of %d", r, c, srank, ssize));

  cudaStream_t s1 = new_stream(), s2 = new_stream();
  Dev<double> w1(std::vector<double>(64, double(wrank + 1))), w2(std::vector<double>(64, double(1 << wrank)));
  Dev<double> t1(std::vector<double>(64, double(wrank * 10))), t2(std::vector<double>(64, double(wrank) + 0.5));
  // interleaved on two streams, each communicator on its own
  nccl_ok(world, ncclAllReduce(w1.p, w1.p, 64, ncclFloat64, ncclSum, world, s1), "world all-reduce 1");
  nccl_ok(sub, ncclAllReduce(t1.p, t1.p, 64, ncclFloat64, ncclSum, sub, s2), "sub all-reduce 1");
  nccl_ok(world, ncclAllReduce(w2.p, w2.p, 64, ncclFloat64, ncclMax, world, s1), "world all-reduce 2");
  nccl_ok(sub, ncclAllReduce(t2.p, t2.p, 64, ncclFloat64, ncclMin, sub, s2), "sub all-reduce 2");
  // point-to-point by sub-communicator rank: the last sub rank sends to sub rank 0 (world 1 -> world 0 for {0, 1});
  // a single-rank sub-communicator sends to itself in a group
  std::vector<int32_t> msg(33);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = int32_t(wrank * 1000 + int(i));
  Dev<int32_t> out(msg), in(33);
  nccl_ok(sub, ncclGroupStart(), "ncclGroupStart");
  if (srank == ssize - 1) nccl_ok(sub, ncclSend(out.p, 33, ncclInt32, 0, sub, s2), "sub ncclSend");
  if (srank == 0) nccl_ok(sub, ncclRecv(in.p, 33, ncclInt32, ssize - 1, sub, s2), "sub ncclRecv");
  nccl_ok(sub, ncclGroupEnd(), "ncclGroupEnd");
  sync(s1);
  sync(s2);
  std::vector<int> members;
  for (int w = 0; w < wsize; ++w)
    if ((w < 2 ? 0 : 1) == color) members.push_back(w);
  double wsum = 0, wmax = 0, ssum = 0, smin = 1e300;
  for (int w = 0; w < wsize; ++w) wsum += w + 1, wmax = std::max(wmax, double(1 << w));
  for (int w : members) ssum += w * 10, smin = std::min(smin, w + 0.5);
  same(w1.get(), std::vector<double>(64, wsum), "world sum");
  same(w2.get(), std::vector<double>(64, wmax), "world max");
  same(t1.get(), std::vector<double>(64, ssum), "sub sum");
  same(t2.get(), std::vector<double>(64, smin), "sub min");
  if (srank == 0) {
    std::vector<int32_t> want(33);
    const int from_world = members.front();  // sub rank ssize-1 is the lowest world rank (keys reversed)
    for (size_t i = 0; i < want.size(); ++i) want[i] = int32_t(from_world * 1000 + int(i));
    same(in.get(), want, "sub-communicator point-to-point");
  }
  // finalize: non-blocking reports through ncclCommGetAsyncError, blocking flushes in the call
  expect(ncclCommFinalize(world) == ncclInProgress, "non-blocking ncclCommFinalize returns ncclInProgress");
  nccl_ok(world, ncclInProgress, "world ncclCommFinalize");
  expect(ncclCommFinalize(sub) == ncclSuccess, "blocking ncclCommFinalize returns ncclSuccess");
  expect(ncclCommDestroy(world) == ncclSuccess && ncclCommDestroy(sub) == ncclSuccess, "ncclCommDestroy");
  expect(ncclAllReduce(w1.p, w1.p, 1, ncclFloat64, ncclSum, world, s1) == ncclInvalidArgument,
         "a destroyed communicator is refused");
  MPI_Comm_free(&sub_mpi);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  return 0;
}

int case_bad_args() {
  if (!expect(wsize >= 2, "needs 2 ranks")) return 1;
  {  // init arguments
    ncclUniqueId id{};
    if (wrank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t c = nullptr;
    expect(ncclCommInitRank(&c, wsize, id, -1) == ncclInvalidArgument && !c, "rank -1 refused");
    expect(ncclCommInitRank(&c, wsize, id, wsize) == ncclInvalidArgument, "rank == nranks refused");
    expect(ncclCommInitRank(&c, 0, id, 0) == ncclInvalidArgument, "nranks 0 refused");
    ncclUniqueId junk;
    std::memset(&junk, 0x5a, sizeof junk);
    expect(ncclCommInitRank(&c, wsize, junk, wrank) == ncclInvalidArgument, "an id not from ncclGetUniqueId refused");
    expect(contains(ncclGetLastError(nullptr), "ncclGetUniqueId"), "the last error names the id's origin");
  }
  ncclComm_t comm = make_comm(MPI_COMM_WORLD, false);
  cudaStream_t s = new_stream();
  const int peer = (wrank ^ 1) < wsize ? (wrank ^ 1) : wrank;  // pairs (0,1) (2,3) ...; an odd last rank: itself
  std::vector<float> host(16, 1.0f);
  Dev<float> small(16);
  auto refused = [&](ncclResult_t rc, const char* what, const char* words) {
    const std::string last = ncclGetLastError(comm);
    expect(rc == ncclInvalidArgument, str("%s: returned %d, not ncclInvalidArgument", what, int(rc)));
    expect(contains(last, words), str("%s: the message '%s' lacks '%s'", what, last.c_str(), words));
  };
  refused(ncclSend(host.data(), 16, ncclFloat32, peer, comm, s), "a host pointer", "not device memory");
  refused(ncclAllReduce(small.p, small.p, 32, ncclFloat32, ncclSum, comm, s), "a buffer too small",
          "runs past its end");
  refused(ncclRecv(small.p + 8, 9, ncclFloat32, peer, comm, s), "a range past the end", "runs past its end");
  float* freed = nullptr;
  cuda_ok(cudaMalloc(&freed, 64), "cudaMalloc");
  cuda_ok(cudaFree(freed), "cudaFree");
  refused(ncclRecv(freed, 16, ncclFloat32, peer, comm, s), "a freed pointer", "not device memory");
  refused(ncclSend(small.p, 16, ncclFloat32, wsize, comm, s), "peer == nranks", "not a rank of the communicator");
  refused(ncclBroadcast(small.p, small.p, 16, ncclFloat32, -1, comm, s), "root -1", "not a rank of the communicator");
  refused(ncclSend(small.p, 16, ncclDataType_t(42), peer, comm, s), "an unknown datatype", "not emulated");
  // a failed call fails its group: the good send before it is not issued either
  Dev<float> good(std::vector<float>(16, -3.0f)), got(16);
  nccl_ok(comm, ncclGroupStart(), "ncclGroupStart");
  ncclResult_t rc = ncclSend(good.p, 16, ncclFloat32, peer, comm, s);
  expect(rc == ncclSuccess, "a good send inside a group");
  refused(ncclRecv(host.data(), 16, ncclFloat32, peer, comm, s), "a host pointer in a group", "not device memory");
  expect(ncclGroupEnd() == ncclInvalidArgument, "ncclGroupEnd reports the group's failed call");
  expect(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  // the communicator still works, and no stray message of the failed group arrives
  ncclResult_t async = ncclInternalError;
  ncclCommGetAsyncError(comm, &async);
  expect(async == ncclSuccess, str("async error %d after refused calls", int(async)));
  Dev<float> mine(std::vector<float>(16, float(100 + wrank)));
  nccl_ok(comm, ncclGroupStart(), "ncclGroupStart");
  nccl_ok(comm, ncclSend(mine.p, 16, ncclFloat32, peer, comm, s), "ncclSend");
  nccl_ok(comm, ncclRecv(got.p, 16, ncclFloat32, peer, comm, s), "ncclRecv");
  nccl_ok(comm, ncclGroupEnd(), "ncclGroupEnd");
  sync(s);
  same(got.get(), std::vector<float>(16, float(100 + peer)), "exchange after the refused calls");
  expect(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");
  expect(ncclSend(mine.p, 16, ncclFloat32, peer, comm, s) == ncclInvalidArgument, "a destroyed communicator");
  cudaStreamDestroy(s);
  return 0;
}

int case_abort_recv() {
  if (!expect(wsize >= 2, "needs 2 ranks")) return 1;
  ncclComm_t comm = make_comm(MPI_COMM_WORLD, false);
  cudaStream_t s = new_stream();
  Dev<float> buf(std::vector<float>(32, -1.0f));
  if (wrank == 0) {
    nccl_ok(comm, ncclRecv(buf.p, 32, ncclFloat32, 1, comm, s), "ncclRecv (never matched)");
    sleep_s(0.5);
    expect(cudaStreamQuery(s) == cudaErrorNotReady, "the receive is pending after 0.5 s");
    ncclResult_t async = ncclInternalError;
    ncclCommGetAsyncError(comm, &async);
    expect(async == ncclSuccess, str("no async error while the receive waits (got %d)", int(async)));
    auto t0 = Clock::now();
    expect(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
    const double ta = since(t0);
    t0 = Clock::now();
    const cudaError_t e = cudaStreamSynchronize(s);
    const double ts = since(t0);
    note(str("ncclCommAbort took %.3f s; the stream drained %.3f s later", ta, ts));
    expect(ta < 0.5, str("ncclCommAbort took %.3f s", ta));
    expect(e == cudaSuccess && ts < 2.0, str("the stream drained in %.3f s with %s", ts, cudaGetErrorString(e)));
    expect(cudaGetLastError() == cudaSuccess, "the CUDA context is not sticky after an abort");
    same(buf.get(), std::vector<float>(32, -1.0f), "the abandoned receive wrote nothing");
    expect(ncclSend(buf.p, 32, ncclFloat32, 1, comm, s) == ncclInvalidArgument, "an aborted communicator is refused");
    expect(ncclCommGetAsyncError(comm, &async) == ncclInvalidArgument, "ncclCommGetAsyncError on an aborted one");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (wrank != 0) expect(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy (peer of the aborted rank)");
  // MPI and the emulation still work: a new communicator, an all-reduce
  ncclComm_t again = make_comm(MPI_COMM_WORLD, false);
  Dev<int32_t> one(std::vector<int32_t>{wrank + 1});
  nccl_ok(again, ncclAllReduce(one.p, one.p, 1, ncclInt32, ncclSum, again, s), "ncclAllReduce");
  sync(s);
  same(one.get(), std::vector<int32_t>{wsize * (wsize + 1) / 2}, "all-reduce on a new communicator");
  expect(ncclCommDestroy(again) == ncclSuccess, "ncclCommDestroy");
  cudaStreamDestroy(s);
  return 0;
}

int case_abort_init() {
  // rank 0 starts a non-blocking init of 2 ranks that rank 1 never joins, then gives up as NcclTransport does
  if (!expect(wsize >= 2, "needs 2 ranks")) return 1;
  if (wrank == 0) {
    ncclUniqueId id{};
    ncclGetUniqueId(&id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    expect(ncclCommInitRankConfig(&comm, 2, id, 0, &config) == ncclInProgress && comm, "init in progress");
    const auto t0 = Clock::now();
    ncclResult_t state = ncclSuccess;
    while (since(t0) < 0.5) {
      ncclCommGetAsyncError(comm, &state);
      if (state != ncclInProgress) break;
      usleep(1000);
    }
    expect(state == ncclInProgress, str("init without its peer reported %d, not ncclInProgress", int(state)));
    const auto t1 = Clock::now();
    expect(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort during init");
    note(str("ncclCommAbort of an initialising communicator took %.3f s", since(t1)));
    expect(since(t1) < 0.5, "ncclCommAbort during init returns at once");
    expect(ncclCommGetAsyncError(comm, &state) == ncclInvalidArgument, "the aborted communicator is refused");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // the next communicator of the same root works (its bootstrap tags differ from the abandoned one's)
  ncclComm_t again = make_comm(MPI_COMM_WORLD, false);
  cudaStream_t s = new_stream();
  Dev<int32_t> one(std::vector<int32_t>{wrank + 1});
  nccl_ok(again, ncclAllReduce(one.p, one.p, 1, ncclInt32, ncclSum, again, s), "ncclAllReduce");
  sync(s);
  same(one.get(), std::vector<int32_t>{wsize * (wsize + 1) / 2}, "all-reduce on a new communicator");
  expect(ncclCommDestroy(again) == ncclSuccess, "ncclCommDestroy");
  cudaStreamDestroy(s);
  return 0;
}

// ---- planted defects -------------------------------------------------------------------------------------------
int case_unmatched_send() {
  if (!expect(wsize >= 2, "needs 2 ranks")) return 1;
  ncclComm_t comm = make_comm(MPI_COMM_WORLD, false);
  cudaStream_t s = new_stream();
  if (wrank == 0) {
    Dev<float> a(std::vector<float>(64, 5.0f));
    const auto t0 = Clock::now();
    nccl_ok(comm, ncclSend(a.p, 64, ncclFloat32, 1, comm, s), "ncclSend");
    const cudaError_t e = cudaStreamSynchronize(s);
    const double t = since(t0);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    const std::string last = ncclGetLastError(comm);
    note(str("the unmatched send was released after %.2f s with %s", t, ncclGetErrorString(async)));
    expect(e == cudaSuccess && t >= 2.5 && t < 20, str("the stream drained after %.2f s (timeout 3 s)", t));
    expect(async == ncclRemoteError, str("async error %d, expected ncclRemoteError", int(async)));
    expect(contains(last, "ncclSend(256 bytes to rank 1)") && contains(last, "rank 0 of 2") &&
               contains(last, "for rank 1 to post the matching ncclRecv"),
           "the message names the operation, this rank and the peer: " + last);
    expect(cudaGetLastError() == cudaSuccess, "a hang is not a CUDA fault");
    expect(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
  }
  MPI_Barrier(MPI_COMM_WORLD);  // rank 1 never receives
  if (wrank != 0) ncclCommDestroy(comm);
  cudaStreamDestroy(s);
  return 1;
}

int case_send_send() {
  if (!expect(wsize >= 2, "needs 2 ranks")) return 1;
  ncclComm_t comm = make_comm(MPI_COMM_WORLD, false);
  cudaStream_t s = new_stream();
  if (wrank < 2) {
    const int peer = 1 - wrank;
    Dev<float> a(std::vector<float>(64, 1.0f)), b(64);
    const auto t0 = Clock::now();
    nccl_ok(comm, ncclSend(a.p, 64, ncclFloat32, peer, comm, s), "ncclSend");
    nccl_ok(comm, ncclRecv(b.p, 64, ncclFloat32, peer, comm, s), "ncclRecv");
    const cudaError_t e = cudaStreamSynchronize(s);
    const double t = since(t0);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    const std::string last = ncclGetLastError(comm);
    note(str("send-then-receive on both ranks outside a group was reported after %.2f s", t));
    expect(e == cudaSuccess && t >= 2.5 && t < 20, str("the stream drained after %.2f s (timeout 3 s)", t));
    expect(async == ncclRemoteError, str("async error %d, expected ncclRemoteError", int(async)));
    expect(contains(last, str("ncclSend(256 bytes to rank %d)", peer)) &&
               contains(last, str("rank %d of %d", wrank, wsize)) && contains(last, "deadlocks under NCCL") &&
               contains(last, str("ncclRecv(256 bytes from rank %d) on", peer)) && contains(last, "queued"),
           "the message names the send, the ranks and the receive queued behind it: " + last);
    expect(cudaGetLastError() == cudaSuccess, "a hang is not a CUDA fault");
    expect(ncclCommAbort(comm) == ncclSuccess, "ncclCommAbort");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (wrank >= 2) ncclCommDestroy(comm);
  cudaStreamDestroy(s);
  return 1;
}

int case_duplicate_device() {
  ncclUniqueId id{};
  if (wrank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = settle(comm, ncclCommInitRankConfig(&comm, wsize, id, wrank, &config), "init");
  const std::string last = ncclGetLastError(comm);
  note(str("init of %d ranks on one device: %s", wsize, ncclGetErrorString(rc)));
  expect(rc == ncclInvalidUsage, str("init returned %d, expected ncclInvalidUsage", int(rc)));
  expect(contains(last, "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 0"),
         "the message is NCCL's: " + last);
  if (comm) ncclCommAbort(comm);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  case_name = argc > 1 ? argv[1] : "";
  const bool single = case_name == "thread_single";
  // thread_single asks for less than MPI_THREAD_MULTIPLE on purpose: NCCL's refusal of it is the case
  return dflash::comm::run_mpi_program({"nccl_emu_check", false, single ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE},
                                       argc, argv, [&](bool) {
  int provided = 0;
  MPI_Query_thread(&provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  MPI_Comm_size(MPI_COMM_WORLD, &wsize);
  int code = 0;
  if (single) {
    if (provided >= MPI_THREAD_MULTIPLE) {
      note("skipped: the MPI library gives MPI_THREAD_MULTIPLE when asked for MPI_THREAD_FUNNELED");
      return 77;
    }
    ncclUniqueId id{};
    ncclGetUniqueId(&id);
    ncclComm_t comm = nullptr;
    const ncclResult_t rc = ncclCommInitRank(&comm, 1, id, 0);
    const std::string last = ncclGetLastError(nullptr);
    expect(rc == ncclInvalidUsage && !comm, str("init under MPI thread level %d returned %d", provided, int(rc)));
    expect(contains(last, "MPI_Init_thread(MPI_THREAD_MULTIPLE)"), "the message says what to do: " + last);
  } else {
    expect(provided >= MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE");
    int devices = 0;
    cuda_ok(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    cuda_ok(cudaSetDevice(wrank % devices), "cudaSetDevice");
    const struct {
      const char* name;
      int (*run)();
    } cases[] = {{"sendrecv", case_sendrecv},     {"ring", case_ring},
                 {"allreduce", case_allreduce},   {"broadcast", case_broadcast},
                 {"bf16_sum", case_bf16_sum},
                 {"order", case_order},           {"two_comms", case_two_comms},
                 {"bad_args", case_bad_args},     {"abort_recv", case_abort_recv},
                 {"abort_init", case_abort_init},
                 {"unmatched_send", case_unmatched_send}, {"send_send", case_send_send},
                 {"duplicate_device", case_duplicate_device}};
    bool found = false;
    for (const auto& c : cases)
      if (case_name == c.name) {
        found = true;
        code = c.run();
      }
    if (!found) {
      if (wrank == 0)
        std::fprintf(stderr, "usage: mpirun -np N nccl_emu_check CASE (unknown case '%s')\n", case_name.c_str());
      return 2;
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (wrank == 0)
    std::printf("nccl_emu_check %s on %d rank(s): %s\n", case_name.c_str(), wsize,
                total ? "FAILED" : code ? "planted defect reported (exit 1, as a real run would)" : "ok");
  return total ? 1 : code;
  });
}
