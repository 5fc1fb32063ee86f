// The emulated NCCL: the functions of the toolkit's <nccl.h> that the project calls, over MPI, with NCCL's semantics
// rather than MPI's (NCCL user guide: "Point-to-point communication", "Group Calls", "Creating a Communicator",
// "Error handling and communicator abort"; API pages p2p, group, comms, colls).
//
//   communicators   ncclGetUniqueId names the calling process (MPI_COMM_WORLD rank + a per-process counter). Its
//                   ncclCommInitRank is the root of the bootstrap: the other members send it (rank, host, device)
//                   on MPI_COMM_WORLD under reserved tags, it checks them (a rank twice, two ranks on one device of
//                   one host: "Duplicate GPU detected", ncclInvalidUsage) and answers the member list; then every
//                   member builds a private MPI communicator (MPI_Comm_create_group, collective over the members
//                   only) that carries all later traffic, so nothing clashes with the project's own MPI messages.
//   operations      stream work (runtime.h's Work): run() snapshots the data into host staging and posts the MPI
//                   request (MPI_Issend: a send completes only once its receive is posted, as in NCCL; MPI_Irecv,
//                   MPI_Iallreduce, MPI_Ibcast), poll() tests it without blocking and copies the result back.
//                   bf16 / fp16 sums are all-gathered (MPI_Iallgather) and summed as NCCL's ring rounds them, one
//                   rounding per hop (ring_sum16), not in whatever order MPI's reduction takes.
//                   The operations of one communicator are posted in issue order, whatever their streams.
//   groups          between ncclGroupStart and ncclGroupEnd (nesting counted, per thread) operations are collected;
//                   ncclGroupEnd queues one work item per stream that posts all of that stream's operations at once
//                   (a send and a receive of one group never block each other) and completes when the whole group
//                   has (NCCL blocks every stream of a group until the group is done).
//   hangs           an operation in flight longer than DFLASH_EMU_NCCL_TIMEOUT_S (default 120) is reported on
//                   stderr (rank, peer, operation, the communicator's last operations) and becomes the
//                   communicator's asynchronous error (ncclRemoteError, ncclCommGetAsyncError); its work completes
//                   so that the stream drains. A hang is not a CUDA fault: the CUDA context stays usable.
//   non-blocking    config.blocking = 0: init returns ncclInProgress and completes on a thread; operations and
//                   ncclGroupEnd return ncclInProgress once queued, and ncclCommGetAsyncError reports
//                   ncclInProgress once more before ncclSuccess, so callers' polling loops are exercised.
//
// Staging through host memory matters: device memory is PROT_NONE while the worker is idle (runtime.h), and MPI may
// touch a posted buffer from any thread that calls MPI (or from a peer process through shared memory).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // MPI's C API only (as the dflash target): no libmpi_cxx
#endif
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/emu/runtime.h"

struct ncclComm;

namespace dflash::emu {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string strf(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* f, ...) {
  va_list ap;
  va_start(ap, f);
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// DFLASH_EMU_NCCL_TIMEOUT_S: how long an operation (or a bootstrap step) may wait for its peers before it is
// reported as a hang.
double timeout_s() {
  static const double t = [] {
    const char* v = std::getenv("DFLASH_EMU_NCCL_TIMEOUT_S");
    const double s = v && *v ? std::atof(v) : 120.0;
    return s > 0 ? s : 120.0;
  }();
  return t;
}

void nap() { std::this_thread::sleep_for(std::chrono::microseconds(100)); }

// ---------------------------------------------------------------------------------------------------------------
// Errors: NCCL keeps one last-error string per process (ncclGetLastError); every error is also printed, since the
// return code alone rarely says which argument or peer was wrong.
std::mutex g_error_mu;
std::string g_last_error;

void set_last_error(const std::string& msg) {
  std::lock_guard<std::mutex> lk(g_error_mu);
  g_last_error = msg;
}

void say(const std::string& msg) {
  const std::string line = "emulated NCCL: " + rank_prefix() + msg + "\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

ncclResult_t fail(ncclResult_t rc, const std::string& msg) {
  say(msg);
  set_last_error(msg);
  return rc;
}

const char* result_name(int rc) {
  switch (rc) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "unknown ncclResult_t";
  }
}

std::string stream_name(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy) return "the legacy default stream";
  if (s == cudaStreamPerThread) return "the per-thread default stream";
  return strf("stream %p", static_cast<void*>(s));
}

std::string mpi_error(int rc) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, s, &n);
  return std::string(s, size_t(n));
}

// ---------------------------------------------------------------------------------------------------------------
// Data types and reductions. The 16-bit floats reduce through user MPI operations (float arithmetic, rounded back
// to nearest even); everything else maps onto MPI's predefined types and operations.
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) bits = sign | 0x7f800000 | (mant << 13);
  else if (exp != 0) bits = sign | ((exp + 112) << 23) | (mant << 13);
  else if (mant == 0) bits = sign;
  else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while (!(mant & 0x400));
    bits = sign | (uint32_t(112 - e) << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const uint32_t absx = x & 0x7fffffff;
  if (absx >= 0x7f800000) return uint16_t(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));  // inf / nan
  if (absx >= 0x477ff000) return uint16_t(sign | 0x7c00);                                      // overflow
  if (absx < 0x38800000) {  // subnormal half (or zero): round the shifted mantissa to nearest even
    if (absx < 0x33000000) return sign;
    const uint32_t mant = (absx & 0x7fffff) | 0x800000;
    const int shift = 126 - int(absx >> 23);
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = absx - 0x38000000;  // rebias the exponent (127 -> 15)
  r = (r + 0xfff + ((r >> 13) & 1)) >> 13;
  return uint16_t(sign | r);
}

float bf16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return uint16_t((x >> 16) | 0x40);  // quiet nan
  return uint16_t((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

MPI_Datatype g_half_type = MPI_DATATYPE_NULL, g_bf16_type = MPI_DATATYPE_NULL;
MPI_Op g_half_ops[4];  // sum, prod, max, min over g_half_type / g_bf16_type
std::once_flag g_types_once;

template <int R>
void reduce16(void* in, void* inout, int* len, MPI_Datatype* type) {
  const bool bf = *type == g_bf16_type;
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = bf ? bf16_to_float(a[i]) : half_to_float(a[i]);
    const float y = bf ? bf16_to_float(b[i]) : half_to_float(b[i]);
    const float r = R == 0 ? x + y : R == 1 ? x * y : R == 2 ? std::max(x, y) : std::min(x, y);
    b[i] = bf ? float_to_bf16(r) : float_to_half(r);
  }
}

void make_types() {  // after MPI_Init, on any thread (MPI_THREAD_MULTIPLE)
  std::call_once(g_types_once, [] {
    MPI_Type_contiguous(2, MPI_BYTE, &g_half_type);
    MPI_Type_commit(&g_half_type);
    MPI_Type_contiguous(2, MPI_BYTE, &g_bf16_type);
    MPI_Type_commit(&g_bf16_type);
    MPI_Op_create(&reduce16<0>, 1, &g_half_ops[0]);
    MPI_Op_create(&reduce16<1>, 1, &g_half_ops[1]);
    MPI_Op_create(&reduce16<2>, 1, &g_half_ops[2]);
    MPI_Op_create(&reduce16<3>, 1, &g_half_ops[3]);
  });
}

struct TypeInfo {
  const char* name = "";
  size_t size = 0;
  MPI_Datatype mpi = MPI_DATATYPE_NULL;
  bool f16 = false;    // half or bfloat16: user MPI operations
  bool floating = false;
};

bool type_info(ncclDataType_t t, TypeInfo* out) {
  switch (t) {
    case ncclInt8: *out = {"int8", 1, MPI_INT8_T}; return true;
    case ncclUint8: *out = {"uint8", 1, MPI_UINT8_T}; return true;
    case ncclInt32: *out = {"int32", 4, MPI_INT32_T}; return true;
    case ncclUint32: *out = {"uint32", 4, MPI_UINT32_T}; return true;
    case ncclInt64: *out = {"int64", 8, MPI_INT64_T}; return true;
    case ncclUint64: *out = {"uint64", 8, MPI_UINT64_T}; return true;
    case ncclFloat16: *out = {"float16", 2, g_half_type, true, true}; return true;
    case ncclFloat32: *out = {"float32", 4, MPI_FLOAT, false, true}; return true;
    case ncclFloat64: *out = {"float64", 8, MPI_DOUBLE, false, true}; return true;
    case ncclBfloat16: *out = {"bfloat16", 2, g_bf16_type, true, true}; return true;
    default: return false;  // fp8: not emulated
  }
}

const char* redop_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return nullptr;
  }
}

