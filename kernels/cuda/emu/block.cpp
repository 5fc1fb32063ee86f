// Kernels on the emulated GPU: a launch is one stream work item; each block runs on the device worker thread with
// every CUDA thread a fiber (Boost.Context: a context switch is a few dozen instructions, against ucontext's
// signal-mask system call, and a block switches at every barrier and warp operation). Between two rendezvous
// (a barrier, a warp collective) the fibers run one after another in the order of DFLASH_EMU_ORDER, so code
// that relies on an order the hardware does not guarantee gives different bits under another order.
#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/emu/device.h"
#include "kernels/cuda/emu/runtime.h"

namespace dflash::emu {

int max_dynamic_smem(const void* func);  // runtime.cpp
size_t cp_async_thread_exit(ThreadState& t);  // warp_mma.cpp: frees a thread's cp.async state
int arch_max_smem();                     // runtime.cpp

thread_local ThreadState* tls_thread = nullptr;

namespace ctx = boost::context;

namespace {

constexpr size_t kStaticSharedLimit = 48 * 1024;

size_t page() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}

// Fiber stacks, reused from block to block (mapping a stack per thread per block would dominate the run time).
struct StackPool {
  size_t size = 0;
  std::vector<ctx::stack_context> free;
  ctx::stack_context allocate() {
    if (!free.empty()) {
      ctx::stack_context sc = free.back();
      free.pop_back();
      return sc;
    }
    const size_t len = size + page();
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "emulated GPU: cannot map a %zu-byte fiber stack\n", len);
      std::abort();
    }
    mprotect(m, page(), PROT_NONE);  // a stack overflow faults instead of corrupting the neighbour
    ctx::stack_context sc;
    sc.size = size;
    sc.sp = static_cast<char*>(m) + len;
    return sc;
  }
  void deallocate(ctx::stack_context& sc) { free.push_back(sc); }
};
StackPool& stack_pool() {
  static StackPool p = [] {
    StackPool s;
    const char* kb = std::getenv("DFLASH_EMU_STACK_KB");
    s.size = size_t(kb && *kb ? std::atoi(kb) : 64) * 1024;
    return s;
  }();
  return p;
}
struct PoolAllocator {  // Boost.Context's StackAllocator concept over the pool
  ctx::stack_context allocate() { return stack_pool().allocate(); }
  void deallocate(ctx::stack_context& sc) { stack_pool().deallocate(sc); }
};

enum class State { runnable, barrier, warp, done };

struct Thread {
  ThreadState ts;
  ctx::fiber fiber;
  State state = State::runnable;
  const char* file = "";  // where it waits
  int line = 0;
  // its pending warp collective
  const char* what = nullptr;
  unsigned mask = 0;
  const void* in = nullptr;
  void* out = nullptr;
};

// The shared memory of the block being run: static declarations from the bottom, dynamic at the top, ending at
// a guard page.
struct SharedArena {
  char* base = nullptr;
  size_t capacity = 0;  // bytes before the guard page
  size_t static_used = 0;
  size_t dynamic = 0;
  std::map<const void*, size_t> offsets;  // declaration → offset

