// The emulated CUDA runtime: the functions of the toolkit's <cuda_runtime_api.h> that the project calls, with the
// semantics NVIDIA documents for them (the runtime API reference and its "API synchronization behavior" and
// "stream synchronization behavior" pages), run on the CPU. See runtime.h for the model and README.md for what
// is checked.
#include "kernels/cuda/emu/runtime.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace dflash::emu {

bool describe_shared_fault(const void* addr, char* msg, size_t n);  // block.cpp

namespace {

using Clock = std::chrono::steady_clock;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// ---------------------------------------------------------------------------------------------------------------
// Errors: the sticky error of a device fault, and the per-thread last error of cudaGetLastError.
std::atomic<cudaError_t> g_sticky{cudaSuccess};
thread_local cudaError_t t_last = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) t_last = e;
  return e;
}

// A misuse of the API that a real runtime answers with an error code: the code, and a line on stderr that names
// the call and the problem (the code alone rarely says which pointer was wrong).
cudaError_t api_error(cudaError_t e, const std::string& msg) {
  std::fprintf(stderr, "%semulated GPU: %s (%s)\n", rank_prefix().c_str(), msg.c_str(), cudaGetErrorName(e));
  return fail(e);
}

cudaError_t sticky() { return g_sticky.load(); }

// ---------------------------------------------------------------------------------------------------------------
// Memory. Device allocations are separate mappings, each followed by a PROT_NONE guard page; they are readable
// and writable only while the device worker runs work (device code overrunning an allocation, or host code
// dereferencing device memory, faults and the SIGSEGV handler names the allocation).
struct Memory {
  std::mutex mu;
  std::map<const char*, Allocation> allocations;  // by base
  bool device_open = false;                         // the worker is running work: device memory is RW
  size_t device_bytes = 0;
  long device_allocations = 0, host_allocations = 0;  // every cudaMalloc(Async) / cudaMallocHost so far
  size_t peak_device_bytes = 0;
};
// Never destroyed (as g_dev): the detached worker may still walk it while static destructors run at exit.
Memory& g_mem = *new Memory;

size_t page_size() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}
size_t round_pages(size_t n) { return (n + page_size() - 1) / page_size() * page_size(); }

