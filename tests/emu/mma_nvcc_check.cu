// Compiled by nvcc for sm_90 (ctest emu_mma_nvcc_ptxas, tests/emu/mma.cmake), never run: every wrapper of
// kernels/cuda/mma.cuh is instantiated so that ptxas checks the inline PTX even on a machine without a GPU.
#include "kernels/cuda/mma.cuh"

namespace kc = dflash::kernels::cuda;

__global__ void every_mma_wrapper(const uint4* g, float* out) {
  __shared__ uint4 tile[64];  // 1 KiB: 16-byte rows for ldmatrix and cp.async
  const int lane = threadIdx.x % 32;
  kc::cp_async_ca<4>(reinterpret_cast<char*>(tile) + 4 * lane, reinterpret_cast<const char*>(g) + 4 * lane);
  kc::cp_async_ca<8>(reinterpret_cast<char*>(tile + 8) + 8 * lane, reinterpret_cast<const char*>(g + 8) + 8 * lane);
  kc::cp_async_commit_group();
  kc::cp_async_ca<16>(tile + 32 + lane % 16, g + 32 + lane % 16);
  kc::cp_async_cg(tile + 48 + lane % 16, g + 48 + lane % 16);
  kc::cp_async_commit_group();
  kc::cp_async_wait_group<1>();
  kc::cp_async_wait_group<0>();
  kc::cp_async_wait_all();
  __syncthreads();

  const void* row = tile + lane;
  kc::MmaFragA a;
  kc::MmaFragB b;
  uint32_t one[1];
  kc::ldmatrix_x4(a.reg, row);
  kc::ldmatrix_x2(b.reg, row);
  kc::ldmatrix_x1(one, row);
  kc::MmaFragA at;
  kc::MmaFragB bt;
  uint32_t one_t[1];
  kc::ldmatrix_x4_trans(at.reg, row);
  kc::ldmatrix_x2_trans(bt.reg, row);
  kc::ldmatrix_x1_trans(one_t, row);

  kc::MmaFragC c{{0.f, 1.f, 2.f, 3.f}}, d;
  kc::mma_m16n8k16_bf16(d, a, b, c);
  kc::mma_m16n8k16_bf16(d, at, bt, d);  // accumulate in place
  b.reg[0] ^= one[0] ^ one_t[0];
  b.reg[1] = kc::pack_bf16x2(kc::bf16x2_hi(b.reg[1]), kc::bf16x2_lo(b.reg[1])) ^ kc::pack_bf16x2_rn(0.5f, 2.f);
  kc::mma_m16n8k16_bf16(d, a, b, d);
  const kc::FragCoord p = kc::mma_c_coord(lane, 3);
  out[(blockIdx.x * 16 + p.row) * 8 + p.col] = d.reg[0] + d.reg[1] + d.reg[2] + d.reg[3] +
                                               float(kc::mma_a_coord(lane, 7).row + kc::mma_b_coord(lane, 3).col +
                                                     kc::ldmatrix_coord(lane, 1, true).col);
}