  void ensure() {
    if (base) return;
    capacity = (size_t(228) * 1024 + page() - 1) / page() * page();
    void* m = mmap(nullptr, capacity + page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::abort();
    base = static_cast<char*>(m);
    mprotect(base + capacity, page(), PROT_NONE);
  }
  char* dynamic_base() const { return base + capacity - dynamic; }
};

struct Block {
  const char* kernel = "";
  const char* file = "";
  int line = 0;
  dim3 grid, block;
  uint3 index{};
  std::vector<Thread> threads;
  ctx::fiber sched;     // the scheduler, while a fiber runs
  Thread* current = nullptr;
  struct Pending {  // the warp collective a warp's lanes are arriving at
    unsigned mask = 0;
    const char* what = nullptr;
    int arrived = 0;
  };
  std::vector<Pending> pending;             // per warp
  const std::vector<int>* round = nullptr;  // the threads of the round being run, in order
  size_t cursor = 0;                        // the next of them to consider
  std::string error;    // set by a fiber that found a misuse; the block stops
  SharedArena* shared = nullptr;
  std::vector<int> woken;  // threads a completed warp collective made runnable, for the next round
  int n_done = 0, n_barrier = 0;
  const char* barrier_file = nullptr;  // the site of the first thread at the current barrier
  int barrier_line = 0;
  bool barrier_mismatch = false;       // a thread waits at a barrier of another site
  bool launch_over = false;            // the parked fibers return
};
thread_local Block* t_block = nullptr;
thread_local SharedArena t_shared;

// Two collectives of one kind (the same literal may sit at two addresses when inline code of two files meets).
bool same_what(const char* a, const char* b) { return a == b || std::strcmp(a, b) == 0; }

std::string idx3(uint3 v) { return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")"; }
std::string dim3s(dim3 v) { return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")"; }

std::string where(const Block& b) {
  return std::string("kernel ") + b.kernel + " (launched at " + b.file + ":" + std::to_string(b.line) + ", grid " +
         dim3s(b.grid) + ", block " + dim3s(b.block) + "), block " + idx3(b.index);
}

std::string state_of(const Thread& t) {
  switch (t.state) {
    case State::done: return "has exited";
    case State::barrier: return std::string("waits at __syncthreads at ") + t.file + ":" + std::to_string(t.line);
    case State::warp:
      return std::string("waits at ") + t.what + " (mask 0x" + [&] {
        char b[16];
        std::snprintf(b, sizeof b, "%08x", t.mask);
        return std::string(b);
      }() + ") at " + t.file + ":" + std::to_string(t.line);
    default: return "is runnable";
  }
}

// Switches from the running context to `target`, leaving this context's continuation in `*slot` (its Thread's
// fiber, or the scheduler's): every switch goes through here, so each side always knows where the other waits.
// Fibers switch to one another directly (one context switch per thread and rendezvous, not two through the
// scheduler); only the end of a round goes back to the scheduler.
void switch_to(ctx::fiber& target, ctx::fiber* slot) {
  ctx::fiber t = std::move(target);
  ctx::fiber back = std::move(t).resume_with([slot](ctx::fiber&& c) {
    *slot = std::move(c);
    return ctx::fiber{};
  });
  if (back) t_block->sched = std::move(back);  // resumed by a plain resume(): the scheduler, at the launch's end
}

// The next runnable thread of the round, or null: the round is over.
Thread* next_in_round(Block& b) {
  while (b.cursor < b.round->size()) {
    Thread& t = b.threads[size_t((*b.round)[b.cursor++])];
    if (t.state == State::runnable) return &t;
  }
  return nullptr;
}

// The running thread stops (it waits, or finished its block): control goes to the round's next runnable thread,
// or back to the scheduler. Returns when someone switches back to it.
void leave(Thread& me) {
  Block& b = *t_block;
  if (Thread* next = b.error.empty() ? next_in_round(b) : nullptr) {
    b.current = next;
    switch_to(next->fiber, &me.fiber);
  } else {
    switch_to(b.sched, &me.fiber);
  }
  tls_thread = &me.ts;
}

// A fiber found a misuse: record it and hand control back for good (the scheduler unwinds the block).
[[noreturn]] void fiber_error(const std::string& msg) {
  Block& b = *t_block;
  if (b.error.empty()) b.error = msg;
  for (;;) switch_to(b.sched, &b.current->fiber);
}

void yield() { leave(*t_block->current); }

// The order of one round of runnable threads: by thread index, reversed, or shuffled.
void order_round(std::vector<int>& ids, std::mt19937_64& rng) {
  const OrderPolicy& p = order_policy();
  if (p.order == Order::shuffle) {
    std::shuffle(ids.begin(), ids.end(), rng);
    return;
  }
  if (!std::is_sorted(ids.begin(), ids.end())) std::sort(ids.begin(), ids.end());
  if (p.order == Order::reverse) std::reverse(ids.begin(), ids.end());
}

// Why nothing can run: the message of a barrier or warp collective that some thread never reaches.
std::string deadlock(const Block& b) {
  std::string msg;
  const Thread* at_barrier = nullptr;
  for (const Thread& t : b.threads)
    if (t.state == State::barrier) at_barrier = &t;
  for (const Thread& t : b.threads) {
    if (t.state != State::warp) continue;
    const int base = t.ts.warp * kWarpSize;
    for (int l = 0; l < kWarpSize; ++l) {
      if (!(t.mask >> l & 1u)) continue;
      if (base + l >= int(b.threads.size()))
        return where(b) + ": " + t.what + " at " + t.file + ":" + std::to_string(t.line) + " in warp " +
               std::to_string(t.ts.warp) + " names lane " + std::to_string(l) + ", which the block does not have";
      const Thread& o = b.threads[base + l];
      if (o.state != State::warp || !same_what(o.what, t.what) || o.mask != t.mask)
        return where(b) + ": " + t.what + " at " + t.file + ":" + std::to_string(t.line) + " by thread " +
               idx3(t.ts.thread_idx) + " (warp " + std::to_string(t.ts.warp) + ", lane " + std::to_string(t.ts.lane) +
               ") names lane " + std::to_string(l) + " in its mask, which does not arrive: thread " +
               idx3(o.ts.thread_idx) + " " + state_of(o);
    }
  }
  if (at_barrier) {
    for (const Thread& t : b.threads)
      if (t.state != State::barrier || t.line != at_barrier->line || std::strcmp(t.file, at_barrier->file) != 0)
        return where(b) + ": a barrier not reached by every thread of the block (divergence): thread " +
               idx3(at_barrier->ts.thread_idx) + " " + state_of(*at_barrier) + ", but thread " +
               idx3(t.ts.thread_idx) + " " + state_of(t);
  }
  return where(b) + ": the block's threads wait for each other and none can go on" + msg;
}

// Runs one block to completion; returns false (after reporting) when it found a misuse. The fibers are made for
// the launch's first block and reused by the next ones: a fiber that finished its thread parks, and the scheduler
// resumes it with the next block's indices.
bool run_block(Block& b, const std::function<void()>& body, std::mt19937_64& rng) {
  const int n = int(b.block.x * b.block.y * b.block.z);
  const bool first = b.threads.empty();
  if (first) b.threads.resize(size_t(n));
  b.error.clear();
  SharedArena& sh = *b.shared;
  sh.offsets.clear();
  sh.static_used = 0;
  std::memset(sh.dynamic_base(), 0xFF, sh.dynamic);  // uninitialised shared memory reads as NaN
  for (int i = 0; i < n; ++i) {
    Thread& t = b.threads[size_t(i)];
    t.ts.thread_idx = uint3{unsigned(i % b.block.x), unsigned(i / b.block.x % b.block.y),
                            unsigned(i / (b.block.x * b.block.y))};
    t.ts.block_idx = b.index;
    t.ts.block_dim = b.block;
    t.ts.grid_dim = b.grid;
    t.ts.linear_tid = i;
    t.ts.lane = i % kWarpSize;
    t.ts.warp = i / kWarpSize;
    t.state = State::runnable;
    if (!first) continue;
    Thread* self = &t;
    // started by switch_to (its continuation already stored): the argument is empty
    t.fiber = ctx::fiber(std::allocator_arg, PoolAllocator{}, [self, &body](ctx::fiber&&) {
      for (;;) {
        tls_thread = &self->ts;
        body();
        cp_async_thread_exit(self->ts);
        Block& blk = *t_block;
        self->state = State::done;
        ++blk.n_done;
        leave(*self);  // parked until the next block, or the launch's end
        if (t_block->launch_over) break;
      }
      return std::move(t_block->sched);
    });
  }
  b.pending.assign(size_t((n + kWarpSize - 1) / kWarpSize), Block::Pending{});
  b.woken.clear();
  b.n_done = b.n_barrier = 0;
  b.barrier_file = nullptr;
  b.barrier_mismatch = false;
  std::vector<int> round(static_cast<size_t>(n));
  std::iota(round.begin(), round.end(), 0);
  for (;;) {
    order_round(round, rng);
    b.round = &round;
    b.cursor = 0;
    if (Thread* first = next_in_round(b)) {  // the threads pass control along the round, then back here
      b.current = first;
      switch_to(first->fiber, &b.sched);
    }
    if (!b.error.empty()) break;
    round.swap(b.woken);
    b.woken.clear();
    if (!round.empty()) continue;
    // nothing runnable: every thread done, or all waiting
    if (b.n_done == n) break;
    if (b.n_barrier == n && !b.barrier_mismatch) {  // every thread at the same barrier: release it
      for (int i = 0; i < n; ++i) {
        b.threads[size_t(i)].state = State::runnable;
        round.push_back(i);
      }
      b.n_barrier = 0;
      b.barrier_file = nullptr;
      continue;
    }
    b.error = deadlock(b);
    break;
  }
  tls_thread = nullptr;
  b.current = nullptr;
  if (b.error.empty()) return true;
  b.threads.clear();  // unwinds the suspended fibers
  device_fault(cudaErrorLaunchFailure, b.error);
  return false;
}

}  // namespace

