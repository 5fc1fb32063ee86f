#pragma once
// Rotary position embedding, Qwen / HF "rotate_half" layout: dimension i pairs with i + head_dim/2,
// angle = pos · theta^(-2i/head_dim). Each row carries its own position (context rows, block rows). An odd
// head_dim's last dim has no partner and passes through unrotated (forward and backward).

namespace dflash::cpu {

// y[rows, heads, head_dim] (=) rope(x) at positions pos[rows]. y may alias x.
template <typename T>
void rope_forward(T* y, const T* x, const int* pos, int rows, int heads, int head_dim, double theta);

// dx (+=) Rᵀ dy: the rotation is orthogonal, so backward rotates by −angle.
template <typename T>
void rope_backward(T* dx, const T* dy, const int* pos, int rows, int heads, int head_dim, double theta);

// Per-head RMSNorm then RoPE in one pass over memory: y[rows, heads, head_dim] (=) rope(rmsnorm(x)) with
// rstd[rows·heads] (=), bit-identical to rmsnorm_forward over rows·heads rows of head_dim followed by rope_forward
// (the same operations in the same order, the normed value stored in T in between). y may alias x.
template <typename T>
void head_norm_rope_forward(T* y, T* rstd, const T* x, const T* w, const int* pos, int rows, int heads,
                            int head_dim, T eps, double theta);

// Its adjoint: dx (+=), dw[head_dim] (+=, skipped when null), bit-identical to rope_backward of dy into zeros
// followed by rmsnorm_backward (no [rows, heads, head_dim] temporary: dw recomputes the rotated dy per column). An
// odd head_dim's last dim is normed, not rotated, in both directions.
template <typename T>
void head_norm_rope_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, const int* pos,
                             int rows, int heads, int head_dim, double theta);

}  // namespace dflash::cpu