MPI_Op mpi_op(ncclRedOp_t op, const TypeInfo& t) {
  const int i = op == ncclProd ? 1 : op == ncclMax ? 2 : op == ncclMin ? 3 : 0;  // avg: a sum, divided after
  if (t.f16) return g_half_ops[i];
  return i == 1 ? MPI_PROD : i == 2 ? MPI_MAX : i == 3 ? MPI_MIN : MPI_SUM;
}

// ncclAvg: the sum divided by the number of ranks (integers: truncating division), in place in the staging buffer.
void divide(void* data, size_t n, ncclDataType_t t, int nranks) {
  switch (t) {
#define DFLASH_DIV(NT, T)                                             \
  case NT:                                                            \
    for (size_t i = 0; i < n; ++i) static_cast<T*>(data)[i] /= T(nranks); \
    break;
    DFLASH_DIV(ncclInt8, int8_t)
    DFLASH_DIV(ncclUint8, uint8_t)
    DFLASH_DIV(ncclInt32, int32_t)
    DFLASH_DIV(ncclUint32, uint32_t)
    DFLASH_DIV(ncclInt64, int64_t)
    DFLASH_DIV(ncclUint64, uint64_t)
    DFLASH_DIV(ncclFloat32, float)
    DFLASH_DIV(ncclFloat64, double)
#undef DFLASH_DIV
    case ncclFloat16:
    case ncclBfloat16: {
      auto* p = static_cast<uint16_t*>(data);
      const bool bf = t == ncclBfloat16;
      for (size_t i = 0; i < n; ++i) {
        const float v = (bf ? bf16_to_float(p[i]) : half_to_float(p[i])) / float(nranks);
        p[i] = bf ? float_to_bf16(v) : float_to_half(v);
      }
      break;
    }
    default: break;
  }
}

// A 16-bit float sum (sum, avg) as NCCL's ring all-reduce rounds it (src/device/all_reduce.h, runRing): the buffer is
// cut into nranks chunks of ceil(count / nranks) elements; chunk c starts on ring index c + 1 (its step 0 sends its
// own values), every next rank adds its value to what it received and rounds to the type before sending it on
// (recvReduceSend; FuncSum of two bf16 / fp16 is their float sum rounded to nearest even), and rank c's addition
// gives the total, which the all-gather half copies to everyone: n - 1 roundings of partial sums, the same bits on
// every rank. The ring is in rank order here (NCCL orders it by topology, and splits a large buffer over channels
// and loops, so which rank starts an element's sum varies; the count of roundings does not). `parts` holds the
// ranks' inputs, rank r's element i at parts(r, i); the result goes to out[count].
template <typename Part>
void ring_sum16(uint16_t* out, size_t count, int nranks, bool bf, const Part& parts) {
  const size_t chunk = (count + size_t(nranks) - 1) / size_t(nranks);
  for (size_t i = 0; i < count; ++i) {
    const int c = int(i / chunk);
    const auto value = [&](int k) {
      const uint16_t v = parts((c + k) % nranks, i);
      return bf ? bf16_to_float(v) : half_to_float(v);
    };
    float acc = value(1);
    for (int k = 2; k <= nranks; ++k) {
      const float sum = acc + value(k);
      acc = bf ? bf16_to_float(float_to_bf16(sum)) : half_to_float(float_to_half(sum));
    }
    out[i] = bf ? float_to_bf16(acc) : float_to_half(acc);
  }
}

// MPI counts are ints: buffers larger than this go as several requests, matched in order.
constexpr size_t kChunkBytes = size_t(1) << 30;

// ---------------------------------------------------------------------------------------------------------------
// Communicators.
enum class Phase { queued, waiting_turn, in_flight, done, failed, abandoned };

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::queued: return "queued (its stream has not reached it)";
    case Phase::waiting_turn: return "waiting for earlier operations of the communicator";
    case Phase::in_flight: return "in flight";
    case Phase::done: return "done";
    case Phase::failed: return "failed";
    case Phase::abandoned: return "abandoned";
  }
  return "";
}

// One line of a communicator's recent history, for hang messages.
struct OpRecord {
  uint64_t seq = 0;
  std::string what;
  cudaStream_t stream = nullptr;
  std::atomic<Phase> phase{Phase::queued};
  std::atomic<int64_t> posted_ns{0};  // steady clock, when posted
};

constexpr size_t kHistory = 8;

struct CommState {
  std::string name;     // config.commName, or "<root world rank>:<counter>" of the unique id
  int root_world = 0;
  uint32_t counter = 0;
  int rank = 0, nranks = 1, device = 0, world_rank = 0;
  bool blocking = true;
  std::vector<int> world_ranks;  // by communicator rank
  MPI_Comm mpi = MPI_COMM_NULL;

  std::atomic<int> init_state{ncclInProgress};  // the bootstrap: ncclInProgress, then ncclSuccess or its error
  std::atomic<int> async_error{ncclSuccess};    // a hang or a failed operation (first one wins)
  std::atomic<bool> aborted{false};
  std::atomic<bool> launch_pending{false};      // a call returned ncclInProgress: report it once more
  std::atomic<bool> finalizing{false}, finalized{false};
  Clock::time_point finalize_started;
  std::atomic<int64_t> outstanding{0};          // work items queued and not finished
  std::thread init_thread;

  // Issue order: units take tickets on the host thread; the worker posts them in ticket order.
  uint64_t next_ticket = 0;
  std::atomic<uint64_t> posted_tickets{0};

  std::mutex mu;  // history, last_error
  std::deque<std::shared_ptr<OpRecord>> history;
  uint64_t next_seq = 1;
  std::string last_error;

  std::string who() const {
    return strf("communicator %s (rank %d of %d, device %d)", name.c_str(), rank, nranks, device);
  }

  // No more traffic: aborted, or an error that the caller must answer with ncclCommAbort.
  bool dead() const { return aborted.load() || async_error.load() != ncclSuccess; }

  void set_error(ncclResult_t rc, const std::string& msg) {
    int expected = ncclSuccess;
    async_error.compare_exchange_strong(expected, rc);
    std::lock_guard<std::mutex> lk(mu);
    if (last_error.empty()) last_error = msg;
  }

  std::shared_ptr<OpRecord> record(const std::string& what, cudaStream_t stream) {
    auto r = std::make_shared<OpRecord>();
    r->what = what;
    r->stream = stream;
    std::lock_guard<std::mutex> lk(mu);
    r->seq = next_seq++;
    history.push_back(r);
    while (history.size() > kHistory) history.pop_front();
    return r;
  }

