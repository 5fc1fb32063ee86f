#pragma once
// DFLASH_HD marks the functions that both the CPU kernels (plain C++) and the CUDA kernels (nvcc, or the emulated
// GPU's host compiler) call: __host__ __device__ under nvcc, nothing elsewhere. Headers under kernels/math/ are
// C++17 (nvcc's dialect here) and include no CUDA header.
#if defined(__CUDACC__)
#define DFLASH_HD __host__ __device__
#else
#define DFLASH_HD
#endif