const Allocation* find_locked(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  auto it = g_mem.allocations.upper_bound(c);
  if (it == g_mem.allocations.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  if (c < a.base || c >= a.base + a.bytes) return nullptr;
  if (bytes > size_t(a.base + a.bytes - c)) return nullptr;
  return &a;
}

// The allocation whose mapping (with its guard page) holds p, for fault messages; any size.
const Allocation* find_mapping_locked(const void* p) {
  const char* c = static_cast<const char*>(p);
  auto it = g_mem.allocations.upper_bound(c);
  if (it == g_mem.allocations.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  const char* end = a.device_memory ? a.mapping + a.mapping_bytes : a.base + a.bytes;
  if (c >= a.base && c < end) return &a;
  return nullptr;
}

// DFLASH_EMU_PROTECT=0 leaves device memory accessible to host code (faster; host dereferences go unnoticed).
bool protection_on() {
  static const bool on = [] {
    const char* v = std::getenv("DFLASH_EMU_PROTECT");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

void protect_device(bool open) {  // g_mem.mu held
  if (g_mem.device_open == open || !protection_on()) return;
  for (auto& [base, a] : g_mem.allocations)
    if (a.device_memory)
      mprotect(a.mapping, a.mapping_bytes - page_size(), open ? PROT_READ | PROT_WRITE : PROT_NONE);
  g_mem.device_open = open;
}

// A device allocation: its 256-byte-rounded end flush against a guard page (cudaMalloc's alignment is 256), so
// that device code running past the end faults.
struct Mapping {
  char* base = nullptr;  // the allocation
  char* map = nullptr;
  size_t map_bytes = 0;
};
Mapping map_device(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  const size_t body = round_pages(rounded);
  void* p = mmap(nullptr, body + page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return {};
  Mapping m;
  m.map = static_cast<char*>(p);
  m.map_bytes = body + page_size();
  m.base = m.map + body - rounded;
  std::memset(m.base, 0xFF, bytes);  // a NaN pattern (fp32, bf16) / -1 (integers): uninitialised device memory
  mprotect(m.map + body, page_size(), PROT_NONE);  // the guard page
  return m;
}

// ---------------------------------------------------------------------------------------------------------------
// Streams and work.
struct Stream;
struct Item {
  Work w;
  std::vector<std::shared_ptr<Item>> deps;  // must be done before this one starts
  Stream* stream = nullptr;
  uint64_t seq = 0;
  Clock::time_point queued;
  bool started = false;  // run() called (poll pending)
  bool done = false;
  Clock::time_point finished;
};

struct Stream {
  int device = 0;
  bool legacy = false;       // the device's legacy default stream (stream 0, cudaStreamLegacy)
  bool non_blocking = false; // cudaStreamNonBlocking: no implicit barrier with the legacy stream
  std::deque<std::shared_ptr<Item>> queue;  // not yet done, in issue order
  std::shared_ptr<Item> tail;               // the last item issued (done or not)
};

struct Event {
  int device = 0;
  bool timing = true;
  std::shared_ptr<Item> at;  // the work this event waits for (its stream's tail when recorded); null: complete
  bool recorded = false;
};

struct Device {
  std::mutex mu;
  std::condition_variable work_cv;  // the worker waits for work here
  std::condition_variable done_cv;  // hosts wait for completions here
  std::set<Stream*> streams;        // created streams and the legacy ones
  std::vector<std::unique_ptr<Stream>> legacy;  // per device
  uint64_t next_seq = 1;
  uint64_t kicked_seq = 0;  // items up to this sequence number run without waiting for the lag
  std::string running;  // what the worker runs now (for fault messages)
  std::mt19937_64 rng;
} *g_dev = nullptr;

std::once_flag g_init_once;
int g_device_count = 1;
int g_lag_ms = 2;
OrderPolicy g_order;
thread_local int t_device = 0;

// DFLASH_EMU_PROFILE=1: the worker's time per kind of work (a kernel, cublasLtMatmul, a copy), printed at exit,
// to see what an emulated run spends its time on (CPU time of the emulation, not a GPU figure).
struct Profile {
  std::mutex mu;
  std::map<std::string, std::pair<double, long>> by_kind;  // seconds, items
};
Profile* g_profile = nullptr;
void print_profile() {
  std::vector<std::pair<std::string, std::pair<double, long>>> rows(g_profile->by_kind.begin(),
                                                                    g_profile->by_kind.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double total = 0;
  for (auto& r : rows) total += r.second.first;
  std::fprintf(stderr, "%semulated GPU profile (CPU seconds of the emulation, not GPU figures): %.3f s in all\n",
               rank_prefix().c_str(), total);
  for (auto& r : rows)
    std::fprintf(stderr, "  %8.3f s %5.1f%% %8ld  %s\n", r.second.first, 100 * r.second.first / (total > 0 ? total : 1),
                 r.second.second, r.first.c_str());
}
void profile(const std::string& what, double seconds) {
  if (!g_profile) return;
  const size_t cut = std::min(what.find(" ("), what.find('('));
  std::lock_guard<std::mutex> lk(g_profile->mu);
  auto& e = g_profile->by_kind[what.substr(0, cut)];
  e.first += seconds;
  e.second += 1;
}

void worker_loop();
void install_fault_handler();

// DFLASH_EMU_ALLOC_REPORT=FILE: at exit, one line per process appended to FILE with how many device and
// page-locked host allocations it made (and its peak device bytes): two runs of different lengths that report
// the same counts allocate nothing per step (tests/integration/cuda_job.sh, case bf16).
const char* g_alloc_report = nullptr;
void write_alloc_report() {
  FILE* f = std::fopen(g_alloc_report, "a");
  if (!f) {
    std::fprintf(stderr, "emulated GPU: DFLASH_EMU_ALLOC_REPORT=%s cannot be opened for appending\n", g_alloc_report);
    return;
  }
  std::lock_guard<std::mutex> lk(g_mem.mu);
  const std::string who = rank_prefix();
  std::fprintf(f, "%s device_allocations %ld host_allocations %ld peak_device_bytes %zu\n",
               who.empty() ? "[process]" : who.substr(0, who.size() - 1).c_str(), g_mem.device_allocations,
               g_mem.host_allocations, g_mem.peak_device_bytes);
  std::fclose(f);
}

void init() {
  std::call_once(g_init_once, [] {
    g_device_count = std::max(0, env_int("DFLASH_EMU_DEVICES", 1));  // 0: a machine without a GPU
    g_lag_ms = std::max(0, env_int("DFLASH_EMU_LAG_MS", 2));
    if (const char* o = std::getenv("DFLASH_EMU_ORDER"); o && *o) {
      const std::string s(o);
      if (s == "forward") g_order.order = Order::forward;
      else if (s == "reverse") g_order.order = Order::reverse;
      else if (s.rfind("shuffle", 0) == 0) {
        g_order.order = Order::shuffle;
        g_order.seed = s.size() > 8 ? std::strtoull(s.c_str() + 8, nullptr, 10) : 1;
      } else {
        std::fprintf(stderr, "emulated GPU: DFLASH_EMU_ORDER=%s is not forward, reverse or shuffle:SEED\n", o);
        std::abort();
      }
    }
    g_dev = new Device;  // never freed: the worker may run until exit
    g_dev->rng.seed(g_order.seed);
    for (int d = 0; d < g_device_count; ++d) {
      auto s = std::make_unique<Stream>();
      s->device = d;
      s->legacy = true;
      g_dev->streams.insert(s.get());
      g_dev->legacy.push_back(std::move(s));
    }
    install_fault_handler();
    if (const char* p = std::getenv("DFLASH_EMU_PROFILE"); p && *p && std::string(p) != "0") {
      g_profile = new Profile;
      std::atexit(print_profile);
    }
    if (const char* r = std::getenv("DFLASH_EMU_ALLOC_REPORT"); r && *r) {
      g_alloc_report = r;
      std::atexit(write_alloc_report);
    }
    std::thread(worker_loop).detach();  // runs until the process exits
  });
}

Stream* resolve(cudaStream_t s) {  // g_dev->mu held
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
    return t_device < int(g_dev->legacy.size()) ? g_dev->legacy[size_t(t_device)].get() : nullptr;
  Stream* st = reinterpret_cast<Stream*>(s);
  return g_dev->streams.count(st) ? st : nullptr;
}

bool item_ready(const Item& it) {
  if (it.stream->queue.empty() || it.stream->queue.front().get() != &it) return false;
  for (const auto& d : it.deps)
    if (!d->done) return false;
  return true;
}

// g_dev->mu held. Queues w on st with the implicit dependencies of the legacy default stream.
std::shared_ptr<Item> push(Stream* st, Work w, std::vector<std::shared_ptr<Item>> deps = {}) {
  auto it = std::make_shared<Item>();
  it->w = std::move(w);
  it->deps = std::move(deps);
  it->stream = st;
  it->seq = g_dev->next_seq++;
  it->queued = Clock::now();
  // The legacy default stream waits for all prior work of the device's blocking streams, and they wait for it.
  for (Stream* o : g_dev->streams) {
    if (o == st || o->device != st->device || !o->tail || o->tail->done) continue;
    if (st->legacy ? !o->non_blocking : (o->legacy && !st->non_blocking)) it->deps.push_back(o->tail);
  }
  st->queue.push_back(it);
  st->tail = it;
  g_dev->work_cv.notify_all();
  return it;
}

// Host-side wait until `item` is done (null: nothing to wait for); kicks the worker first.
cudaError_t wait_for(std::shared_ptr<Item> item) {
  std::unique_lock<std::mutex> lk(g_dev->mu);
  if (!item) return sticky();
  g_dev->kicked_seq = std::max(g_dev->kicked_seq, item->seq);
  g_dev->work_cv.notify_all();
  g_dev->done_cv.wait(lk, [&] { return item->done; });
  return sticky();
}

void finish(Item& it) {  // g_dev->mu held
  it.done = true;
  it.finished = Clock::now();
  Stream* st = it.stream;
  if (!st->queue.empty() && st->queue.front().get() == &it) st->queue.pop_front();
  g_dev->done_cv.notify_all();
  g_dev->work_cv.notify_all();
}

// g_dev->mu held: every queued item is dropped (after a fault nothing more runs; waits return the sticky error).
void drop_all() {
  for (Stream* st : g_dev->streams) {
    while (!st->queue.empty()) {
      auto it = st->queue.front();
      it->done = true;
      it->finished = Clock::now();
      st->queue.pop_front();
    }
  }
  g_dev->done_cv.notify_all();
}

std::thread::id g_worker_id;  // set by the worker itself (the std::thread is detached)


void worker_loop() {
  g_worker_id = std::this_thread::get_id();
  std::unique_lock<std::mutex> lk(g_dev->mu);
  for (;;) {
    const auto now = Clock::now();
    const auto lag = std::chrono::milliseconds(g_lag_ms);
    std::vector<std::shared_ptr<Item>> ready;
    std::vector<std::shared_ptr<Item>> polling;
    Clock::time_point next_due = Clock::time_point::max();
    for (Stream* st : g_dev->streams) {
      if (st->queue.empty()) continue;
      auto& head = st->queue.front();
      if (head->started) {
        polling.push_back(head);
        continue;
      }
      if (!item_ready(*head)) continue;
      if (head->seq <= g_dev->kicked_seq || now - head->queued >= lag) ready.push_back(head);
      else next_due = std::min(next_due, head->queued + lag);
    }
    if (ready.empty() && polling.empty()) {
      {  // idle: device memory closed to host code
        std::lock_guard<std::mutex> mlk(g_mem.mu);
        protect_device(false);
      }
      if (next_due == Clock::time_point::max()) g_dev->work_cv.wait(lk);
      else g_dev->work_cv.wait_until(lk, next_due);
      continue;
    }
    {
      std::lock_guard<std::mutex> mlk(g_mem.mu);
      protect_device(true);
    }
    if (!ready.empty()) {
      std::shared_ptr<Item> pick;
      std::sort(ready.begin(), ready.end(), [](const auto& a, const auto& b) { return a->seq < b->seq; });
      switch (g_order.order) {
        case Order::forward: pick = ready.front(); break;
        case Order::reverse: pick = ready.back(); break;
        case Order::shuffle: pick = ready[g_dev->rng() % ready.size()]; break;
      }
      pick->started = true;
      g_dev->running = pick->w.what;
      lk.unlock();
      const auto t0 = Clock::now();
      if (pick->w.run && sticky() == cudaSuccess) pick->w.run();
      profile(pick->w.what, std::chrono::duration<double>(Clock::now() - t0).count());
      const bool polls = bool(pick->w.poll) && sticky() == cudaSuccess;
      lk.lock();
      g_dev->running.clear();
      if (!polls && !pick->done) finish(*pick);
      continue;
    }
    // only work in flight outside this process (NCCL): poll it, briefly let go of the lock between rounds
    for (auto& it : polling) {
      lk.unlock();
      const bool done = sticky() != cudaSuccess || it->w.poll();
      lk.lock();
      if (done && !it->done) finish(*it);
    }
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lk.lock();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Faults: a SIGSEGV in device memory or a guard page is explained before the process dies.
struct sigaction g_old_segv;

void segv_handler(int sig, siginfo_t* info, void* ctx) {
  const void* addr = info->si_addr;
  const Allocation* a = nullptr;
  // no locking in a signal handler: a torn read of the map is possible, the message is best effort
  a = find_mapping_locked(addr);
  char msg[512];
  const bool on_worker = g_dev && std::this_thread::get_id() == g_worker_id;
  if (a) {
    const long off = long(static_cast<const char*>(addr) - a->base);
    if (size_t(off) >= a->bytes)
      std::snprintf(msg, sizeof msg, "%s touched %p, %ld bytes past the end of a %zu-byte %s allocation at %p%s%s",
                    on_worker ? "device work" : "host code", addr, off - long(a->bytes), a->bytes,
                    a->device_memory ? "device" : "pinned host", a->base, on_worker ? " in " : "",
                    on_worker ? g_dev->running.c_str() : "");
    else
      std::snprintf(msg, sizeof msg,
                    "host code dereferenced device memory at %p (offset %ld of a %zu-byte cudaMalloc allocation at "
                    "%p): device memory is not host-addressable; copy it with cudaMemcpy",
                    addr, off, a->bytes, a->base);
  } else if (!(on_worker && describe_shared_fault(addr, msg, sizeof msg))) {
    std::snprintf(msg, sizeof msg, "segmentation fault at %p%s%s", addr, on_worker ? " in device work " : "",
                  on_worker ? g_dev->running.c_str() : "");
  }
  const std::string line = rank_prefix() + "emulated GPU: " + msg + "\n";
  (void)!write(2, line.data(), line.size());
  sigaction(SIGSEGV, &g_old_segv, nullptr);  // the default (or previous) action ends the process
  (void)sig;
  (void)ctx;
}

void install_fault_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = segv_handler;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// runtime.h

cudaError_t enqueue(cudaStream_t stream, Work w) {
  init();
  if (cudaError_t e = sticky(); e != cudaSuccess) return fail(e);
  std::lock_guard<std::mutex> lk(g_dev->mu);
  Stream* st = resolve(stream);
  if (!st) return api_error(cudaErrorInvalidResourceHandle, w.what + ": the stream was destroyed or never created");
  push(st, std::move(w));
  return cudaSuccess;
}

void kick() {
  init();
  std::lock_guard<std::mutex> lk(g_dev->mu);
  g_dev->kicked_seq = g_dev->next_seq;
  g_dev->work_cv.notify_all();
}

const Allocation* find_allocation(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lk(g_mem.mu);
  return find_locked(p, bytes);
}

void device_fault(cudaError_t err, const std::string& msg) {
  std::fprintf(stderr, "%semulated GPU: %s (%s: the context is now unusable, as on a GPU)\n", rank_prefix().c_str(),
               msg.c_str(), cudaGetErrorName(err));
  cudaError_t expected = cudaSuccess;
  g_sticky.compare_exchange_strong(expected, err);
  // the worker holds no lock while it runs work: drop what is queued now
  std::lock_guard<std::mutex> lk(g_dev->mu);
  drop_all();
}

int current_device() { return t_device; }
int device_count() {
  init();
  return g_device_count;
}

std::string rank_prefix() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* r = std::getenv(v); r && *r) return std::string("[rank ") + r + "] ";
  return "";
}

const OrderPolicy& order_policy() {
  init();
  return g_order;
}


}  // namespace dflash::emu

// =================================================================================================================
// The CUDA runtime API (declared extern "C" by <cuda_runtime_api.h>).
using namespace dflash::emu;

namespace {

std::string ptr_str(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

// Where [p, p + n) lives, for the copy checks: 'd' device, 'p' pinned host, 'h' pageable host, 'x' a range that
// starts in an allocation and runs past its end.
char where(const void* p, size_t n) {
  std::lock_guard<std::mutex> lk(g_mem.mu);
  if (const Allocation* a = find_locked(p, n)) return a->device_memory ? 'd' : 'p';
  if (find_locked(p, 1)) return 'x';
  return 'h';
}

const char* where_name(char w) {
  switch (w) {
    case 'd': return "device memory";
    case 'p': return "pinned host memory";
    case 'h': return "pageable host memory";
    default: return "a range that runs past the end of its allocation";
  }
}

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    default: return "cudaMemcpyDefault";
  }
}

struct CopyPlan {
  char dst, src;
  cudaError_t err = cudaSuccess;
};

// Checks a copy's kind against where its pointers live (each side's whole extent).
CopyPlan plan_copy(const char* api, void* dst, size_t dst_extent, const void* src, size_t src_extent,
                   cudaMemcpyKind kind) {
  CopyPlan p{where(dst, dst_extent), where(src, src_extent)};
  auto bad = [&](const char* side, char w, const char* want) {
    p.err = api_error(cudaErrorInvalidValue,
                      std::string(api) + "(dst " + ptr_str(dst) + ", src " + ptr_str(src) + ", " + kind_name(kind) +
                          "): the " + side + " is " + where_name(w) + ", not " + want);
  };
  if (p.dst == 'x') bad("destination", 'x', "one whole allocation");
  else if (p.src == 'x') bad("source", 'x', "one whole allocation");
  else if (kind == cudaMemcpyHostToDevice && p.dst != 'd') bad("destination", p.dst, "device memory");
  else if (kind == cudaMemcpyHostToDevice && p.src == 'd') bad("source", p.src, "host memory");
  else if (kind == cudaMemcpyDeviceToHost && p.src != 'd') bad("source", p.src, "device memory");
  else if (kind == cudaMemcpyDeviceToHost && p.dst == 'd') bad("destination", p.dst, "host memory");
  else if (kind == cudaMemcpyDeviceToDevice && p.dst != 'd') bad("destination", p.dst, "device memory");
  else if (kind == cudaMemcpyDeviceToDevice && p.src != 'd') bad("source", p.src, "device memory");
  else if (kind == cudaMemcpyHostToHost && (p.dst == 'd' || p.src == 'd'))
    bad(p.dst == 'd' ? "destination" : "source", 'd', "host memory");
  else if (int(kind) < 0 || int(kind) > int(cudaMemcpyDefault))
    p.err = api_error(cudaErrorInvalidMemcpyDirection, std::string(api) + ": unknown cudaMemcpyKind");
  return p;
}

// DFLASH_EMU_DIGEST=FILE: one line per copy into host memory (its size and an FNV-1a hash of the bytes), in
// completion order: two runs of one program under two thread orders must write the same file
// (tests/cuda/run_orders.sh), which checks every result the host sees for order dependence.
void digest(const void* dst, size_t dpitch, size_t width, size_t rows) {
  static const char* path = std::getenv("DFLASH_EMU_DIGEST");
  if (!path || !*path) return;
  static std::mutex mu;
  static FILE* f = std::fopen(path, "w");
  if (!f) return;
  uint64_t h = 1469598103934665603ull;
  for (size_t r = 0; r < rows; ++r) {
    const unsigned char* p = static_cast<const unsigned char*>(dst) + r * dpitch;
    for (size_t i = 0; i < width; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  std::lock_guard<std::mutex> lk(mu);
  std::fprintf(f, "%zu %016llx\n", width * rows, static_cast<unsigned long long>(h));
  std::fflush(f);
}

// A 2-D copy (a 1-D copy is rows = 1): rows of `width` bytes, pitches in bytes. Runs on the worker (or at once
// for host-to-host).
void copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
}

// The documented synchronisation of a copy: `async` for cudaMemcpy*Async. Pageable host sources are staged (the
// host may reuse them once the call returns); a pageable destination means the call returns once the copy is
// done; pinned memory is read and written when the copy runs.
cudaError_t do_copy(const char* api, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t rows, cudaMemcpyKind kind, cudaStream_t stream, bool async) {
  init();
  if (cudaError_t e = sticky(); e != cudaSuccess) return fail(e);
  if (width == 0 || rows == 0) return cudaSuccess;
  if (dpitch < width || spitch < width)
    return api_error(cudaErrorInvalidPitchValue, std::string(api) + ": a pitch is smaller than the row width");
  const size_t dext = dpitch * (rows - 1) + width, sext = spitch * (rows - 1) + width;
  const CopyPlan p = plan_copy(api, dst, dext, src, sext, kind);
  if (p.err != cudaSuccess) return p.err;
  if (p.dst != 'd' && p.src != 'd') {  // host to host: fully synchronous
    copy_rows(dst, dpitch, src, spitch, width, rows);
    return cudaSuccess;
  }
  std::shared_ptr<std::vector<char>> staged;
  const void* from = src;
  size_t from_pitch = spitch;
  if (p.src == 'h') {  // pageable source: copied to staging now
    staged = std::make_shared<std::vector<char>>(width * rows);
    copy_rows(staged->data(), width, src, spitch, width, rows);
    from = staged->data();
    from_pitch = width;
  }
  Work w;
  w.what = std::string(api) + " of " + std::to_string(width * rows) + " bytes";
  const bool to_host = p.dst != 'd';
  w.run = [dst, dpitch, from, from_pitch, width, rows, staged, to_host] {
    copy_rows(dst, dpitch, from, from_pitch, width, rows);
    if (to_host) digest(dst, dpitch, width, rows);
  };
  std::shared_ptr<Item> item, before;
  {
    std::lock_guard<std::mutex> lk(g_dev->mu);
    Stream* st = resolve(async ? stream : nullptr);
    if (!st) return api_error(cudaErrorInvalidResourceHandle, std::string(api) + ": unknown or destroyed stream");
    before = st->tail;
    item = push(st, std::move(w));
  }
  const bool host_waits =
      p.dst == 'h' || (!async && p.dst == 'p') || (!async && p.src == 'p');  // documented synchronous cases
  if (host_waits) return fail(wait_for(item));
  // cudaMemcpy from pageable memory to the device: "a stream sync is performed before the copy is initiated"
  if (!async && p.src == 'h' && before) return fail(wait_for(before));
  return cudaSuccess;
}

cudaError_t do_memset(const char* api, void* dst, int value, size_t bytes, cudaStream_t stream, bool async) {
  init();
  if (cudaError_t e = sticky(); e != cudaSuccess) return fail(e);
  if (bytes == 0) return cudaSuccess;
  const char w = where(dst, bytes);
  if (w != 'd')
    return api_error(cudaErrorInvalidValue, std::string(api) + "(" + ptr_str(dst) + ", " + std::to_string(bytes) +
                                                " bytes): the destination is " + where_name(w) + ", not device memory");
  Work work;
  work.what = std::string(api) + " of " + std::to_string(bytes) + " bytes";
  work.run = [dst, value, bytes] { std::memset(dst, value, bytes); };
  std::lock_guard<std::mutex> lk(g_dev->mu);
  Stream* st = resolve(async ? stream : nullptr);
  if (!st) return api_error(cudaErrorInvalidResourceHandle, std::string(api) + ": unknown or destroyed stream");
  push(st, std::move(work));
  return cudaSuccess;  // asynchronous with respect to the host (device memory)
}

// Every stream of the current device done (cudaDeviceSynchronize, cudaFree's implicit synchronisation).
cudaError_t sync_device(int device) {
  std::vector<std::shared_ptr<Item>> tails;
  {
    std::lock_guard<std::mutex> lk(g_dev->mu);
    for (Stream* st : g_dev->streams)
      if (st->device == device && st->tail && !st->tail->done) tails.push_back(st->tail);
  }
  for (auto& t : tails) wait_for(t);
  return sticky();
}

cudaError_t malloc_impl(void** p, size_t bytes, bool device, bool pinned) {
  init();
  if (!p) return fail(cudaErrorInvalidValue);
  if (cudaError_t e = sticky(); e != cudaSuccess) return fail(e);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  Mapping mapping;
  void* m = nullptr;
  if (device) {
    mapping = map_device(bytes);
    m = mapping.base;
  } else {
    m = std::aligned_alloc(4096, round_pages(bytes));
    if (m) std::memset(m, 0xFF, bytes);
  }
  if (!m)
    return api_error(cudaErrorMemoryAllocation, std::string(device ? "cudaMalloc" : "cudaMallocHost") + " of " +
                                                    std::to_string(bytes) + " bytes: the host cannot map it");
  std::lock_guard<std::mutex> lk(g_mem.mu);
  Allocation a;
  a.mapping = mapping.map;
  a.mapping_bytes = mapping.map_bytes;
  a.base = static_cast<const char*>(m);
  a.bytes = bytes;
  a.device = device ? t_device : -1;
  a.device_memory = device;
  a.pinned = pinned;
  g_mem.allocations[a.base] = a;
  ++(device ? g_mem.device_allocations : g_mem.host_allocations);
  if (device) {
    g_mem.device_bytes += bytes;
    g_mem.peak_device_bytes = std::max(g_mem.peak_device_bytes, g_mem.device_bytes);
    if (!g_mem.device_open && protection_on()) mprotect(a.mapping, a.mapping_bytes - page_size(), PROT_NONE);
  }
  *p = m;
  return cudaSuccess;
}

// Unmaps (device) or frees (pinned host) a registered allocation; g_mem.mu held.
void release_locked(std::map<const char*, Allocation>::iterator it) {
  const Allocation a = it->second;
  g_mem.allocations.erase(it);
  if (a.device_memory) {
    g_mem.device_bytes -= a.bytes;
    munmap(a.mapping, a.mapping_bytes);
  } else {
    std::free(const_cast<char*>(a.base));
  }
}

cudaError_t free_impl(void* p, bool device, const char* api) {
  init();
  if (!p) return cudaSuccess;
  sync_device(t_device);  // cudaFree synchronises: work still queued may use the memory
  std::lock_guard<std::mutex> lk(g_mem.mu);
  auto it = g_mem.allocations.find(static_cast<const char*>(p));
  if (it == g_mem.allocations.end() || it->second.device_memory != device)
    return api_error(cudaErrorInvalidValue, std::string(api) + "(" + ptr_str(p) + "): not the start of a live " +
                                                (device ? "cudaMalloc" : "cudaMallocHost") + " allocation");
  release_locked(it);
  return cudaSuccess;
}

struct FuncAttrs {
  std::mutex mu;
  std::map<const void*, int> max_dynamic_smem;
  std::map<const void*, std::string> ids;  // the kernels' names in the records (register_kernel)
};
FuncAttrs& g_funcs = *new FuncAttrs;

}  // namespace

namespace dflash::emu {
// block.cpp: the dynamic shared memory a kernel may launch with (cudaFuncSetAttribute, default 48 KiB).
int max_dynamic_smem(const void* func) {
  std::lock_guard<std::mutex> lk(g_funcs.mu);
  auto it = g_funcs.max_dynamic_smem.find(func);
  return it == g_funcs.max_dynamic_smem.end() ? 48 * 1024 : it->second;
}
const kernels::GpuArch& emu_arch() {
  static const kernels::GpuArch* arch = [] {
    const char* a = std::getenv("DFLASH_EMU_ARCH");
    const kernels::GpuArch* found = kernels::find_gpu_arch(std::string_view(a && *a ? a : "sm_90"));
    if (!found) {
      std::fprintf(stderr, "emulated GPU: DFLASH_EMU_ARCH=%s is not sm_90, sm_100 or sm_120\n", a);
      std::abort();
    }
    return found;
  }();
  return *arch;
}
int emu_sm_count() { return emu_arch().sm == 120 ? 188 : emu_arch().sm == 100 ? 148 : 132; }
// The architecture's opt-in maximum of shared memory per block.
int arch_max_smem() { return int(emu_arch().smem_per_block_optin); }

void register_kernel(const void* func, const char* id) {
  std::lock_guard<std::mutex> lk(g_funcs.mu);
  g_funcs.ids.emplace(func, id);
}

const kernels::cuda::KernelRecord* kernel_record(const void* func, const char* id, bool* missing) {
  if (missing) *missing = false;
  if (!kernels::cuda::kernel_records_available()) return nullptr;
  std::string name = id ? id : "";
  if (name.empty()) {
    std::lock_guard<std::mutex> lk(g_funcs.mu);
    auto it = g_funcs.ids.find(func);
    if (it != g_funcs.ids.end()) name = it->second;
  }
  const kernels::cuda::KernelRecord* r =
      name.empty() ? nullptr : kernels::cuda::find_kernel_record(name, emu_arch().sm);
  if (!r && missing) *missing = true;
  return r;
}
}  // namespace dflash::emu

namespace {
// "no kernel record for …": why a kernel the records should hold is not found.
std::string missing_record(const void* func, const char* id) {
  std::string name = id ? id : "";
  if (name.empty()) {
    std::lock_guard<std::mutex> lk(g_funcs.mu);
    auto it = g_funcs.ids.find(func);
    name = it == g_funcs.ids.end() ? std::string("an unregistered kernel (call it through kernel_launch.cuh's "
                                                 "DFLASH_LAUNCH / kernel_attributes / allow_dynamic_smem)")
                                   : it->second;
  }
  return "no " + std::string(dflash::emu::emu_arch().name) + " code for " + name +
         " in the kernel records (cmake/kernel_records.cmake compiles kernels/cuda/*.cu and the emulated GPU's "
         "test kernels; a kernel elsewhere, or a name the records spell differently, is not there)";
}
}  // namespace

// ---- errors ----
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e != cudaSuccess ? e : sticky();
}
cudaError_t cudaPeekAtLastError(void) { return t_last != cudaSuccess ? t_last : sticky(); }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define DFLASH_EMU_ERR(x) case x: return #x;
    DFLASH_EMU_ERR(cudaSuccess)
    DFLASH_EMU_ERR(cudaErrorInvalidValue)
    DFLASH_EMU_ERR(cudaErrorMemoryAllocation)
    DFLASH_EMU_ERR(cudaErrorInvalidConfiguration)
    DFLASH_EMU_ERR(cudaErrorInvalidPitchValue)
    DFLASH_EMU_ERR(cudaErrorInvalidDevice)
    DFLASH_EMU_ERR(cudaErrorInvalidMemcpyDirection)
    DFLASH_EMU_ERR(cudaErrorInvalidResourceHandle)
    DFLASH_EMU_ERR(cudaErrorNotReady)
    DFLASH_EMU_ERR(cudaErrorIllegalAddress)
    DFLASH_EMU_ERR(cudaErrorLaunchFailure)
    DFLASH_EMU_ERR(cudaErrorLaunchOutOfResources)
    DFLASH_EMU_ERR(cudaErrorNoDevice)
    DFLASH_EMU_ERR(cudaErrorInvalidDeviceFunction)
    DFLASH_EMU_ERR(cudaErrorIllegalInstruction)
    DFLASH_EMU_ERR(cudaErrorMisalignedAddress)
    DFLASH_EMU_ERR(cudaErrorAssert)
#undef DFLASH_EMU_ERR
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorIllegalInstruction: return "an illegal instruction was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorAssert: return "device-side assert triggered";
    default: return "unknown error";
  }
}

// ---- devices ----
cudaError_t cudaGetDeviceCount(int* n) {
  if (!n) return fail(cudaErrorInvalidValue);
  *n = device_count();
  return *n > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int d) {
  init();
  if (d < 0 || d >= g_device_count)
    return api_error(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(d) + "): " +
                                                 std::to_string(g_device_count) +
                                                 " emulated device(s) (DFLASH_EMU_DEVICES)");
  t_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  if (!d) return fail(cudaErrorInvalidValue);
  *d = t_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  init();
  return fail(sync_device(t_device));
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  init();
  if (!prop || device < 0 || device >= g_device_count) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  const dflash::kernels::GpuArch& a = dflash::emu::emu_arch();
  std::snprintf(prop->name, sizeof prop->name, "dflash emulated GPU (%s, %s, on the CPU)", a.name, a.example);
  prop->totalGlobalMem = size_t(env_int("DFLASH_EMU_MEMORY_GIB", 16)) << 30;
  prop->sharedMemPerBlock = a.static_smem_per_block;
  prop->sharedMemPerBlockOptin = a.smem_per_block_optin;
  prop->sharedMemPerMultiprocessor = a.smem_per_sm;
  prop->reservedSharedMemPerBlock = a.reserved_smem_per_block;
  prop->regsPerBlock = a.regs_per_block;
  prop->regsPerMultiprocessor = a.regs_per_sm;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = a.max_threads_per_block;
  prop->maxThreadsPerMultiProcessor = a.max_threads_per_sm;
  prop->maxBlocksPerMultiProcessor = a.max_blocks_per_sm;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = a.sm / 10;
  prop->minor = a.sm % 10;
  prop->multiProcessorCount = dflash::emu::emu_sm_count();
  return cudaSuccess;
}
// The attributes the project asks for, as the emulated architecture has them; others are refused by name.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  init();
  if (!value) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= g_device_count) return fail(cudaErrorInvalidDevice);
  const dflash::kernels::GpuArch& a = dflash::emu::emu_arch();
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(a.smem_per_block_optin); return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(a.static_smem_per_block); return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = int(a.smem_per_sm); return cudaSuccess;
    case cudaDevAttrReservedSharedMemoryPerBlock: *value = int(a.reserved_smem_per_block); return cudaSuccess;
    case cudaDevAttrMaxRegistersPerBlock: *value = a.regs_per_block; return cudaSuccess;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = a.regs_per_sm; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *value = a.max_threads_per_block; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = a.max_threads_per_sm; return cudaSuccess;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = a.max_blocks_per_sm; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = dflash::emu::emu_sm_count(); return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = a.sm / 10; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = a.sm % 10; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    default:
      return api_error(cudaErrorInvalidValue,
                       "cudaDeviceGetAttribute(" + std::to_string(int(attr)) + "): attribute not emulated");
  }
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  init();
  const size_t t = size_t(env_int("DFLASH_EMU_MEMORY_GIB", 16)) << 30;
  std::lock_guard<std::mutex> lk(g_mem.mu);
  if (total) *total = t;
  if (free_bytes) *free_bytes = t > g_mem.device_bytes ? t - g_mem.device_bytes : 0;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  if (v) *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v) *v = CUDART_VERSION;
  return cudaSuccess;
}