void syncthreads(const char* file, int line) {
  Block& b = *t_block;
  Thread& t = *b.current;
  if (!b.barrier_file) {
    b.barrier_file = file;
    b.barrier_line = line;
  } else if (line != b.barrier_line || (file != b.barrier_file && std::strcmp(file, b.barrier_file) != 0)) {
    b.barrier_mismatch = true;
  }
  ++b.n_barrier;
  t.state = State::barrier;
  t.file = file;
  t.line = line;
  yield();
}

void warp_collective(unsigned mask, const char* what, const char* file, int line, const void* in, void* out,
                     WarpCombine combine, void* cctx) {
  Block& b = *t_block;
  Thread& me = *b.current;
  if (!(mask >> me.ts.lane & 1u)) {
    char m[16];
    std::snprintf(m, sizeof m, "%08x", mask);
    fiber_error(where(b) + ": " + what + " at " + file + ":" + std::to_string(line) + " by thread " +
                idx3(me.ts.thread_idx) + " (lane " + std::to_string(me.ts.lane) + "): its mask 0x" + m +
                " does not name the calling lane");
  }
  me.state = State::warp;
  me.file = file;
  me.line = line;
  me.what = what;
  me.mask = mask;
  me.in = in;
  me.out = out;
  const int base = me.ts.warp * kWarpSize;
  Block::Pending& p = b.pending[size_t(me.ts.warp)];
  if (p.arrived > 0 && (p.mask != mask || !same_what(p.what, what))) {
    // two collectives pending at once in one warp: divergence (name a lane waiting at the other one)
    for (int l = 0; l < kWarpSize; ++l) {
      const Thread* o = base + l < int(b.threads.size()) ? &b.threads[size_t(base + l)] : nullptr;
      if (o && o != &me && o->state == State::warp)
        fiber_error(where(b) + ": warp " + std::to_string(me.ts.warp) + " diverges: thread " +
                    idx3(me.ts.thread_idx) + " is at " + what + " at " + file + ":" + std::to_string(line) +
                    " while lane " + std::to_string(l) + " " + state_of(*o));
    }
  }
  if (p.arrived == 0) {
    p.mask = mask;
    p.what = what;
  }
  // the collective completes when every lane of the mask arrived (a lane the block lacks never does: deadlock())
  const bool all = ++p.arrived == __builtin_popcount(mask);
  if (all) {  // the last lane to arrive completes the collective for all of them
    p.arrived = 0;
    const void* ins[kWarpSize] = {};
    void* outs[kWarpSize] = {};
    for (int l = 0; l < kWarpSize; ++l)
      if (mask >> l & 1u) {
        ins[l] = b.threads[size_t(base + l)].in;
        outs[l] = b.threads[size_t(base + l)].out;
      }
    combine(ins, outs, mask, cctx);
    for (int l = 0; l < kWarpSize; ++l) {
      if (!(mask >> l & 1u)) continue;
      b.threads[size_t(base + l)].state = State::runnable;
      if (base + l != me.ts.linear_tid) b.woken.push_back(base + l);  // the caller goes on at once
    }
    return;
  }
  yield();
}

