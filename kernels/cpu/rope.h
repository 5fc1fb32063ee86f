#pragma once
// Rotary position embedding, Qwen / HF "rotate_half" layout: dimension i pairs with i + head_dim/2,
// angle = pos · theta^(-2i/head_dim). Each row carries its own position (context rows, block rows).

namespace dflash::cpu {

// y[rows, heads, head_dim] (=) rope(x) at positions pos[rows]. y may alias x.
template <typename T>
void rope_forward(T* y, const T* x, const int* pos, int rows, int heads, int head_dim, double theta);

// dx (+=) Rᵀ dy: the rotation is orthogonal, so backward rotates by −angle.
template <typename T>
void rope_backward(T* dx, const T* dy, const int* pos, int rows, int heads, int head_dim, double theta);

}  // namespace dflash::cpu