// ---- memory ----
// DFLASH_EMU_FAIL_MALLOC=N: the N-th cudaMalloc of the process fails (out of memory), to test the clean-up of
// what was made before it.
cudaError_t cudaMalloc(void** p, size_t bytes) {
  static const int fail_at = env_int("DFLASH_EMU_FAIL_MALLOC", 0);
  static std::atomic<int> calls{0};
  if (fail_at > 0 && ++calls == fail_at) {
    if (p) *p = nullptr;
    return api_error(cudaErrorMemoryAllocation, "cudaMalloc(" + std::to_string(bytes) + " bytes): call " +
                                                    std::to_string(fail_at) + " refused (DFLASH_EMU_FAIL_MALLOC)");
  }
  return malloc_impl(p, bytes, true, false);
}
cudaError_t cudaFree(void* p) { return fail(free_impl(p, true, "cudaFree")); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return malloc_impl(p, bytes, false, true); }
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return malloc_impl(p, bytes, false, true); }
cudaError_t cudaFreeHost(void* p) { return fail(free_impl(p, false, "cudaFreeHost")); }

// Stream-ordered allocation: the memory exists at once (later work of any stream may use it once ordered after
// this call); the free happens when the stream reaches it.
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return malloc_impl(p, bytes, true, false); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lk(g_mem.mu);
    auto it = g_mem.allocations.find(static_cast<const char*>(p));
    if (it == g_mem.allocations.end() || !it->second.device_memory)
      return api_error(cudaErrorInvalidValue, "cudaFreeAsync(" + ptr_str(p) + "): not a live device allocation");
  }
  Work w;
  w.what = "cudaFreeAsync";
  w.run = [p] {
    std::lock_guard<std::mutex> lk(g_mem.mu);
    auto it = g_mem.allocations.find(static_cast<const char*>(p));
    if (it != g_mem.allocations.end()) release_locked(it);
  };
  return fail(enqueue(stream, std::move(w)));
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  init();
  if (!attr) return fail(cudaErrorInvalidValue);
  std::memset(attr, 0, sizeof *attr);
  std::lock_guard<std::mutex> lk(g_mem.mu);
  const Allocation* a = find_locked(p, 1);
  if (!a) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    return cudaSuccess;
  }
  attr->type = a->device_memory ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  attr->device = a->device_memory ? a->device : t_device;
  attr->devicePointer = const_cast<void*>(p);
  attr->hostPointer = a->device_memory ? nullptr : const_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return do_copy("cudaMemcpy", dst, n, src, n, n, 1, kind, nullptr, false);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  return do_copy("cudaMemcpyAsync", dst, n, src, n, n, 1, kind, stream, true);
}
cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind) {
  return do_copy("cudaMemcpy2D", dst, dpitch, src, spitch, width, height, kind, nullptr, false);
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  return do_copy("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, stream, true);
}
cudaError_t cudaMemset(void* dst, int value, size_t n) { return do_memset("cudaMemset", dst, value, n, nullptr, false); }
cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t stream) {
  return do_memset("cudaMemsetAsync", dst, value, n, stream, true);
}