void syncwarp_at(const char* file, int line, unsigned mask) {
  warp_collective(mask, "__syncwarp", file, line, nullptr, nullptr, [](const void* const*, void* const*, unsigned, void*) {}, nullptr);
}

namespace {
struct ShflIn {
  uint64_t bits;
  int arg, width, mode;
};
void shfl_combine(const void* const* ins, void* const* outs, unsigned mask, void*) {
  for (int l = 0; l < kWarpSize; ++l) {
    if (!ins[l]) continue;
    const ShflIn& in = *static_cast<const ShflIn*>(ins[l]);
    const int w = in.width, seg = l & ~(w - 1);
    int src = l;
    switch (in.mode) {
      case 0: src = seg | (in.arg & (w - 1)); break;
      case 1: src = l ^ in.arg; if (src >= seg + w) src = l; break;
      case 2: src = l - in.arg; if (src < seg) src = l; break;
      case 3: src = l + in.arg; if (src >= seg + w) src = l; break;
    }
    uint64_t v = ~uint64_t(0);  // a lane outside the mask: undefined on a GPU, a NaN pattern here
    if (src >= 0 && src < kWarpSize && (mask >> src & 1u)) v = static_cast<const ShflIn*>(ins[src])->bits;
    *static_cast<uint64_t*>(outs[l]) = v;
  }
}
}  // namespace