  std::string recent() {
    std::lock_guard<std::mutex> lk(mu);
    std::string s;
    const int64_t now = Clock::now().time_since_epoch().count();
    for (const auto& r : history) {
      const Phase p = r->phase.load();
      s += strf("\n    #%llu %s on %s: %s", static_cast<unsigned long long>(r->seq), r->what.c_str(),
               stream_name(r->stream).c_str(), phase_name(p));
      if (p == Phase::in_flight && r->posted_ns.load())
        s += strf(" for %.1f s", double(now - r->posted_ns.load()) * 1e-9);
    }
    return s;
  }
};

}  // namespace
}  // namespace dflash::emu

// The handle behind ncclComm_t. Handles are never freed: a destroyed or aborted one stays a tombstone, so a later
// call through it is answered with ncclInvalidArgument instead of touching freed memory.
struct ncclComm {
  std::shared_ptr<dflash::emu::CommState> s;
  bool dead = false;
  const char* how_dead = "";  // "destroyed" | "aborted" | "failed to initialise"
};

namespace dflash::emu {
namespace {

std::mutex g_comms_mu;
std::set<ncclComm*> g_comms;   // every handle ever made

// At exit: a communicator neither destroyed nor aborted is a leak a real NCCL keeps (its proxy thread, its
// buffers, and peers that wait for it): named on stderr.
void report_live_comms() {
  std::lock_guard<std::mutex> lk(g_comms_mu);
  for (const ncclComm* c : g_comms)
    if (!c->dead)
      std::fprintf(stderr, "%semulated NCCL: at exit, communicator %s was neither destroyed nor aborted\n",
                   rank_prefix().c_str(), c->s ? c->s->name.c_str() : "?");
}
uint32_t g_id_counter = 0;     // ncclGetUniqueId of this process
std::set<uint32_t> g_root_claimed;  // ids of this process whose root side is (being) played

constexpr char kIdMagic[16] = "dflash-emu-nccl";

struct UniqueIdView {
  char magic[16];
  int32_t root_world;
  uint32_t counter;
  uint64_t nonce;
};
static_assert(sizeof(UniqueIdView) <= NCCL_UNIQUE_ID_BYTES);

// Looks a handle up for `fn`; null with *rc set when it is not a live communicator.
std::shared_ptr<CommState> lookup(ncclComm_t comm, const char* fn, ncclResult_t* rc) {
  std::lock_guard<std::mutex> lk(g_comms_mu);
  if (!comm) {
    *rc = fail(ncclInvalidArgument, strf("%s: comm is NULL", fn));
    return nullptr;
  }
  if (!g_comms.count(comm)) {
    *rc = fail(ncclInvalidArgument, strf("%s: %p is not a communicator made by ncclCommInitRank", fn,
                                        static_cast<void*>(comm)));
    return nullptr;
  }
  if (comm->dead) {
    *rc = fail(ncclInvalidArgument, strf("%s: communicator %s was %s; make a new one", fn, comm->s->name.c_str(),
                                        comm->how_dead));
    return nullptr;
  }
  *rc = ncclSuccess;
  return comm->s;
}

// Reserved tags on MPI_COMM_WORLD for the bootstrap, per unique id (root and counter: ids of different roots
// are initialised concurrently, and MPI_Comm_create_group calls of one process in flight at once need distinct
// tags): the top of the tag space, which the project's own messages (small tags) never reach.
int bootstrap_tag(int root_world, uint32_t counter, int k) {
  static const int ub = [] {
    int* v = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &v, &flag);
    return flag && v ? *v : 32767;
  }();
  const uint32_t ids = std::min<uint32_t>(65536, uint32_t(ub / 6));  // the upper half of the tag space at most
  const uint32_t id = (uint32_t(root_world) * 4099u + counter) % ids;
  return ub - 3 * int(id) - k;  // k: 0 join, 1 answer, 2 MPI_Comm_create_group
}

// What a member tells the root.
struct Join {
  int32_t nranks, rank, world_rank, device;
  uint64_t nonce;
  char host[64];
};
// What the root answers, followed by nranks world ranks (by communicator rank).
struct Answer {
  int32_t status;
  int32_t nranks;
  char msg[480];
};

// Tests `req` until it completes, the limit passes or `cancel` is set; the request is still active on false.
bool wait_bounded(MPI_Request* req, MPI_Status* st, double limit, const std::atomic<bool>& cancel) {
  const auto t0 = Clock::now();
  for (;;) {
    int flag = 0;
    MPI_Test(req, &flag, st);
    if (flag) return true;
    if (cancel.load() || since(t0) > limit) return false;
    nap();
  }
}

// An unmatched receive is withdrawn: MPI_Cancel of a receive completes locally (a message matched meanwhile is
// delivered, and the wait returns as soon as it is).
void drop_recv(MPI_Request* req) {
  MPI_Cancel(req);
  MPI_Wait(req, MPI_STATUS_IGNORE);
}

// The bootstrap of one member (ncclCommInitRank's work, on the calling thread or the init thread).
ncclResult_t bootstrap(CommState& s, uint64_t nonce, const std::string& fn) {
  make_types();
  const double limit = timeout_s();
  const int join_tag = bootstrap_tag(s.root_world, s.counter, 0);
  const int answer_tag = bootstrap_tag(s.root_world, s.counter, 1);
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  bool root = false;
  if (s.world_rank == s.root_world) {
    std::lock_guard<std::mutex> lk(g_comms_mu);
    root = g_root_claimed.insert(s.counter).second;  // a second rank of this process is a plain member
  }
  std::vector<char> answer_buf(sizeof(Answer) + sizeof(int32_t) * size_t(s.nranks));
  auto* answer = reinterpret_cast<Answer*>(answer_buf.data());
  auto* ranks = reinterpret_cast<int32_t*>(answer_buf.data() + sizeof(Answer));
  if (root) {
    std::vector<Join> joins(size_t(s.nranks));
    std::vector<bool> seen(size_t(s.nranks), false);
    std::vector<int> reply_to;  // world ranks that joined (answered even on error)
    seen[size_t(s.rank)] = true;
    joins[size_t(s.rank)] = Join{s.nranks, s.rank, s.world_rank, s.device, nonce, {}};
    std::memcpy(joins[size_t(s.rank)].host, host, sizeof host);
    ncclResult_t rc = ncclSuccess;
    std::string msg;
    for (int got = 1; got < s.nranks; ++got) {
      Join j{};
      MPI_Request req;
      MPI_Status st;
      MPI_Irecv(&j, sizeof j, MPI_BYTE, MPI_ANY_SOURCE, join_tag, MPI_COMM_WORLD, &req);
      if (!wait_bounded(&req, &st, limit, s.aborted)) {
        drop_recv(&req);
        if (s.aborted.load()) return ncclInvalidUsage;  // ncclCommAbort: nobody waits for this answer
        if (rc == ncclSuccess) {
          std::string missing;
          for (int r = 0; r < s.nranks; ++r)
            if (!seen[size_t(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          rc = ncclSystemError;
          msg = strf("%s(%s, %d ranks): after %.0f s, ranks %s have not joined (every rank must call "
                    "ncclCommInitRank with this unique id)", fn.c_str(), s.name.c_str(), s.nranks, limit,
                    missing.c_str());
        }
        break;
      }
      reply_to.push_back(st.MPI_SOURCE);
      if (rc != ncclSuccess) continue;
      if (j.nonce != nonce || j.nranks != s.nranks) {
        rc = ncclInvalidUsage;
        msg = strf("%s(%s): world rank %d joined with nranks %d, this rank with %d (every rank must pass the same "
                  "nranks and unique id)", fn.c_str(), s.name.c_str(), st.MPI_SOURCE, j.nranks, s.nranks);
      } else if (j.world_rank == s.world_rank || std::count(reply_to.begin(), reply_to.end(), j.world_rank) > 1) {
        rc = ncclInvalidUsage;
        msg = strf("%s(%s): world rank %d holds two ranks of the communicator: the emulated NCCL takes one rank per "
                   "MPI process", fn.c_str(), s.name.c_str(), j.world_rank);
      } else if (seen[size_t(j.rank)]) {
        rc = ncclInvalidUsage;
        msg = strf("%s(%s): rank %d was claimed by world ranks %d and %d (each rank of a communicator once)",
                  fn.c_str(), s.name.c_str(), j.rank, joins[size_t(j.rank)].world_rank, j.world_rank);
      } else {
        seen[size_t(j.rank)] = true;
        joins[size_t(j.rank)] = j;
      }
    }
    if (rc == ncclSuccess) {  // NCCL's check (init.cc): two ranks on one device of one host
      for (int a = 0; a < s.nranks && rc == ncclSuccess; ++a)
        for (int b = a + 1; b < s.nranks; ++b)
          if (joins[size_t(a)].device == joins[size_t(b)].device &&
              std::strncmp(joins[size_t(a)].host, joins[size_t(b)].host, sizeof host) == 0) {
            rc = ncclInvalidUsage;
            msg = strf("%s(%s): Duplicate GPU detected : rank %d and rank %d both on CUDA device %d (emulated, host "
                      "%s): NCCL needs one GPU per rank (cudaSetDevice(local rank) with DFLASH_EMU_DEVICES >= "
                      "ranks per host)", fn.c_str(), s.name.c_str(), a, b, joins[size_t(a)].device,
                      joins[size_t(a)].host);
            break;
          }
    }
    answer->status = rc;
    answer->nranks = s.nranks;
    std::snprintf(answer->msg, sizeof answer->msg, "%s", msg.c_str());
    for (int r = 0; r < s.nranks; ++r) ranks[r] = joins[size_t(r)].world_rank;
    auto* out = new std::vector<char>(answer_buf);  // freed once every answer is sent; MPI may read it until then
    bool sent = true;
    for (int to : reply_to) {
      MPI_Request req;
      MPI_Isend(out->data(), int(out->size()), MPI_BYTE, to, answer_tag, MPI_COMM_WORLD, &req);
      if (!wait_bounded(&req, MPI_STATUS_IGNORE, limit, s.aborted)) {
        MPI_Request_free(&req);
        sent = false;
      }
    }
    if (sent) delete out;
    if (rc != ncclSuccess) return fail(rc, msg);
  } else {
    auto* join = new Join{s.nranks, s.rank, s.world_rank, s.device, nonce, {}};  // freed once sent
    std::memcpy(join->host, host, sizeof host);
    MPI_Request sreq, rreq;
    MPI_Isend(join, sizeof *join, MPI_BYTE, s.root_world, join_tag, MPI_COMM_WORLD, &sreq);
    MPI_Irecv(answer_buf.data(), int(answer_buf.size()), MPI_BYTE, s.root_world, answer_tag, MPI_COMM_WORLD, &rreq);
    if (!wait_bounded(&rreq, MPI_STATUS_IGNORE, limit, s.aborted)) {
      drop_recv(&rreq);
      MPI_Request_free(&sreq);  // the join stays allocated: MPI may still read it
      if (s.aborted.load()) return ncclInvalidUsage;
      return fail(ncclSystemError,
                  strf("%s(%s, rank %d of %d): no answer after %.0f s from world rank %d, the process that called "
                      "ncclGetUniqueId (it must be a member too and call ncclCommInitRank with this id; every rank "
                      "must call it)", fn.c_str(), s.name.c_str(), s.rank, s.nranks, limit, s.root_world));
    }
    if (wait_bounded(&sreq, MPI_STATUS_IGNORE, limit, s.aborted)) delete join;
    else MPI_Request_free(&sreq);
    if (answer->status != ncclSuccess) return fail(ncclResult_t(answer->status), answer->msg);
  }
  s.world_ranks.assign(ranks, ranks + s.nranks);
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, s.nranks, s.world_ranks.data(), &group);
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, bootstrap_tag(s.root_world, s.counter, 2), &s.mpi);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS || s.mpi == MPI_COMM_NULL)
    return fail(ncclSystemError, strf("%s(%s): MPI_Comm_create_group failed: %s", fn.c_str(), s.name.c_str(),
                                     mpi_error(rc).c_str()));
  MPI_Comm_set_errhandler(s.mpi, MPI_ERRORS_RETURN);  // a failed request is reported, not fatal
  return ncclSuccess;
}

// ---------------------------------------------------------------------------------------------------------------
// Groups (per thread, as NCCL's): collected operations and communicators being initialised.
enum class Kind { send, recv, allreduce, broadcast };

struct Op {
  Kind kind = Kind::send;
  std::shared_ptr<CommState> comm;
  int peer = 0;  // send/recv: the peer; broadcast: the root
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0, bytes = 0;
  ncclDataType_t dtype = ncclUint8;
  TypeInfo type;
  ncclRedOp_t redop = ncclSum;
  cudaStream_t stream = nullptr;
  std::string what;
  std::shared_ptr<OpRecord> rec;
  // on the worker
  std::vector<char> staging;
  // a 16-bit float sum (sum, avg): every rank's input, all-gathered, then summed as NCCL's ring (ring_sum16)
  bool ring16 = false;
  std::vector<char> gathered;
  std::vector<MPI_Request> reqs;
  bool done = false;
};

// Requests given up on (a hang, an abort) with their buffers: MPI may still touch them, so they are never freed.
std::mutex g_graveyard_mu;
std::vector<std::shared_ptr<Op>> g_graveyard;

struct GroupState {
  std::atomic<int> units_left{0};
};

struct Group {
  int depth = 0;
  std::vector<std::shared_ptr<Op>> ops;
  std::vector<std::shared_ptr<CommState>> inits;
  ncclResult_t error = ncclSuccess;
};
thread_local Group t_group;

// The ops of one stream of one group (or one op outside a group): one work item.
struct Unit {
  std::vector<std::shared_ptr<Op>> ops;
  std::vector<std::pair<std::shared_ptr<CommState>, uint64_t>> tickets;
  std::shared_ptr<GroupState> group;  // null outside a group
  cudaStream_t stream = nullptr;
  bool posted = false, own_done = false, reported = false, finished = false;
  Clock::time_point started, posted_at;