// ---- streams ----
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  init();
  if (!s) return fail(cudaErrorInvalidValue);
  auto* st = new Stream;
  st->device = t_device;
  st->non_blocking = (flags & cudaStreamNonBlocking) != 0;
  std::lock_guard<std::mutex> lk(g_dev->mu);
  g_dev->streams.insert(st);
  *s = reinterpret_cast<cudaStream_t>(st);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(s, flags);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  init();
  std::shared_ptr<Item> tail;
  {
    std::lock_guard<std::mutex> lk(g_dev->mu);
    Stream* st = resolve(s);
    if (!st) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: unknown or destroyed stream");
    tail = st->tail;
  }
  return fail(wait_for(tail));
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  init();
  if (cudaError_t e = sticky(); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lk(g_dev->mu);
  Stream* st = resolve(s);
  if (!st) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamQuery: unknown or destroyed stream");
  if (!st->tail || st->tail->done) return cudaSuccess;
  g_dev->kicked_seq = std::max(g_dev->kicked_seq, st->tail->seq);  // a poll means the host wants it done
  g_dev->work_cv.notify_all();
  return cudaErrorNotReady;
}

// Destroying a stream with work queued is allowed: the work completes, then the stream's resources go.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  init();
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
    return api_error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of a default stream");
  std::shared_ptr<Item> tail;
  {
    std::lock_guard<std::mutex> lk(g_dev->mu);
    Stream* st = resolve(s);
    if (!st) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: unknown or destroyed stream");
    tail = st->tail;
  }
  wait_for(tail);
  std::lock_guard<std::mutex> lk(g_dev->mu);
  Stream* st = reinterpret_cast<Stream*>(s);
  g_dev->streams.erase(st);
  // items keep a raw pointer to their stream: events may still hold the tail; it is done, so never dereferenced
  delete st;
  return cudaSuccess;
}