uint64_t shfl_bits(const char* file, int line, const char* what, int mode, unsigned mask, uint64_t bits, int arg,
                   int width) {
  if (width < 1 || width > kWarpSize || (width & (width - 1)) != 0)
    fiber_error(where(*t_block) + ": " + what + " at " + file + ":" + std::to_string(line) + ": width " +
                std::to_string(width) + " is not a power of two ≤ 32");
  ShflIn in{bits, arg, width, mode};
  uint64_t out = 0;
  warp_collective(mask, what, file, line, &in, &out, shfl_combine, nullptr);
  return out;
}

unsigned ballot_at(const char* file, int line, const char* what, unsigned mask, bool pred) {
  const int p = pred ? 1 : 0;
  unsigned out = 0;
  warp_collective(mask, what, file, line, &p, &out,
                  [](const void* const* ins, void* const* outs, unsigned m, void*) {
                    unsigned r = 0;
                    for (int l = 0; l < kWarpSize; ++l)
                      if ((m >> l & 1u) && *static_cast<const int*>(ins[l])) r |= 1u << l;
                    for (int l = 0; l < kWarpSize; ++l)
                      if (m >> l & 1u) *static_cast<unsigned*>(outs[l]) = r;
                  },
                  nullptr);
  return out;
}

unsigned activemask() {
  const Block& b = *t_block;
  const int base = tls_thread->warp * kWarpSize;
  unsigned m = 0;
  for (int l = 0; l < kWarpSize && base + l < int(b.threads.size()); ++l)
    if (b.threads[size_t(base + l)].state != State::done) m |= 1u << l;
  return m;
}

void* block_shared(const void* key, size_t bytes, size_t align) {
  Block& b = *t_block;
  SharedArena& sh = *b.shared;
  auto it = sh.offsets.find(key);
  if (it != sh.offsets.end()) return sh.base + it->second;
  const size_t off = (sh.static_used + align - 1) / align * align;
  if (off + bytes > kStaticSharedLimit || off + bytes + sh.dynamic > size_t(arch_max_smem()))
    fiber_error(where(b) + ": " + std::to_string(off + bytes) + " bytes of static shared memory (+ " +
                std::to_string(sh.dynamic) + " dynamic) exceed the limits (48 KiB static, " +
                std::to_string(arch_max_smem()) + " bytes in all)");
  sh.static_used = off + bytes;
  std::memset(sh.base + off, 0xFF, bytes);  // read before written: NaN
  sh.offsets[key] = off;
  return sh.base + off;
}

void* dynamic_shared() { return t_block->shared->dynamic_base(); }

std::string running_kernel() { return t_block ? where(*t_block) : std::string(); }

// For runtime.cpp's fault handler (async-signal context: no allocation beyond snprintf): a fault in the guard
// page after the worker's shared arena is a shared-memory access past the launch's dynamic shared memory.
bool describe_shared_fault(const void* addr, char* msg, size_t n) {
  const SharedArena& sh = t_shared;
  const char* a = static_cast<const char*>(addr);
  if (!sh.base || a < sh.base + sh.capacity || a >= sh.base + sh.capacity + page() || !t_block) return false;
  const Block& b = *t_block;
  const ThreadState* t = tls_thread;
  std::snprintf(msg, n,
                "kernel %s (launched at %s:%d), block (%u,%u,%u), thread (%u,%u,%u): shared memory access %ld bytes "
                "past the end of the launch's %zu bytes of dynamic shared memory",
                b.kernel, b.file, b.line, b.index.x, b.index.y, b.index.z, t ? t->thread_idx.x : 0u,
                t ? t->thread_idx.y : 0u, t ? t->thread_idx.z : 0u, long(a - (sh.base + sh.capacity)), sh.dynamic);
  return true;
}

