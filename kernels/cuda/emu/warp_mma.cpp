// mma.sync, ldmatrix and cp.async on the emulated GPU (the semantics and their limits: warp_mma.h).
#include "kernels/cuda/emu/warp_mma.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "kernels/cuda/emu/device.h"
#include "kernels/cuda/emu/runtime.h"
#include "kernels/cuda/mma.cuh"

namespace dflash::emu {

namespace {

namespace kc = ::dflash::kernels::cuda;

// One pointer per instruction: warp_collective matches lanes by the identity of `what`.
constexpr const char* kMmaWhat = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";
constexpr const char* kLdmatrixWhat[2][3] = {
    {"ldmatrix.sync.aligned.m8n8.x1.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
     "ldmatrix.sync.aligned.m8n8.x4.shared.b16"},
    {"ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
     "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"}};

std::string idx3(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}
std::string address(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

// "block (x,y,z) thread (x,y,z) (warp w, lane l)" of the running thread, or of lane `lane` of its warp.
std::string thread_name(int lane = -1) {
  const ThreadState* t = tls_thread;
  if (!t) return "host code (outside a kernel)";
  uint3 tid = t->thread_idx;
  int l = t->lane;
  if (lane >= 0 && lane != t->lane) {
    const unsigned linear = unsigned(t->warp * kWarpSize + lane), dx = t->block_dim.x, dy = t->block_dim.y;
    tid = uint3{linear % dx, linear / dx % dy, linear / (dx * dy)};
    l = lane;
  }
  return "block " + idx3(t->block_idx) + " thread " + idx3(tid) + " (warp " + std::to_string(t->warp) + ", lane " +
         std::to_string(l) + ")";
}

[[noreturn]] void misuse(const char* what, const char* file, int line, const std::string& who,
                         const std::string& msg) {
  std::fprintf(stderr, "%semulated GPU: %s at %s:%d in %s (%s): %s\n", rank_prefix().c_str(), what, file, line,
               who.c_str(), running_kernel().c_str(), msg.c_str());
  std::fflush(stderr);
  std::abort();
}

float bf16_bits_to_float(uint32_t bits16) {
  const uint32_t bits = bits16 << 16;  // bf16 is the upper half of an fp32
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
float reg_half(uint32_t reg, int half) { return bf16_bits_to_float(half ? reg >> 16 : reg & 0xffffu); }

// ---- cp.async ----

// DFLASH_EMU_CP_ASYNC: when a copy lands in shared memory. A GPU may land it any time between the issue and the
// wait that covers it; `wait` (the default) lands it at the wait, the latest (a read of the stage before its
// wait sees the old data), `issue` at the issue, the earliest (a stage refilled before every warp has finished
// reading it is overwritten under the readers).
bool cp_async_lands_at_issue() {
  static const bool at_issue = [] {
    const char* m = std::getenv("DFLASH_EMU_CP_ASYNC");
    if (!m || !*m || std::strcmp(m, "wait") == 0) return false;
    if (std::strcmp(m, "issue") == 0) return true;
    std::fprintf(stderr, "emulated GPU: DFLASH_EMU_CP_ASYNC=%s is not 'wait' or 'issue'\n", m);
    std::abort();
  }();
  return at_issue;
}

struct Copy {
  void* dst;
  const void* src;
  int bytes;
  const char* what;
  const char* file;
  int line;
};
struct CpAsyncState {
  std::vector<Copy> open;                   // issued since the last commit_group: in no group yet
  std::deque<std::vector<Copy>> committed;  // oldest first; empty groups included
};

ThreadState& running_thread(const char* what, const char* file, int line) {
  if (!tls_thread) misuse(what, file, line, thread_name(), "called outside a kernel");
  return *tls_thread;
}
CpAsyncState* state_of(ThreadState& t) { return static_cast<CpAsyncState*>(t.slots[0]); }

// Performs copies that no wait orders among themselves (PTX ISA, cp.async: no ordering between cp.async operations
// not synchronized by a wait): two that write the same byte are a race, reported.
void perform(std::vector<Copy>& batch) {
  std::sort(batch.begin(), batch.end(),
            [](const Copy& x, const Copy& y) { return static_cast<char*>(x.dst) < static_cast<char*>(y.dst); });
  for (size_t i = 1; i < batch.size(); ++i) {
    const Copy &x = batch[i - 1], &y = batch[i];
    if (static_cast<char*>(x.dst) + x.bytes > static_cast<char*>(y.dst))
      misuse(y.what, y.file, y.line, thread_name(),
             "its " + std::to_string(y.bytes) + "-byte destination " + address(y.dst) + " overlaps the " +
                 std::to_string(x.bytes) + "-byte destination " + address(x.dst) + " of the " + x.what + " at " +
                 x.file + ":" + std::to_string(x.line) +
                 ", and no cp.async.wait_group / wait_all orders the two (undefined result on a GPU)");
  }
  for (const Copy& c : batch) std::memcpy(c.dst, c.src, size_t(c.bytes));
}

// Retires the oldest committed groups until at most `keep` are pending; frees the state once nothing is pending.
void retire(ThreadState& t, size_t keep) {
  CpAsyncState* s = state_of(t);
  if (!s) return;
  std::vector<Copy> batch;
  while (s->committed.size() > keep) {
    batch.insert(batch.end(), s->committed.front().begin(), s->committed.front().end());
    s->committed.pop_front();
  }
  perform(batch);
  // an empty group at the front is complete: dropping it changes no later wait
  while (!s->committed.empty() && s->committed.front().empty()) s->committed.pop_front();
  if (s->open.empty() && s->committed.empty()) {
    delete s;
    t.slots[0] = nullptr;
  }
}

}  // namespace

// ---- the combine functions ----

namespace warp_mma_detail {

void mma_combine(const void* const* ins, void* const* outs, unsigned mask, void*) {
  const float nan = bf16_bits_to_float(0xffffu);
  float a[16][16], b[16][8], c[16][8];  // A (m, k), B (k, n), C (m, n)
  for (int lane = 0; lane < kWarpSize; ++lane) {
    const auto* in = static_cast<const MmaLane*>(ins[lane]);  // null only outside the mask (not for mma.sync)
    for (int i = 0; i < 8; ++i) {
      const kc::FragCoord p = kc::mma_a_coord(lane, i);
      a[p.row][p.col] = in ? reg_half(in->a[i / 2], i % 2) : nan;
    }
    for (int i = 0; i < 4; ++i) {
      const kc::FragCoord p = kc::mma_b_coord(lane, i);
      b[p.row][p.col] = in ? reg_half(in->b[i / 2], i % 2) : nan;
      const kc::FragCoord q = kc::mma_c_coord(lane, i);
      c[q.row][q.col] = in ? in->c[i] : nan;
    }
  }
  float d[16][8];
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float acc = c[m][n];
      for (int k = 0; k < 16; ++k) acc += a[m][k] * b[k][n];  // the product is exact in fp32: one rounding per step
      d[m][n] = acc;
    }
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if (!(mask >> lane & 1u)) continue;
    float* out = static_cast<float*>(outs[lane]);
    for (int i = 0; i < 4; ++i) {
      const kc::FragCoord q = kc::mma_c_coord(lane, i);
      out[i] = d[q.row][q.col];
    }
  }
}

void ldmatrix_combine(const void* const* ins, void* const* outs, unsigned mask, void* ctx) {
  const LdmatrixOp& op = *static_cast<const LdmatrixOp*>(ctx);
  uint16_t rows[4][8][8];  // (matrix, row, col) as read from shared memory
  for (int m = 0; m < op.num; ++m)
    for (int i = 0; i < 8; ++i) {
      const int lane = 8 * m + i;  // PTX ISA, ldmatrix: threads 8m .. 8m + 7 give the rows of matrix m
      const std::string which = "the address of row " + std::to_string(i) + " of matrix " + std::to_string(m);
      if (!ins[lane]) misuse(op.what, op.file, op.line, thread_name(lane), which + " comes from a lane outside the warp's mask");
      const void* p = *static_cast<const void* const*>(ins[lane]);
      if (!p) misuse(op.what, op.file, op.line, thread_name(lane), which + " is null");
      if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        misuse(op.what, op.file, op.line, thread_name(lane),
               which + ", " + address(p) + ", is not 16-byte aligned (each row is 16 naturally aligned bytes)");
      if (find_allocation(p, 16))
        misuse(op.what, op.file, op.line, thread_name(lane),
               which + ", " + address(p) +
                   ", lies in a cudaMalloc / cudaMallocHost allocation: ldmatrix reads shared memory");
      std::memcpy(rows[m][i], p, sizeof rows[m][i]);
    }
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if (!(mask >> lane & 1u)) continue;
    uint32_t* out = static_cast<uint32_t*>(outs[lane]);
    for (int m = 0; m < op.num; ++m) {
      const kc::FragCoord lo = kc::ldmatrix_coord(lane, 0, op.trans), hi = kc::ldmatrix_coord(lane, 1, op.trans);
      out[m] = uint32_t(rows[m][lo.row][lo.col]) | uint32_t(rows[m][hi.row][hi.col]) << 16;
    }
  }
}

}  // namespace warp_mma_detail