// ---- events ----
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  init();
  if (!e) return fail(cudaErrorInvalidValue);
  auto* ev = new Event;
  ev->device = t_device;
  ev->timing = (flags & cudaEventDisableTiming) == 0;
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<Event*>(e);  // an event destroyed while pending: its waits already hold the item
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  init();
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t err = sticky(); err != cudaSuccess) return fail(err);
  auto* ev = reinterpret_cast<Event*>(e);
  std::lock_guard<std::mutex> lk(g_dev->mu);
  Stream* st = resolve(s);
  if (!st) return api_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: unknown or destroyed stream");
  // A marker item: it completes when everything before it on the stream has (its completion time is the
  // event's timestamp), and carries the legacy stream's implicit dependencies like any work.
  Work w;
  w.what = "cudaEventRecord";
  ev->at = push(st, std::move(w));
  ev->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  init();
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t err = sticky(); err != cudaSuccess) return err;
  auto* ev = reinterpret_cast<Event*>(e);
  std::lock_guard<std::mutex> lk(g_dev->mu);
  if (!ev->at || ev->at->done) return cudaSuccess;
  g_dev->kicked_seq = std::max(g_dev->kicked_seq, ev->at->seq);
  g_dev->work_cv.notify_all();
  return cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  init();
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Item> at;
  {
    std::lock_guard<std::mutex> lk(g_dev->mu);
    at = reinterpret_cast<Event*>(e)->at;
  }
  return fail(wait_for(at));
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  init();
  if (!ms || !start || !end) return fail(cudaErrorInvalidValue);
  auto *a = reinterpret_cast<Event*>(start), *b = reinterpret_cast<Event*>(end);
  if (!a->timing || !b->timing) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lk(g_dev->mu);
  if (!a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
  if (!a->at->done || !b->at->done) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->at->finished - a->at->finished).count();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  init();
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t err = sticky(); err != cudaSuccess) return fail(err);
  std::lock_guard<std::mutex> lk(g_dev->mu);
  Stream* st = resolve(s);
  if (!st) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: unknown or destroyed stream");
  auto* ev = reinterpret_cast<Event*>(e);
  Work w;
  w.what = "cudaStreamWaitEvent";
  std::vector<std::shared_ptr<Item>> deps;
  if (ev->at && !ev->at->done) deps.push_back(ev->at);  // the event as recorded now; a later record does not count
  push(st, std::move(w), std::move(deps));
  return cudaSuccess;
}