cudaError_t launch(const char* kernel, const char* file, int line, const void* func, const char* id, dim3 grid,
                   dim3 block, size_t dynamic_smem, cudaStream_t stream, std::function<void()> body) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  auto bad = [&](cudaError_t e, const std::string& why) {
    std::fprintf(stderr, "%semulated GPU: %s at %s:%d: %s (%s)\n", rank_prefix().c_str(), kernel, file, line,
                 why.c_str(), cudaGetErrorName(e));
    return e;
  };
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
    return bad(cudaErrorInvalidConfiguration, "block " + dim3s(block) + ": " + std::to_string(threads) +
                                                  " threads (at most 1024; x, y ≤ 1024, z ≤ 64)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    return bad(cudaErrorInvalidConfiguration, "grid " + dim3s(grid) + " (x ≤ 2³¹−1, y, z ≤ 65535, none 0)");
  const int allowed = max_dynamic_smem(func);
  if (dynamic_smem > size_t(allowed))
    return bad(cudaErrorInvalidValue,
               std::to_string(dynamic_smem) + " bytes of dynamic shared memory, above the kernel's " +
                   std::to_string(allowed) +
                   (allowed == 48 * 1024 ? " (48 KiB unless cudaFuncSetAttribute(MaxDynamicSharedMemorySize) raises it)"
                                         : " (its cudaFuncSetAttribute(MaxDynamicSharedMemorySize))"));
  // What the real GPU decides from the compiled kernel: its registers × the block's threads against the register
  // file, its __launch_bounds__, its static + dynamic shared memory against the architecture's block limit.
  if (id) register_kernel(func, id);
  bool missing = false;
  const kernels::cuda::KernelRecord* rec = kernel_record(func, id, &missing);
  const kernels::GpuArch& arch = emu_arch();
  if (missing)
    return bad(cudaErrorInvalidDeviceFunction,
               std::string("no ") + arch.name + " code for this kernel in the kernel records (" + (id ? id : "?") +
                   "): cmake/kernel_records.cmake compiles kernels/cuda/*.cu and the emulated GPU's test kernels");
  if (rec) {
    const std::string why = kernels::launch_refusal(rec->res, arch, int(threads), dynamic_smem);
    if (!why.empty()) {
      const bool smem = rec->res.static_smem + dynamic_smem > arch.smem_per_block_optin &&
                        kernels::block_registers(rec->res, arch, int(threads)) <= arch.regs_per_block &&
                        !(rec->res.launch_bounds > 0 && int(threads) > rec->res.launch_bounds);
      return bad(smem ? cudaErrorInvalidValue : cudaErrorLaunchOutOfResources,
                 "grid " + dim3s(grid) + ", block " + dim3s(block) + " on " + arch.name + " (" + arch.example +
                     "): " + why);
    }
  } else if (!kernels::cuda::kernel_records_available()) {
    static bool said = false;
    if (!said) {
      said = true;
      std::fprintf(stderr, "%semulated GPU: registers and __launch_bounds__ of launches are not checked: %s\n",
                   rank_prefix().c_str(), kernels::cuda::kernel_records_missing_reason());
    }
  }
  Work w;
  w.what = std::string(kernel) + " " + dim3s(grid) + "x" + dim3s(block) + " at " + file + ":" + std::to_string(line);
  w.run = [=, body = std::move(body)] {
    Block b;
    b.kernel = kernel;
    b.file = file;
    b.line = line;
    b.grid = grid;
    b.block = block;
    t_shared.ensure();
    t_shared.dynamic = dynamic_smem;
    b.shared = &t_shared;
    std::mt19937_64 rng(order_policy().seed);
    const unsigned long long blocks = 1ull * grid.x * grid.y * grid.z;
    std::vector<unsigned long long> order(blocks);
    std::iota(order.begin(), order.end(), 0ull);
    if (order_policy().order == Order::reverse) std::reverse(order.begin(), order.end());
    else if (order_policy().order == Order::shuffle) std::shuffle(order.begin(), order.end(), rng);
    Block* saved = t_block;
    t_block = &b;
    bool ok = true;
    for (unsigned long long id : order) {
      b.index = uint3{unsigned(id % grid.x), unsigned(id / grid.x % grid.y), unsigned(id / (1ull * grid.x * grid.y))};
      if (!(ok = run_block(b, body, rng))) break;
    }
    if (ok) {  // every fiber is parked after its last thread: let it return
      b.launch_over = true;
      for (Thread& t : b.threads) t.fiber = std::move(t.fiber).resume();
    }
    b.threads.clear();
    t_block = saved;
  };
  return enqueue(stream, std::move(w));
}

}  // namespace dflash::emu