// ---- the instructions ----

void mma_m16n8k16_bf16(const char* file, int line, float* d, const uint32_t* a, const uint32_t* b, const float* c) {
  warp_mma_detail::MmaLane in;
  std::memcpy(in.a, a, sizeof in.a);
  std::memcpy(in.b, b, sizeof in.b);
  std::memcpy(in.c, c, sizeof in.c);
  float out[4];
  warp_collective(0xffffffffu, kMmaWhat, file, line, &in, out, warp_mma_detail::mma_combine, nullptr);
  std::memcpy(d, out, sizeof out);
}

void ldmatrix_m8n8_b16(const char* file, int line, int num, bool trans, uint32_t* r, const void* row) {
  const int which = num == 1 ? 0 : num == 2 ? 1 : num == 4 ? 2 : -1;
  if (which < 0)
    misuse("ldmatrix.sync.aligned.m8n8", file, line, thread_name(), ".num is x" + std::to_string(num) +
                                                                        " (x1, x2 or x4)");
  warp_mma_detail::LdmatrixOp op{kLdmatrixWhat[trans ? 1 : 0][which], file, line, num, trans};
  const void* in = row;
  uint32_t out[4];
  warp_collective(0xffffffffu, op.what, file, line, &in, out, warp_mma_detail::ldmatrix_combine, &op);
  std::memcpy(r, out, sizeof(uint32_t) * size_t(num));
}