  // Dropped unfinished (a device fault drops queued work): requests still posted keep their buffers.
  ~Unit() {
    for (auto& op : ops)
      if (!op->done && !op->reqs.empty()) {
        std::lock_guard<std::mutex> lk(g_graveyard_mu);
        g_graveyard.push_back(op);
      }
  }

  // run(): the send data as it is now, in stream order
  void start() {
    started = Clock::now();
    for (auto& op : ops) {
      if (op->comm->dead()) continue;
      const bool has_input = op->kind == Kind::send || op->kind == Kind::allreduce ||
                             (op->kind == Kind::broadcast && op->comm->rank == op->peer);
      op->staging.resize(op->bytes);
      if (has_input && op->bytes) std::memcpy(op->staging.data(), op->send, op->bytes);
      op->rec->phase = Phase::waiting_turn;
    }
    try_post();
  }

  // Posts every op once each communicator's earlier units have posted theirs (issue order per communicator).
  bool try_post() {
    for (auto& [c, t] : tickets)
      if (!c->dead() && c->posted_tickets.load() != t) return false;
    for (auto& op : ops) post(*op);
    for (auto& [c, t] : tickets) {
      uint64_t cur = c->posted_tickets.load();
      while (cur < t + 1 && !c->posted_tickets.compare_exchange_weak(cur, t + 1)) {
      }
    }
    posted = true;
    posted_at = Clock::now();
    return true;
  }

