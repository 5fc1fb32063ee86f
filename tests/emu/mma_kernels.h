#pragma once
// Host launchers of the warp-matrix test kernels (mma_kernels.cu) for tests/emu/test_emu_mma.cpp. Each copies its
// inputs to the device, runs one kernel through DFLASH_LAUNCH, synchronizes and returns what the lanes wrote;
// a CUDA error throws std::runtime_error naming the call.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace emu_mma_test {

// One warp (block) per case: lane l of case k loads a[k][l][0..3], b[k][l][0..1], c[k][l][0..3] as the registers of
// its MmaFragA / MmaFragB / MmaFragC, runs mma_m16n8k16_bf16 and returns d[k][l][0..3].
std::vector<float> mma_registers(int cases, const std::vector<uint32_t>& a /*[cases][32][4]*/,
                                 const std::vector<uint32_t>& b /*[cases][32][2]*/,
                                 const std::vector<float>& c /*[cases][32][4]*/);

// A kernel as the attention kernels will be written: A (16×16 bf16 bits, row-major) and B (b_kn: 16×8 K×N
// row-major, else 8×16 N×K row-major) are copied to shared memory by cp.async, A is loaded by ldmatrix_x4 and B
// by ldmatrix_x2_trans (K×N) or ldmatrix_x2 (N×K); C (16×8 f32 row-major) through mma_c_coord; then
// D = A·B + D `times` times from D = C. Returns D (16×8 row-major, stored through mma_c_coord).
std::vector<float> mma_tile(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, bool b_kn,
                            const std::vector<float>& c, int times);

// A shared tile of 32 rows × 16 b16 elements holding each element's index (row·16 + col); lane l gives the address
// of element offset[l] (16-byte aligned), or for offset[l] < 0 an address that is neither aligned nor mapped (a
// lane whose address the instruction ignores). One ldmatrix of `num` (1, 2, 4) matrices, .trans or not, runs;
// returns out[lane][4]: the registers, 0xdeadbeef past num.
std::vector<uint32_t> ldmatrix(int num, bool trans, const std::vector<int>& offset /*[32]*/);

// cp.async staging, one warp. src[lane][12] floats; each lane owns 12 words of shared memory:
//   words 0–3   cp_async_cg                  commit  (group 1)
//   words 4–7   cp_async_ca<16>              commit  (group 2)
//   words 8–9   cp_async_ca<8>               not committed
//   word  10    cp_async_ca<4>               not committed
//   word  11    never written
// and snapshots the 12 words: before any wait, after wait_group<1>, after wait_group<0>, after wait_all. Then it
// copies src2[lane] by cp_async_ca<4>, commits, commits an empty group, waits wait_group<1> and reads it.
struct CpAsyncObservations {
  std::vector<uint32_t> snapshot;  // [4][32][12] bits of the lane's words
  std::vector<uint32_t> after_empty_group;  // [32] bits of the src2 copy after wait_group<1>
  std::vector<uint32_t> pending;  // [32][5] copies still pending (emulated GPU): after issuing, after each of the
                                  // three waits, after the empty-group phase; ~0u on a GPU
  std::vector<uint32_t> state_freed;  // [32] 1 when the thread's cp.async state was freed at the end
};
CpAsyncObservations cp_async_staging(const std::vector<float>& src /*[32][12]*/,
                                     const std::vector<float>& src2 /*[32]*/);

// Kernels with one planted misuse each: the emulated GPU must stop them with a message.
enum class MmaDefect {
  cp_async_misaligned_source,       // lane 5: cp_async_cg from an address 4 bytes past a 16-byte boundary
  cp_async_misaligned_destination,  // lane 5: cp_async_ca<8> into an address 4 bytes past an 8-byte boundary
  cp_async_source_not_global,       // lane 5: cp_async_ca<16> from a shared-memory address
  cp_async_overlapping_writes,      // lane 5: two cp_async_ca<8> of one group write the same 8 bytes
  ldmatrix_misaligned_row,          // lane 3: an ldmatrix_x4 row address 8 bytes past a 16-byte boundary
  ldmatrix_global_row,              // lane 6: an ldmatrix_x4 row address in cudaMalloc memory
  mma_lane_skips,                   // lane 5 skips the mma the other 31 lanes run, and exits
};
// Runs the kernel; returns cudaDeviceSynchronize's result (when the emulated GPU did not abort the process first).
cudaError_t run_defect(MmaDefect defect);

}  // namespace emu_mma_test
