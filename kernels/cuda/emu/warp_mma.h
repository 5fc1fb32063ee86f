#pragma once
// The warp matrix instructions of kernels/cuda/mma.cuh on the emulated GPU (warp_mma.cpp). Kernels call them
// through mma.cuh's wrappers, which pass the call site.
//
// mma and ldmatrix are warp collectives (dflash::emu::warp_collective, mask 0xffffffff as .sync.aligned requires):
// every lane hands in its registers (ldmatrix: its row address), the combine function rebuilds the tiles with
// mma.cuh's layouts (mma_a_coord, ...), computes and hands each lane its registers. A lane that skips the
// instruction, exits or waits elsewhere is reported by warp_collective.
//
// mma's arithmetic: each product a·b of two bf16 is exact in fp32 (8 + 8 significant bits ≤ 24; only an fp32
// overflow or underflow rounds it); D[m][n] = C[m][n] + Σ_k A[m][k]·B[k][n] is summed in fp32 starting from C,
// k ascending from 0 to 15, rounding to nearest even after each addition. Tensor cores add in an unspecified order
// with their own internal precision and rounding, so results can differ in the last bits; tests use values whose
// every partial sum is exact.
//
// cp.async: deferred. A copy is checked when issued (sizes 4/8/16, .cg only 16; both addresses aligned to the size;
// the source inside one cudaMalloc / cudaMallocHost allocation, the destination outside them) and queued in the
// thread's state (tls_thread->slots[0]): its open group until cp.async.commit_group, then a queue of committed
// groups (empty groups count, as in the ISA). It is performed only by the cp.async.wait_group / wait_all that
// covers its group, so a read of the destination before that sees the 0xFF fill of shared memory. wait_group does
// not cover copies not yet committed (wait_all does). Copies retired by one wait have no order among themselves
// (ISA): two that write the same byte are reported. The state is freed when a wait leaves nothing pending; a thread
// that ends with copies pending leaks it unless block.cpp calls cp_async_thread_exit (the copies are dropped, as
// nothing on a GPU makes them visible without that thread's wait).
//
// A misuse prints "emulated GPU: <instruction> at file:line in block (x,y,z) thread (x,y,z) ...: <what is wrong>"
// and aborts the process.
#include <cstddef>
#include <cstdint>

namespace dflash::emu {

struct ThreadState;

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d (4 f32) = A·B + C over the warp; a (4 b32), b (2 b32),
// c (4 f32) are this lane's registers. d may be c.
void mma_m16n8k16_bf16(const char* file, int line, float* d, const uint32_t* a, const uint32_t* b, const float* c);
// ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16 (num 1, 2 or 4): r (num b32) ← the matrices whose rows
// lanes 0 .. 8·num − 1 give the addresses of (`row`: this lane's, ignored for lanes ≥ 8·num).
void ldmatrix_m8n8_b16(const char* file, int line, int num, bool trans, uint32_t* r, const void* row);
// cp.async.{ca|cg}.shared.global [smem_dst], [gmem_src], bytes.
void cp_async(const char* file, int line, bool cg, int bytes, void* smem_dst, const void* gmem_src);
void cp_async_commit_group(const char* file, int line);
void cp_async_wait_group(const char* file, int line, int n);
void cp_async_wait_all(const char* file, int line);
// For block.cpp at the end of a thread: frees its cp.async state; returns the number of copies it dropped.
size_t cp_async_thread_exit(ThreadState& t);
// The copies the calling thread has issued and not yet had performed (for tests).
size_t cp_async_pending();

namespace warp_mma_detail {
// The combine functions of the collectives, exposed for host unit tests (no fibers needed).
struct MmaLane {
  uint32_t a[4];
  uint32_t b[2];
  float c[4];
};
// ins[lane]: const MmaLane*, outs[lane]: float[4].
void mma_combine(const void* const* ins, void* const* outs, unsigned mask, void* ctx);
struct LdmatrixOp {
  const char* what;  // the instruction, for messages
  const char* file;
  int line;
  int num;
  bool trans;
};
// ins[lane]: const void* const* (the lane's row address), outs[lane]: uint32_t[num], ctx: const LdmatrixOp*.
void ldmatrix_combine(const void* const* ins, void* const* outs, unsigned mask, void* ctx);
}  // namespace warp_mma_detail

}  // namespace dflash::emu
