#pragma once
// Element-wise pieces of a decoder layer: SwiGLU, residual add, embedding gather, the sigmoid output gate, and the
// row argmax of greedy decoding.

#include <cstddef>
#include <cstdint>

namespace dflash::cpu {

// h[n] (=) silu(gate[n]) · up[n]
template <typename T>
void swiglu_forward(T* h, const T* gate, const T* up, std::size_t n);

// dgate (+=) dh · up · silu'(gate); dup (+=) dh · silu(gate)
template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, std::size_t n);

// out[n] (=) a[n] + b[n]; out may alias a or b. Backward is the identity on both inputs.
template <typename T>
void residual_forward(T* out, const T* a, const T* b, std::size_t n);

// y[n] (+=) x[n]: how residual (and other identity) gradients are accumulated.
template <typename T>
void accumulate(T* y, const T* x, std::size_t n);

// out[rows, dim] (=) table[ids[r], :]; ids must be in [0, vocab): the caller validates them (kernels never throw).
// The tables this gathers from (the target's embedding) are frozen: no backward.
template <typename T>
void embedding_forward(T* out, const T* table, const int32_t* ids, int rows, int dim, int vocab);

// x[n] (=) x[n] · sigmoid(gate[n]): the output gate of Qwen3.5's gated attention.
template <typename T>
void sigmoid_gate(T* x, const T* gate, std::size_t n);

// index[r] (=) the first column of the largest non-NaN value of row r of x[rows, cols] (−1 when there is none),
// value[r] (=) that value (−inf when none).
template <typename T>
void argmax_rows(int32_t* index, T* value, const T* x, int rows, int cols);

}  // namespace dflash::cpu
