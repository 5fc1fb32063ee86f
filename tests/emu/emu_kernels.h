#pragma once
// Host launchers of the emulator self-test kernels (emu_kernels.cu): each is a small correct kernel or one with a
// planted defect that the emulated GPU must catch.
#include <cuda_runtime.h>

namespace emu_test {

// y[i] = x[i] + 1 over n elements (grid-stride), on stream st.
void add_one(cudaStream_t st, float* y, const float* x, int n);
// out[b] = Σ x[b·256 .. b·256 + 255] through a shared-memory tree with barriers; missing_sync drops one barrier.
void block_sum(cudaStream_t st, float* out, const float* x, int blocks, bool missing_sync);
// out[b] = Σ of one warp's 32 values by __shfl_xor_sync; wrong_mask: lanes 16..31 return first, while the
// others' full mask still names them.
void warp_sum(cudaStream_t st, float* out, const float* x, int warps, bool wrong_mask);
// Loads 32 values into a shared tile of 32 and writes out[i] = tile[i + offset]: offset 1 reads one past the tile
// for the last lane (dynamic shared memory of exactly 32 floats).
void shared_shift(cudaStream_t st, float* out, const float* x, int offset);
// Writes y[n + 64]: past the end of an n-float allocation.
void past_allocation(cudaStream_t st, float* y, int n);
// A barrier inside `if (threadIdx.x < 16)`: divergence.
void divergent_barrier(cudaStream_t st, float* out);
// The lanes of each warp write lane·k into shared slots and read their neighbour's slot without __syncwarp:
// the result depends on the order the threads run in (a race).
void racy_neighbour(cudaStream_t st, float* out, int n);
// Launch with a configuration the GPU refuses: threads per block, or dynamic shared memory beyond the default.
cudaError_t launch_threads(cudaStream_t st, int threads);
cudaError_t launch_dynamic_smem(cudaStream_t st, size_t bytes, bool raise_limit);

}  // namespace emu_test
