#pragma once
// Partial rotary position embedding (Qwen3.5 / Qwen3.6 full attention, partial_rotary_factor 0.25): only the
// first `rot_dim` of each head's `head_dim` dims rotate, HF rotate_half layout within them (dim i pairs with
// i + rot_dim/2, angle = pos · theta^(−2i/rot_dim)); the remaining dims pass through. rot_dim = head_dim is plain
// RoPE (kernels/cpu/rope.h).

namespace dflash::cpu {

// x[rows, heads, head_dim] (=, in place) at positions pos[rows].
template <typename T>
void rope_partial_forward(T* x, const int* pos, int rows, int heads, int head_dim, int rot_dim, double theta);

}  // namespace dflash::cpu
