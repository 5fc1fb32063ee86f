#pragma once
// Kernels planted over a real GPU's per-block limits (limit_kernels.cu), for test_emu_limits.cpp: the emulated GPU
// must refuse them exactly where the architecture would, from their records (what nvcc compiled), not a guess.
#include <cuda_runtime.h>

#include <string>

namespace emu_limits {

// Keeps 96 floats live in registers: nvcc gives it over 100 registers a thread, so a block of 1024 threads needs
// more than the 64 K registers a block has. out[b·threads + t] = Σ_i (i + 1)·r_i after `rounds` mixing rounds of
// r_i ← r_i/2 + r_{i+1}/4 (indices mod 96, in order), r_i = x[(t + i) mod 256] at the start.
// Each launcher returns "" when the launch ran, else the dflash::Error's text.
std::string register_hog(cudaStream_t st, float* out, const float* x, int blocks, int threads, int rounds);
cudaFuncAttributes register_hog_attributes();
// __launch_bounds__(128): out[b·threads + t] = t.
std::string bounded(cudaStream_t st, float* out, int threads);
cudaFuncAttributes bounded_attributes();
// 48 KiB of static shared memory plus `dynamic` bytes of dynamic: out[t] = t + the two regions' sums of t.
std::string static_plus_dynamic(cudaStream_t st, float* out, size_t dynamic);
cudaFuncAttributes static_plus_dynamic_attributes();
// Only dynamic shared memory (`bytes`, raised by cudaFuncSetAttribute first): out[t] = t read back from its last float.
std::string dynamic_only(cudaStream_t st, float* out, size_t bytes);

}  // namespace emu_limits