  void post(Op& op) {
    CommState& c = *op.comm;
    if (c.dead() || op.bytes == 0) {
      op.done = true;
      op.rec->phase = c.dead() ? Phase::abandoned : Phase::done;
      return;
    }
    char* p = op.staging.data();
    const size_t elem = op.kind == Kind::allreduce ? op.type.size : 1;
    const size_t chunk = kChunkBytes / elem * elem;
    op.ring16 = op.kind == Kind::allreduce && op.type.f16 && (op.redop == ncclSum || op.redop == ncclAvg);
    if (op.ring16) op.gathered.resize(size_t(c.nranks) * op.bytes);
    for (size_t off = 0; off < op.bytes; off += chunk) {
      const size_t n = std::min(chunk, op.bytes - off);
      MPI_Request req = MPI_REQUEST_NULL;
      int rc = MPI_SUCCESS;
      switch (op.kind) {
        case Kind::send: rc = MPI_Issend(p + off, int(n), MPI_BYTE, op.peer, 0, c.mpi, &req); break;
        case Kind::recv: rc = MPI_Irecv(p + off, int(n), MPI_BYTE, op.peer, 0, c.mpi, &req); break;
        case Kind::allreduce:
          if (op.ring16)  // piece `off` of every rank at gathered[nranks · off + rank · n]
            rc = MPI_Iallgather(p + off, int(n), MPI_BYTE, op.gathered.data() + size_t(c.nranks) * off, int(n),
                                MPI_BYTE, c.mpi, &req);
          else
            rc = MPI_Iallreduce(MPI_IN_PLACE, p + off, int(n / elem), op.type.mpi, mpi_op(op.redop, op.type), c.mpi,
                                &req);
          break;
        case Kind::broadcast: rc = MPI_Ibcast(p + off, int(n), MPI_BYTE, op.peer, c.mpi, &req); break;
      }
      if (rc != MPI_SUCCESS) {
        op_failed(op, ncclSystemError, strf("%s on %s: posting it failed in MPI: %s", op.what.c_str(),
                                           c.who().c_str(), mpi_error(rc).c_str()));
        return;
      }
      op.reqs.push_back(req);
    }
    op.rec->posted_ns = Clock::now().time_since_epoch().count();
    op.rec->phase = Phase::in_flight;
  }

  void op_failed(Op& op, ncclResult_t rc, const std::string& msg) {
    say(msg);
    set_last_error(msg);
    op.comm->set_error(rc, msg);
    abandon(op, Phase::failed);
  }

