// Kernels of the warp-matrix tests (mma_kernels.h): the wrappers of kernels/cuda/mma.cuh on hand-computed tiles,
// and kernels with one planted misuse each.
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "tests/emu/mma_kernels.h"

namespace emu_mma_test {

namespace kc = dflash::kernels::cuda;

namespace {

// ---- kernels ----

__global__ void mma_registers_kernel(const uint32_t* a, const uint32_t* b, const float* c, float* d) {
  const size_t k = size_t(blockIdx.x) * 32 + threadIdx.x;  // (case, lane)
  kc::MmaFragA fa;
  kc::MmaFragB fb;
  kc::MmaFragC fc, fd;
  for (int i = 0; i < 4; ++i) fa.reg[i] = a[k * 4 + i];
  for (int i = 0; i < 2; ++i) fb.reg[i] = b[k * 2 + i];
  for (int i = 0; i < 4; ++i) fc.reg[i] = c[k * 4 + i];
  kc::mma_m16n8k16_bf16(fd, fa, fb, fc);
  for (int i = 0; i < 4; ++i) d[k * 4 + i] = fd.reg[i];
}

__global__ void mma_tile_kernel(const uint4* a, const uint4* b, bool b_kn, const float* c, float* d, int times) {
  DFLASH_SHARED(uint4, a_s, [32]);  // A 16×16 bf16: row m is a_s[2m], a_s[2m + 1]
  DFLASH_SHARED(uint4, b_s, [16]);  // B K×N: row k is b_s[k]; N×K: row n is b_s[2n], b_s[2n + 1]
  const int lane = threadIdx.x;
  kc::cp_async_cg(&a_s[lane], &a[lane]);
  if (lane < 16) kc::cp_async_ca<16>(&b_s[lane], &b[lane]);
  kc::cp_async_commit_group();
  kc::cp_async_wait_group<0>();
  __syncwarp();  // the other lanes' copies

  kc::MmaFragA fa;
  kc::MmaFragB fb;
  kc::MmaFragC fd;
  // matrices (rows 0–7 | 8–15) × (k 0–7 | 8–15): lane l gives row l % 16 of the k half l / 16 → a0a1 a2a3 a4a5 a6a7
  kc::ldmatrix_x4(fa.reg, reinterpret_cast<const char*>(a_s) + (lane % 16) * 32 + (lane / 16) * 16);
  if (b_kn)  // rows k 0–7 and 8–15 of K×N; .trans hands each lane its two consecutive k of column n
    kc::ldmatrix_x2_trans(fb.reg, &b_s[lane % 16]);
  else  // rows n 0–7 of N×K, k 0–7 then 8–15: each row already runs along k
    kc::ldmatrix_x2(fb.reg, reinterpret_cast<const char*>(b_s) + (lane % 8) * 32 + (lane / 8 % 2) * 16);
  for (int i = 0; i < 4; ++i) {
    const kc::FragCoord p = kc::mma_c_coord(lane, i);
    fd.reg[i] = c[p.row * 8 + p.col];
  }
  for (int t = 0; t < times; ++t) kc::mma_m16n8k16_bf16(fd, fa, fb, fd);
  for (int i = 0; i < 4; ++i) {
    const kc::FragCoord p = kc::mma_c_coord(lane, i);
    d[p.row * 8 + p.col] = fd.reg[i];
  }
}

__global__ void ldmatrix_kernel(int num, bool trans, const int* offset, uint32_t* out) {
  DFLASH_SHARED(uint4, tile, [64]);  // 32 rows × 16 b16
  const int lane = threadIdx.x;
  uint16_t* e = reinterpret_cast<uint16_t*>(tile);
  for (int i = lane; i < 32 * 16; i += 32) e[i] = uint16_t(i);
  __syncwarp();
  // 8: aligned to 8 bytes only and unmapped, so using it would be reported or fault
  const void* row = offset[lane] < 0 ? reinterpret_cast<const void*>(uintptr_t(8)) : e + offset[lane];
  uint32_t r[4] = {0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu};
  uint32_t r1[1], r2[2], r4[4];
  if (num == 1) {
    trans ? kc::ldmatrix_x1_trans(r1, row) : kc::ldmatrix_x1(r1, row);
    r[0] = r1[0];
  } else if (num == 2) {
    trans ? kc::ldmatrix_x2_trans(r2, row) : kc::ldmatrix_x2(r2, row);
    for (int i = 0; i < 2; ++i) r[i] = r2[i];
  } else {
    trans ? kc::ldmatrix_x4_trans(r4, row) : kc::ldmatrix_x4(r4, row);
    for (int i = 0; i < 4; ++i) r[i] = r4[i];
  }
  for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

__device__ uint32_t pending_copies() {
#if defined(DFLASH_CUDA_EMULATED)
  return uint32_t(dflash::emu::cp_async_pending());
#else
  return ~0u;
#endif
}

__global__ void cp_async_staging_kernel(const float* src, const float* src2, uint32_t* snapshot,
                                        uint32_t* after_empty_group, uint32_t* pending, uint32_t* state_freed) {
  DFLASH_SHARED(uint4, words, [32 * 3]);  // 12 words per lane
  DFLASH_SHARED(float, words2, [32]);
  const int lane = threadIdx.x;
  float* w = reinterpret_cast<float*>(words) + lane * 12;
  const float* s = src + lane * 12;
  auto snap = [&](int k) {
    for (int j = 0; j < 12; ++j) std::memcpy(&snapshot[(k * 32 + lane) * 12 + j], &w[j], 4);
  };
  kc::cp_async_cg(w, s);
  kc::cp_async_commit_group();
  kc::cp_async_ca<16>(w + 4, s + 4);
  kc::cp_async_commit_group();
  kc::cp_async_ca<8>(w + 8, s + 8);
  kc::cp_async_ca<4>(w + 10, s + 10);
  pending[lane * 5 + 0] = pending_copies();
  snap(0);  // a race on a GPU; the 0xFF fill here
  kc::cp_async_wait_group<1>();
  pending[lane * 5 + 1] = pending_copies();
  snap(1);
  kc::cp_async_wait_group<0>();
  pending[lane * 5 + 2] = pending_copies();
  snap(2);
  kc::cp_async_wait_all();
  pending[lane * 5 + 3] = pending_copies();
  snap(3);

  kc::cp_async_ca<4>(&words2[lane], &src2[lane]);
  kc::cp_async_commit_group();
  kc::cp_async_commit_group();  // an empty group, the newest: wait_group<1> must complete the one before it
  kc::cp_async_wait_group<1>();
  std::memcpy(&after_empty_group[lane], &words2[lane], 4);
  pending[lane * 5 + 4] = pending_copies();
#if defined(DFLASH_CUDA_EMULATED)
  state_freed[lane] = dflash::emu::tls_thread->slots[0] == nullptr ? 1u : 0u;
#else
  state_freed[lane] = 1u;
#endif
}

__global__ void defect_kernel(int defect, const uint4* g) {
  DFLASH_SHARED(uint4, tile, [64]);
  const int lane = threadIdx.x;
  char* t = reinterpret_cast<char*>(tile);
  const char* src = reinterpret_cast<const char*>(g);
  for (int i = lane; i < 64 * 16; i += 32) t[i] = char(i);
  __syncwarp();
  switch (MmaDefect(defect)) {
    case MmaDefect::cp_async_misaligned_source:
      kc::cp_async_cg(t + lane * 16, src + lane * 16 + (lane == 5 ? 4 : 0));
      kc::cp_async_wait_all();
      break;
    case MmaDefect::cp_async_misaligned_destination:
      kc::cp_async_ca<8>(t + lane * 16 + (lane == 5 ? 4 : 0), src + lane * 16);
      kc::cp_async_wait_all();
      break;
    case MmaDefect::cp_async_source_not_global:
      kc::cp_async_ca<16>(t + lane * 16, lane == 5 ? t + 512 : src + lane * 16);
      kc::cp_async_wait_all();
      break;
    case MmaDefect::cp_async_overlapping_writes:
      kc::cp_async_ca<8>(t + lane * 16, src + lane * 16);
      kc::cp_async_ca<8>(t + lane * 16 + (lane == 5 ? 0 : 8), src + lane * 16 + 8);
      kc::cp_async_commit_group();
      kc::cp_async_wait_group<0>();
      break;
    case MmaDefect::ldmatrix_misaligned_row:
    case MmaDefect::ldmatrix_global_row: {
      const char* row = t + lane * 16;
      if (MmaDefect(defect) == MmaDefect::ldmatrix_misaligned_row && lane == 3) row += 8;
      if (MmaDefect(defect) == MmaDefect::ldmatrix_global_row && lane == 6) row = src;
      kc::MmaFragA a;
      kc::ldmatrix_x4(a.reg, row);
      break;
    }
    case MmaDefect::mma_lane_skips: {
      kc::MmaFragA a{{0, 0, 0, 0}};
      kc::MmaFragB b{{0, 0}};
      kc::MmaFragC c{{0, 0, 0, 0}}, d;
      if (lane != 5) kc::mma_m16n8k16_bf16(d, a, b, c);
      break;
    }
  }
}

// ---- host side ----

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}
template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  check(cudaMalloc(&d, h.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  return d;
}
template <typename T>
T* device_buffer(size_t n) {
  T* d = nullptr;
  check(cudaMalloc(&d, n * sizeof(T)), "cudaMalloc");
  return d;
}
template <typename T>
std::vector<T> to_host(T* d, size_t n) {
  std::vector<T> h(n);
  check(cudaDeviceSynchronize(), "the kernel");
  check(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  check(cudaFree(d), "cudaFree");
  return h;
}

}  // namespace

std::vector<float> mma_registers(int cases, const std::vector<uint32_t>& a, const std::vector<uint32_t>& b,
                                 const std::vector<float>& c) {
  if (a.size() != size_t(cases) * 32 * 4 || b.size() != size_t(cases) * 32 * 2 || c.size() != size_t(cases) * 32 * 4)
    throw std::invalid_argument("mma_registers: a, b, c must hold [cases][32][4], [cases][32][2], [cases][32][4]");
  uint32_t* da = to_device(a);
  uint32_t* db = to_device(b);
  float* dc = to_device(c);
  float* dd = device_buffer<float>(c.size());
  DFLASH_LAUNCH(cases, 32, 0, nullptr, mma_registers_kernel)(da, db, dc, dd);
  auto d = to_host(dd, c.size());
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dc)}) check(cudaFree(p), "cudaFree");
  return d;
}