void cp_async(const char* file, int line, bool cg, int bytes, void* smem_dst, const void* gmem_src) {
  const char* what = cg ? "cp.async.cg.shared.global" : "cp.async.ca.shared.global";
  ThreadState& t = running_thread(what, file, line);
  const std::string size = std::to_string(bytes);
  if (cg ? bytes != 16 : (bytes != 4 && bytes != 8 && bytes != 16))
    misuse(what, file, line, thread_name(),
           "cp-size " + size + (cg ? " (.cg copies 16 bytes only)" : " (4, 8 or 16 bytes)"));
  if (reinterpret_cast<uintptr_t>(gmem_src) % unsigned(bytes) != 0)
    misuse(what, file, line, thread_name(),
           "the source address " + address(gmem_src) + " is not " + size + "-byte aligned (cp-size " + size + ")");
  if (reinterpret_cast<uintptr_t>(smem_dst) % unsigned(bytes) != 0)
    misuse(what, file, line, thread_name(),
           "the destination address " + address(smem_dst) + " is not " + size + "-byte aligned (cp-size " + size +
               ")");
  if (!find_allocation(gmem_src, size_t(bytes)))
    misuse(what, file, line, thread_name(),
           "the source " + address(gmem_src) + " (+" + size +
               " bytes) does not lie inside one cudaMalloc / cudaMallocHost allocation (cp.async reads global memory)");
  if (find_allocation(smem_dst, 1))
    misuse(what, file, line, thread_name(),
           "the destination " + address(smem_dst) +
               " lies in a cudaMalloc / cudaMallocHost allocation: cp.async writes shared memory");
  if (cp_async_lands_at_issue()) {  // the earliest a GPU may land it: a stage refilled too soon shows
    std::memcpy(smem_dst, gmem_src, size_t(bytes));
    return;
  }
  CpAsyncState* s = state_of(t);
  if (!s) {
    s = new CpAsyncState;
    t.slots[0] = s;
  }
  s->open.push_back(Copy{smem_dst, gmem_src, bytes, what, file, line});
}

void cp_async_commit_group(const char* file, int line) {
  ThreadState& t = running_thread("cp.async.commit_group", file, line);
  CpAsyncState* s = state_of(t);
  if (!s) return;  // nothing pending: a new empty group is complete and precedes every later one
  s->committed.push_back(std::move(s->open));
  s->open.clear();
}

void cp_async_wait_group(const char* file, int line, int n) {
  ThreadState& t = running_thread("cp.async.wait_group", file, line);
  if (n < 0) misuse("cp.async.wait_group", file, line, thread_name(), "N = " + std::to_string(n) + " < 0");
  retire(t, size_t(n));
}

void cp_async_wait_all(const char* file, int line) {
  ThreadState& t = running_thread("cp.async.wait_all", file, line);
  cp_async_commit_group(file, line);  // PTX ISA: wait_all is commit_group; wait_group 0
  retire(t, 0);
}

size_t cp_async_thread_exit(ThreadState& t) {
  CpAsyncState* s = state_of(t);
  if (!s) return 0;
  size_t dropped = s->open.size();
  for (const auto& g : s->committed) dropped += g.size();
  delete s;
  t.slots[0] = nullptr;
  return dropped;
}

size_t cp_async_pending() {
  if (!tls_thread) return 0;
  const CpAsyncState* s = state_of(*tls_thread);
  if (!s) return 0;
  size_t n = s->open.size();
  for (const auto& g : s->committed) n += g.size();
  return n;
}

}  // namespace dflash::emu