  // Gives up on an op's requests: receives are withdrawn, the rest (MPI cannot cancel a synchronous send or a
  // collective) stay in the graveyard with their buffers.
  static void abandon_requests(const std::shared_ptr<Op>& op) {
    bool active = false;
    for (auto& r : op->reqs) {
      if (r == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      if (flag) continue;
      if (op->kind == Kind::recv) {
        MPI_Cancel(&r);
        for (int i = 0; i < 1000 && !flag; ++i) MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      }
      active = active || !flag;
    }
    if (active) {
      std::lock_guard<std::mutex> lk(g_graveyard_mu);
      g_graveyard.push_back(op);
    }
  }

  void abandon(Op& op, Phase why) {
    for (auto& o : ops)
      if (o.get() == &op) abandon_requests(o);
    op.done = true;
    op.rec->phase = why;
  }

  // One test of an op's requests; on completion the result goes to the device buffer.
  void test(Op& op) {
    int flag = 0;
    std::vector<MPI_Status> st(op.reqs.size());
    const int rc = MPI_Testall(int(op.reqs.size()), op.reqs.data(), &flag, st.data());
    if (rc != MPI_SUCCESS) {
      std::string why = mpi_error(rc);
      for (auto& s : st)
        if (s.MPI_ERROR == MPI_ERR_TRUNCATE)
          why = strf("rank %d sent more than %zu bytes (ncclSend and ncclRecv must have the same count and datatype)",
                    op.peer, op.bytes);
      op_failed(op, op.kind == Kind::recv ? ncclInvalidUsage : ncclSystemError,
                strf("%s on %s failed: %s", op.what.c_str(), op.comm->who().c_str(), why.c_str()));
      return;
    }
    if (!flag) return;
    if (op.kind == Kind::recv) {
      size_t got = 0;
      for (auto& s : st) {
        int n = 0;
        MPI_Get_count(&s, MPI_BYTE, &n);
        got += size_t(n);
      }
      if (got != op.bytes) {
        op_failed(op, ncclInvalidUsage, strf("%s on %s: rank %d sent %zu bytes (ncclSend and ncclRecv must have the "
                                            "same count and datatype)", op.what.c_str(), op.comm->who().c_str(),
                                            op.peer, got));
        return;
      }
    }
    if (op.ring16) {
      const size_t chunk = kChunkBytes / 2 * 2, nranks = size_t(op.comm->nranks);
      const char* g = op.gathered.data();
      ring_sum16(reinterpret_cast<uint16_t*>(op.staging.data()), op.count, op.comm->nranks, op.dtype == ncclBfloat16,
                 [&](int r, size_t i) {
                   const size_t b = i * 2, off = b / chunk * chunk, n = std::min(chunk, op.bytes - off);
                   uint16_t v;
                   std::memcpy(&v, g + nranks * off + size_t(r) * n + (b - off), 2);
                   return v;
                 });
    }
    if (op.kind != Kind::send) {
      if (op.kind == Kind::allreduce && op.redop == ncclAvg)
        divide(op.staging.data(), op.count, op.dtype, op.comm->nranks);
      std::memcpy(op.recv, op.staging.data(), op.bytes);
    }
    op.reqs.clear();
    op.done = true;
    op.rec->phase = Phase::done;
  }

  // What the op waits for, for the hang message.
  static std::string waits_for(const Op& op) {
    const std::string peer = op.comm->world_ranks.size() > size_t(op.peer) &&
                                     op.comm->world_ranks[size_t(op.peer)] != op.peer
                                 ? strf("rank %d (world rank %d)", op.peer, op.comm->world_ranks[size_t(op.peer)])
                                 : strf("rank %d", op.peer);
    switch (op.kind) {
      case Kind::send: return strf("for %s to post the matching ncclRecv", peer.c_str());
      case Kind::recv: return strf("for %s to post the matching ncclSend", peer.c_str());
      default:
        return strf("for all %d ranks of the communicator to call it (a collective completes only once every rank "
                   "has issued it; every rank must issue the same collectives in the same order)", op.comm->nranks);
    }
  }

  void report_hang(double waited) {
    reported = true;
    const std::shared_ptr<Op>* first = nullptr;
    int pending = 0;
    for (auto& op : ops)
      if (!op->done) {
        if (!first) first = &op;
        ++pending;
      }
    if (!first) return;
    const Op& op = **first;
    CommState& c = *op.comm;
    std::string msg;
    if (!posted) {
      msg = strf("%s on %s, %s, has waited %.0f s for earlier operations of the communicator, issued on another "
                "stream, to start (operations of one communicator run in issue order)", op.what.c_str(),
                c.who().c_str(), stream_name(stream).c_str(), waited);
    } else {
      const bool p2p = op.kind == Kind::send || op.kind == Kind::recv;
      msg = strf("%s on %s, %s, has waited %.0f s %s", op.what.c_str(), c.who().c_str(), stream_name(stream).c_str(),
                waited, waits_for(op).c_str());
      if (p2p && !group)
        msg += ": a pattern that deadlocks under NCCL (a send completes only when its receive is posted; operations "
               "of one stream run in order; fuse sends and receives that must progress together in "
               "ncclGroupStart/ncclGroupEnd)";
      else if (p2p)
        msg += strf(" (in a group of %zu operations; %d still pending): the peer never issued the matching "
                   "operation", ops.size(), pending);
    }
    msg += strf(". Last operations on communicator %s:%s", c.name.c_str(), c.recent().c_str());
    msg += "\n    the communicator's asynchronous error is now ncclRemoteError (ncclCommGetAsyncError); abort it "
           "with ncclCommAbort";
    say(msg);
    set_last_error(msg);
    for (auto& o : ops)
      if (!o->done) {
        o->comm->set_error(ncclRemoteError, msg);
        abandon(*o, Phase::failed);
      }
  }

  // poll(): never blocks.
  bool progress() {
    const double limit = timeout_s();
    if (!posted && !try_post()) {
      bool any_dead = false;
      for (auto& [c, t] : tickets) any_dead = any_dead || c->dead();
      if (!any_dead && since(started) > limit) report_hang(since(started));
      if (!posted && !reported) return false;
    }
    bool all = true;
    for (auto& op : ops) {
      if (op->done) continue;
      if (op->comm->dead()) abandon(*op, Phase::abandoned);
      else test(*op);
      all = all && op->done;
    }
    if (!all) {
      if (!reported && since(posted_at) > limit) report_hang(since(posted_at));
      if (!reported) return false;
    }
    if (!own_done) {
      own_done = true;
      if (group) --group->units_left;
    }
    // NCCL blocks every stream of a group until the whole group is done
    if (group && group->units_left.load() > 0) {
      bool any_dead = false;
      for (auto& [c, t] : tickets) any_dead = any_dead || c->dead();
      if (!any_dead && since(started) < limit) return false;
      if (!any_dead)
        say(strf("%s: the group's operations on %s are done, but not those on its other streams after %.0f s (their "
                 "streams never reached them?): releasing this stream", ops.front()->what.c_str(),
                 stream_name(stream).c_str(), since(started)));
    }
    finish();
    return true;
  }

  void finish() {
    if (finished) return;
    finished = true;
    for (auto& [c, t] : tickets) --c->outstanding;
  }
};

// Queues the ops of one stream as one work item; the tickets fix their place in each communicator's order.
ncclResult_t queue_unit(std::vector<std::shared_ptr<Op>> ops, std::shared_ptr<GroupState> group) {
  auto u = std::make_shared<Unit>();
  u->stream = ops.front()->stream;
  u->group = group;
  std::string what;
  for (auto& op : ops) {
    bool have = false;
    for (auto& [c, t] : u->tickets) have = have || c == op->comm;
    if (!have) {
      std::lock_guard<std::mutex> lk(op->comm->mu);
      u->tickets.emplace_back(op->comm, op->comm->next_ticket++);
    }
    what += (what.empty() ? "" : ", ") + op->what;
  }
  if (group) what = strf("ncclGroupEnd(%zu operations: %s)", ops.size(), what.c_str());
  u->ops = std::move(ops);
  for (auto& [c, t] : u->tickets) ++c->outstanding;
  Work w;
  w.what = what;
  w.run = [u] { u->start(); };
  w.poll = [u] { return u->progress(); };
  const cudaError_t e = enqueue(u->stream, std::move(w));
  if (e != cudaSuccess) {
    // the tickets are burnt: the communicators stop, so later units do not wait for this one
    const std::string msg = strf("%s: queueing it on %s failed: %s", what.c_str(), stream_name(u->stream).c_str(),
                                cudaGetErrorString(e));
    for (auto& [c, t] : u->tickets) {
      c->set_error(ncclUnhandledCudaError, msg);
      --c->outstanding;
    }
    return fail(ncclUnhandledCudaError, msg);
  }
  return ncclSuccess;
}

// The checks every operation gets (NCCL's ArgsCheck / CudaPtrCheck): a live, initialised communicator, a known
// type and operation, peers in range, and device buffers of this communicator's device that hold count elements.
ncclResult_t check_comm(ncclComm_t comm, const char* fn, std::shared_ptr<CommState>* out) {
  ncclResult_t rc;
  *out = lookup(comm, fn, &rc);
  if (!*out) return rc;
  CommState& c = **out;
  const int init = c.init_state.load();
  if (init == ncclInProgress)
    return fail(ncclInvalidUsage, strf("%s on %s: the communicator is still initialising (poll ncclCommGetAsyncError "
                                      "until ncclSuccess first)", fn, c.who().c_str()));
  if (init != ncclSuccess)
    return fail(ncclResult_t(init), strf("%s on %s: the communicator failed to initialise (%s)", fn, c.who().c_str(),
                                        result_name(init)));
  if (c.finalizing.load())
    return fail(ncclInvalidUsage, strf("%s on %s: called after ncclCommFinalize", fn, c.who().c_str()));
  if (const int e = c.async_error.load(); e != ncclSuccess)
    return fail(ncclResult_t(e), strf("%s on %s: the communicator has an asynchronous error (%s): abort it with "
                                     "ncclCommAbort", fn, c.who().c_str(), result_name(e)));
  return ncclSuccess;
}

ncclResult_t check_buffer(const char* fn, const char* name, const void* p, size_t bytes, const CommState& c) {
  if (bytes == 0) return ncclSuccess;
  if (!p) return fail(ncclInvalidArgument, strf("%s on %s: %s is NULL", fn, c.who().c_str(), name));
  const Allocation* a = find_allocation(p, bytes);
  if (a && a->device_memory && a->device == c.device) return ncclSuccess;
  std::string why;
  if (a && a->device_memory)
    why = strf("it is memory of device %d, the communicator's device is %d", a->device, c.device);
  else if (a)
    why = "it is page-locked host memory (cudaMallocHost), not device memory";
  else if (const Allocation* b = find_allocation(p, 1))
    why = strf("it starts at offset %td of a %zu-byte allocation at %p and runs past its end",
              static_cast<const char*>(p) - b->base, b->bytes, static_cast<const void*>(b->base));
  else
    why = "it is not device memory (host memory, or freed): NCCL reads and writes device buffers only";
  return fail(ncclInvalidArgument, strf("%s on %s: %s %p (%zu bytes): %s", fn, c.who().c_str(), name, p, bytes,
                                       why.c_str()));
}

ncclResult_t issue(std::shared_ptr<Op> op) {
  CommState& c = *op->comm;
  op->rec = c.record(op->what, op->stream);
  if (t_group.depth > 0) {
    t_group.ops.push_back(std::move(op));
    return ncclSuccess;
  }
  const ncclResult_t rc = queue_unit({op}, nullptr);
  if (rc != ncclSuccess) return rc;
  if (!c.blocking) {
    c.launch_pending = true;
    return ncclInProgress;
  }
  return ncclSuccess;
}

// A failed call inside a group fails the whole group at ncclGroupEnd, as NCCL's.
ncclResult_t in_group(ncclResult_t rc) {
  if (rc != ncclSuccess && rc != ncclInProgress && t_group.depth > 0 && t_group.error == ncclSuccess)
    t_group.error = rc;
  return rc;
}

ncclResult_t p2p(Kind kind, const void* buf, size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,
                 cudaStream_t stream) {
  const char* fn = kind == Kind::send ? "ncclSend" : "ncclRecv";
  std::shared_ptr<CommState> c;
  if (ncclResult_t rc = check_comm(comm, fn, &c); rc != ncclSuccess) return rc;
  auto op = std::make_shared<Op>();
  if (!type_info(dtype, &op->type))
    return fail(ncclInvalidArgument, strf("%s on %s: datatype %d is not emulated", fn, c->who().c_str(), int(dtype)));
  if (peer < 0 || peer >= c->nranks)
    return fail(ncclInvalidArgument, strf("%s on %s: peer %d is not a rank of the communicator (0..%d)", fn,
                                         c->who().c_str(), peer, c->nranks - 1));
  op->kind = kind;
  op->comm = c;
  op->peer = peer;
  op->count = count;
  op->dtype = dtype;
  op->bytes = count * op->type.size;
  op->stream = stream;
  if (kind == Kind::send) op->send = buf;
  else op->recv = const_cast<void*>(buf);
  if (ncclResult_t rc = check_buffer(fn, kind == Kind::send ? "sendbuff" : "recvbuff", buf, op->bytes, *c);
      rc != ncclSuccess)
    return rc;
  op->what = kind == Kind::send ? strf("ncclSend(%zu bytes to rank %d)", op->bytes, peer)
                                : strf("ncclRecv(%zu bytes from rank %d)", op->bytes, peer);
  return issue(op);
}

// Finalize's flush: waits until every queued operation of the communicator has finished (each is bounded by the
// hang timeout; the margin covers work still queued behind other streams).
// A device fault (the runtime's sticky error) drops queued work, ours included: nothing will finish.
bool device_faulted(CommState& c, const char* fn) {
  const cudaError_t e = cudaStreamQuery(nullptr);  // the sticky error, if any, before anything else
  if (e == cudaSuccess || e == cudaErrorNotReady) return false;
  const std::string msg = strf("%s on %s: the device faulted (%s): its queued NCCL operations were dropped", fn,
                               c.who().c_str(), cudaGetErrorName(e));
  c.set_error(ncclUnhandledCudaError, msg);
  fail(ncclUnhandledCudaError, msg);
  return true;
}

ncclResult_t flush(CommState& c, const char* fn) {
  const double limit = timeout_s() + 10;
  while (c.outstanding.load() > 0) {
    kick();
    if (device_faulted(c, fn)) return ncclUnhandledCudaError;
    if (since(c.finalize_started) > limit) {
      const std::string msg = strf("%s on %s: %lld operations still unfinished after %.0f s (their streams never "
                                  "reached them?). Last operations:%s", fn, c.who().c_str(),
                                  static_cast<long long>(c.outstanding.load()), limit, c.recent().c_str());
      c.set_error(ncclSystemError, msg);
      return fail(ncclSystemError, msg);
    }
    nap();
  }
  c.finalized = true;
  return ncclResult_t(c.async_error.load());
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, const ncclConfig_t* config,
                       const char* fn) {
  if (!out) return fail(ncclInvalidArgument, strf("%s: comm is NULL", fn));
  *out = nullptr;
  static const bool reported = (std::atexit(report_live_comms), true);
  (void)reported;
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Finalized(&finalized);
  if (!inited || finalized)
    return fail(ncclInvalidUsage, strf("%s: MPI is not initialised (the emulated NCCL bootstraps over MPI: call "
                                      "MPI_Init_thread(MPI_THREAD_MULTIPLE) first)", fn));
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    return fail(ncclInvalidUsage, strf("%s: MPI provides thread level %d, not MPI_THREAD_MULTIPLE: the emulated NCCL "
                                      "calls MPI from the device worker thread, so the process must call "
                                      "MPI_Init_thread(MPI_THREAD_MULTIPLE)", fn, provided));
  UniqueIdView v;
  std::memcpy(&v, id.internal, sizeof v);
  int world_size = 0, world_rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (std::memcmp(v.magic, kIdMagic, sizeof kIdMagic) != 0 || v.root_world < 0 || v.root_world >= world_size)
    return fail(ncclInvalidArgument, strf("%s: the unique id was not made by ncclGetUniqueId (of this MPI world)", fn));
  if (nranks < 1 || nranks > world_size)
    return fail(ncclInvalidArgument, strf("%s: nranks %d is out of range (1..%d, the MPI world's size)", fn, nranks,
                                         world_size));
  if (rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, strf("%s: rank %d is out of range (0..%d)", fn, rank, nranks - 1));
  bool blocking = true;
  std::string name = strf("%d:%u", v.root_world, v.counter);
  if (config) {
    if (config->magic != 0xcafebeef)
      return fail(ncclInvalidArgument, strf("%s: config was not initialised with NCCL_CONFIG_INITIALIZER", fn));
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) blocking = config->blocking != 0;
    if (config->commName) name = config->commName;
  }
  auto s = std::make_shared<CommState>();
  s->name = name;
  s->root_world = v.root_world;
  s->counter = v.counter;
  s->rank = rank;
  s->nranks = nranks;
  s->device = current_device();  // the calling thread's device, as NCCL's
  s->world_rank = world_rank;
  s->blocking = blocking;
  auto* h = new ncclComm{s};
  {
    std::lock_guard<std::mutex> lk(g_comms_mu);
    g_comms.insert(h);
  }
  const uint64_t nonce = v.nonce;
  const std::string fname = fn;
  auto job = [s, nonce, fname] { s->init_state = bootstrap(*s, nonce, fname); };  // the state last: no MPI after
  if (blocking && t_group.depth == 0) {
    job();
    if (s->init_state.load() != ncclSuccess) {
      h->dead = true;
      h->how_dead = "failed to initialise";
      return ncclResult_t(s->init_state.load());
    }
    *out = h;
    return ncclSuccess;
  }
  s->init_thread = std::thread(job);
  *out = h;
  if (t_group.depth > 0) {
    t_group.inits.push_back(s);
    return ncclSuccess;
  }
  return ncclInProgress;
}

}  // namespace
}  // namespace dflash::emu