std::vector<float> mma_tile(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, bool b_kn,
                            const std::vector<float>& c, int times) {
  if (a.size() != 256 || b.size() != 128 || c.size() != 128)
    throw std::invalid_argument("mma_tile: A is 16×16, B 16×8 (or 8×16), C 16×8");
  uint16_t* da = to_device(a);
  uint16_t* db = to_device(b);
  float* dc = to_device(c);
  float* dd = device_buffer<float>(128);
  DFLASH_LAUNCH(1, 32, 0, nullptr, mma_tile_kernel)(reinterpret_cast<const uint4*>(da),
                                                    reinterpret_cast<const uint4*>(db), b_kn, dc, dd, times);
  auto d = to_host(dd, 128);
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dc)}) check(cudaFree(p), "cudaFree");
  return d;
}

std::vector<uint32_t> ldmatrix(int num, bool trans, const std::vector<int>& offset) {
  if (offset.size() != 32) throw std::invalid_argument("ldmatrix: one offset per lane");
  int* doff = to_device(offset);
  uint32_t* dout = device_buffer<uint32_t>(32 * 4);
  DFLASH_LAUNCH(1, 32, 0, nullptr, ldmatrix_kernel)(num, trans, doff, dout);
  auto out = to_host(dout, 32 * 4);
  check(cudaFree(doff), "cudaFree");
  return out;
}

