#pragma once
// The chunk-parallel gated delta rule's shapes and scratch (kernels/cuda/deltanet_chunked.cu), host arithmetic only:
// the CUDA launcher lays its scratch out with delta_rule_chunked_scratch, and the target's memory plan
// (lib/model/target_layers.cpp, through kernels::gated_delta_rule_scratch_bytes in kernels/backend.h) counts the same
// bytes. No CUDA header: lib/ includes it.
#include <cstddef>

namespace dflash::kernels {

constexpr int kDeltaChunk = 64;  // tokens a chunk

// The shapes the chunked tensor-core kernels take: key head dim 64 or 128, value head dim a positive multiple of 64,
// value heads a multiple of key heads.
inline bool delta_rule_chunked_shape(int k_heads, int v_heads, int dk, int dv) {
  return (dk == 64 || dk == 128) && dv > 0 && dv % 64 == 0 && k_heads >= 1 && v_heads >= k_heads &&
         v_heads % k_heads == 0;
}

// Whether a bf16 call of S tokens runs chunked: the shape above and S ≥ 2 (a decode step, S = 1, is one step of the
// per-token recurrence; three launches and a 64-row chunk would be waste).
inline bool delta_rule_chunked_takes(int S, int k_heads, int v_heads, int dk, int dv) {
  return S >= 2 && delta_rule_chunked_shape(k_heads, v_heads, dk, dv);
}

// Byte offsets into the scratch of one chunked call (each 256-aligned), chunks = ⌈S / 64⌉, P = 64 · chunks rows
// (a partial last chunk padded; the kernels write the padding, so every row they read is defined):
struct DeltaChunkedScratch {
  size_t gamma = 0;   // fp32 [v_heads, P]            γ: the decays' cumulative sums inside each chunk
  size_t w = 0;       // bf16 [v_heads, P, dk]         W = T (β e^γ K) of each chunk
  size_t states = 0;  // bf16 [v_heads, chunks, dk, dv] the state at each chunk's start, as the mma operand
  size_t bytes = 0;   // the whole scratch
};
inline DeltaChunkedScratch delta_rule_chunked_scratch(int S, int v_heads, int dk, int dv) {
  const auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t chunks = S > 0 ? (size_t(S) + kDeltaChunk - 1) / kDeltaChunk : 0, rows = chunks * kDeltaChunk;
  const size_t vh = v_heads > 0 ? size_t(v_heads) : 0;
  DeltaChunkedScratch s;
  s.gamma = 0;
  s.w = s.gamma + up(vh * rows * 4);
  s.states = s.w + up(vh * rows * size_t(dk) * 2);
  s.bytes = s.states + up(vh * chunks * size_t(dk) * size_t(dv) * 2);
  return s;
}

}  // namespace dflash::kernels