// =================================================================================================================
// <nccl.h>
using namespace dflash::emu;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited)
    return fail(ncclInvalidUsage, "ncclGetUniqueId: MPI is not initialised (the emulated NCCL's unique id names an "
                                  "MPI rank: call MPI_Init_thread(MPI_THREAD_MULTIPLE) first)");
  UniqueIdView v{};
  std::memcpy(v.magic, kIdMagic, sizeof kIdMagic);
  MPI_Comm_rank(MPI_COMM_WORLD, &v.root_world);
  {
    std::lock_guard<std::mutex> lk(g_comms_mu);
    v.counter = g_id_counter++;
  }
  v.nonce = (uint64_t(getpid()) << 32) ^ uint64_t(Clock::now().time_since_epoch().count()) ^ v.counter;
  std::memset(uniqueId->internal, 0, sizeof uniqueId->internal);
  std::memcpy(uniqueId->internal, &v, sizeof v);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  return init_rank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ncclResult_t rc;
  auto s = lookup(comm, "ncclCommFinalize", &rc);
  if (!s) return rc;
  if (s->init_state.load() == ncclInProgress)
    return fail(ncclInvalidUsage, strf("ncclCommFinalize on %s: the communicator is still initialising",
                                      s->who().c_str()));
  if (s->finalizing.exchange(true))
    return fail(ncclInvalidUsage, strf("ncclCommFinalize on %s: called twice", s->who().c_str()));
  s->finalize_started = Clock::now();
  if (!s->blocking) return ncclInProgress;  // ncclCommGetAsyncError reports the flush
  return flush(*s, "ncclCommFinalize");
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ncclResult_t rc;
  auto s = lookup(comm, "ncclCommDestroy", &rc);
  if (!s) return rc;
  if (s->init_thread.joinable()) s->init_thread.join();  // bounded: every bootstrap wait has the timeout
  bool clean = s->init_state.load() == ncclSuccess;
  if (clean && !s->finalized.load()) {
    // NCCL: destroy without finalize finalizes (flushes) first
    if (!s->finalizing.exchange(true)) s->finalize_started = Clock::now();
    clean = flush(*s, "ncclCommDestroy") == ncclSuccess;
  }
  clean = clean && s->async_error.load() == ncclSuccess && s->outstanding.load() == 0;
  if (clean && s->mpi != MPI_COMM_NULL) MPI_Comm_free(&s->mpi);  // after an error the private comm is dropped
  std::lock_guard<std::mutex> lk(g_comms_mu);
  comm->dead = true;
  comm->how_dead = "destroyed";
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;  // as NCCL's
  ncclResult_t rc;
  auto s = lookup(comm, "ncclCommAbort", &rc);
  if (!s) return rc;
  // The worker sees the flag on its next poll and gives up on the requests; no MPI here (a peer may be dead).
  s->aborted = true;
  kick();
  if (s->init_thread.joinable()) s->init_thread.detach();  // its waits end on the flag, MPI_Comm_create_group once
                                                           // every member has called it
  std::lock_guard<std::mutex> lk(g_comms_mu);
  comm->dead = true;
  comm->how_dead = "aborted";
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ncclResult_t rc;
  if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  auto s = lookup(comm, "ncclCommGetAsyncError", &rc);
  if (!s) return rc;
  const int init = s->init_state.load();
  if (init != ncclSuccess) {
    if (init != ncclInProgress && s->init_thread.joinable()) s->init_thread.join();
    *asyncError = ncclResult_t(init);
    return ncclSuccess;
  }
  if (s->init_thread.joinable()) s->init_thread.join();  // finished: its last act was setting the state
  if (const int e = s->async_error.load(); e != ncclSuccess) {
    *asyncError = ncclResult_t(e);
    return ncclSuccess;
  }
  if (s->finalizing.load() && !s->finalized.load()) {
    if (s->outstanding.load() > 0) {
      kick();  // the flush waits for the communicator's queued work: it runs now, not after DFLASH_EMU_LAG_MS
      if (device_faulted(*s, "ncclCommFinalize")) *asyncError = ncclUnhandledCudaError;
      else if (since(s->finalize_started) > timeout_s() + 10) *asyncError = flush(*s, "ncclCommFinalize");
      else *asyncError = ncclInProgress;
      return ncclSuccess;
    }
    s->finalized = true;
  }
  *asyncError = s->launch_pending.exchange(false) ? ncclInProgress : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  ncclResult_t rc;
  auto s = lookup(comm, "ncclCommCount", &rc);
  if (!s) return rc;
  if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  *count = s->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  ncclResult_t rc;
  auto s = lookup(comm, "ncclCommCuDevice", &rc);
  if (!s) return rc;
  if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  *device = s->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  ncclResult_t rc;
  auto s = lookup(comm, "ncclCommUserRank", &rc);
  if (!s) return rc;
  if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  *rank = s->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {  // NCCL's own strings (src/init.cc)
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {  // the comm argument is unused, as in NCCL
  thread_local std::string copy;
  std::lock_guard<std::mutex> lk(g_error_mu);
  copy = g_last_error;
  return copy.c_str();
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return in_group(p2p(Kind::send, sendbuff, count, datatype, peer, comm, stream));
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return in_group(p2p(Kind::recv, recvbuff, count, datatype, peer, comm, stream));
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  std::shared_ptr<CommState> c;
  if (ncclResult_t rc = check_comm(comm, fn, &c); rc != ncclSuccess) return in_group(rc);
  auto o = std::make_shared<Op>();
  if (!type_info(datatype, &o->type))
    return in_group(fail(ncclInvalidArgument, strf("%s on %s: datatype %d is not emulated", fn, c->who().c_str(),
                                                  int(datatype))));
  const char* opname = redop_name(op);
  if (!opname)
    return in_group(fail(ncclInvalidArgument, strf("%s on %s: reduction %d is not emulated (sum, prod, max, min, "
                                                  "avg)", fn, c->who().c_str(), int(op))));
  o->kind = Kind::allreduce;
  o->comm = c;
  o->send = sendbuff;
  o->recv = recvbuff;
  o->count = count;
  o->dtype = datatype;
  o->redop = op;
  o->bytes = count * o->type.size;
  o->stream = stream;
  if (ncclResult_t rc = check_buffer(fn, "sendbuff", sendbuff, o->bytes, *c); rc != ncclSuccess) return in_group(rc);
  if (ncclResult_t rc = check_buffer(fn, "recvbuff", recvbuff, o->bytes, *c); rc != ncclSuccess) return in_group(rc);
  o->what = strf("ncclAllReduce(%s of %zu x %s = %zu bytes)", opname, count, o->type.name, o->bytes);
  return in_group(issue(o));
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclBroadcast";
  std::shared_ptr<CommState> c;
  if (ncclResult_t rc = check_comm(comm, fn, &c); rc != ncclSuccess) return in_group(rc);
  auto o = std::make_shared<Op>();
  if (!type_info(datatype, &o->type))
    return in_group(fail(ncclInvalidArgument, strf("%s on %s: datatype %d is not emulated", fn, c->who().c_str(),
                                                  int(datatype))));
  if (root < 0 || root >= c->nranks)
    return in_group(fail(ncclInvalidArgument, strf("%s on %s: root %d is not a rank of the communicator (0..%d)", fn,
                                                  c->who().c_str(), root, c->nranks - 1)));
  o->kind = Kind::broadcast;
  o->comm = c;
  o->peer = root;
  o->send = sendbuff;
  o->recv = recvbuff;
  o->count = count;
  o->dtype = datatype;
  o->bytes = count * o->type.size;
  o->stream = stream;
  if (c->rank == root) {  // sendbuff is read on the root only
    if (ncclResult_t rc = check_buffer(fn, "sendbuff", sendbuff, o->bytes, *c); rc != ncclSuccess)
      return in_group(rc);
  }
  if (ncclResult_t rc = check_buffer(fn, "recvbuff", recvbuff, o->bytes, *c); rc != ncclSuccess) return in_group(rc);
  o->what = strf("ncclBroadcast(%zu bytes from rank %d)", o->bytes, root);
  return in_group(issue(o));
}

ncclResult_t ncclGroupStart() {
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  Group& g = t_group;
  if (g.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g.depth > 0) return ncclSuccess;
  std::vector<std::shared_ptr<Op>> ops = std::move(g.ops);
  std::vector<std::shared_ptr<CommState>> inits = std::move(g.inits);
  const ncclResult_t error = g.error;
  g = Group{};
  bool nonblocking = false;
  ncclResult_t rc = ncclSuccess;
  for (auto& s : inits) {  // blocking inits complete here; non-blocking ones report through ncclCommGetAsyncError
    if (!s->blocking) {
      nonblocking = true;
      continue;
    }
    if (s->init_thread.joinable()) s->init_thread.join();
    if (rc == ncclSuccess && s->init_state.load() != ncclSuccess) rc = ncclResult_t(s->init_state.load());
  }
  if (error != ncclSuccess) {  // a failed call fails the group: none of its operations is issued
    for (auto& op : ops) op->rec->phase = Phase::abandoned;
    return error;
  }
  if (rc != ncclSuccess) return rc;
  if (ops.empty()) return nonblocking ? ncclInProgress : ncclSuccess;
  // one unit per stream, in order of first appearance
  std::vector<std::vector<std::shared_ptr<Op>>> by_stream;
  for (auto& op : ops) {
    auto it = std::find_if(by_stream.begin(), by_stream.end(),
                           [&](const auto& v) { return v.front()->stream == op->stream; });
    if (it == by_stream.end()) by_stream.push_back({op});
    else it->push_back(op);
  }
  auto group = std::make_shared<GroupState>();
  group->units_left = int(by_stream.size());
  for (auto& unit_ops : by_stream) {
    for (auto& op : unit_ops)
      if (!op->comm->blocking) {
        op->comm->launch_pending = true;
        nonblocking = true;
      }
    if (ncclResult_t q = queue_unit(std::move(unit_ops), group); q != ncclSuccess && rc == ncclSuccess) rc = q;
  }
  if (rc != ncclSuccess) return rc;
  return nonblocking ? ncclInProgress : ncclSuccess;
}

}  // extern "C"