CpAsyncObservations cp_async_staging(const std::vector<float>& src, const std::vector<float>& src2) {
  if (src.size() != 32 * 12 || src2.size() != 32) throw std::invalid_argument("cp_async_staging: src [32][12], src2 [32]");
  float* ds = to_device(src);
  float* ds2 = to_device(src2);
  uint32_t* snapshot = device_buffer<uint32_t>(4 * 32 * 12);
  uint32_t* after = device_buffer<uint32_t>(32);
  uint32_t* pending = device_buffer<uint32_t>(32 * 5);
  uint32_t* freed = device_buffer<uint32_t>(32);
  DFLASH_LAUNCH(1, 32, 0, nullptr, cp_async_staging_kernel)(ds, ds2, snapshot, after, pending, freed);
  CpAsyncObservations o;
  o.snapshot = to_host(snapshot, 4 * 32 * 12);
  o.after_empty_group = to_host(after, 32);
  o.pending = to_host(pending, 32 * 5);
  o.state_freed = to_host(freed, 32);
  check(cudaFree(ds), "cudaFree");
  check(cudaFree(ds2), "cudaFree");
  return o;
}

cudaError_t run_defect(MmaDefect defect) {
  uint4* g = device_buffer<uint4>(64);
  check(cudaMemset(g, 0, 64 * sizeof(uint4)), "cudaMemset");
  DFLASH_LAUNCH(1, 32, 0, nullptr, defect_kernel)(int(defect), g);
  const cudaError_t rc = cudaDeviceSynchronize();
  cudaFree(g);
  return rc;
}

}  // namespace emu_mma_test