// ---- kernels ----
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  init();
  if (!func) return fail(cudaErrorInvalidDeviceFunction);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    bool missing = false;
    const dflash::kernels::cuda::KernelRecord* r = dflash::emu::kernel_record(func, nullptr, &missing);
    if (missing) return api_error(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute: " + missing_record(func, nullptr));
    const dflash::kernels::GpuArch& a = dflash::emu::emu_arch();
    // the opt-in limit covers static + dynamic shared memory: a kernel's static share comes off what it may ask
    const size_t limit = r ? dflash::kernels::max_dynamic_smem(r->res, a) : a.smem_per_block_optin;
    if (value < 0 || size_t(value) > limit)
      return api_error(cudaErrorInvalidValue,
                       "cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " + std::to_string(value) + "): above " +
                           a.name + "'s " + std::to_string(a.smem_per_block_optin) + " bytes a block" +
                           (r && r->res.static_smem ? " less the kernel's " + std::to_string(r->res.static_smem) +
                                                          " of static shared memory"
                                                    : std::string()) +
                           " (DFLASH_EMU_ARCH)");
    std::lock_guard<std::mutex> lk(g_funcs.mu);
    g_funcs.max_dynamic_smem[func] = value;
    return cudaSuccess;
  }
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
  return api_error(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute not emulated");
}
// As nvcc compiled the kernel for the emulated architecture (its record); without records, the registers and
// stack are unknown (0) and maxThreadsPerBlock is the architecture's.
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  init();
  if (!attr || !func) return fail(cudaErrorInvalidValue);
  bool missing = false;
  const dflash::kernels::cuda::KernelRecord* r = dflash::emu::kernel_record(func, nullptr, &missing);
  if (missing) return api_error(cudaErrorInvalidDeviceFunction, "cudaFuncGetAttributes: " + missing_record(func, nullptr));
  const dflash::kernels::GpuArch& a = dflash::emu::emu_arch();
  std::memset(attr, 0, sizeof *attr);
  const dflash::kernels::KernelResources res = r ? r->res : dflash::kernels::KernelResources{};
  attr->numRegs = res.regs;
  attr->sharedSizeBytes = res.static_smem;
  attr->localSizeBytes = res.local_bytes;
  attr->maxThreadsPerBlock = dflash::kernels::max_threads_per_block(res, a);
  attr->maxDynamicSharedSizeBytes = dflash::emu::max_dynamic_smem(func);
  attr->binaryVersion = a.sm;
  attr->ptxVersion = a.sm;
  return cudaSuccess;
}
