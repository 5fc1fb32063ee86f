#pragma once
// Causal grouped-query attention for rows that continue a sequence (incremental decoding): query row i sits at
// position past + i and sees keys 0 .. past + i. Forward only; plain loops over one query row at a time (decoding
// feeds a few rows per call; a prompt from position 0 goes through attention_causal_forward).

namespace dflash::cpu {

// out[n, q_heads, head_dim] (=); q[n, q_heads, head_dim]; k, v [past + n, kv_heads, head_dim]. Q head h reads KV
// head h / (q_heads / kv_heads). Scale 1/sqrt(head_dim), softmax with the row max subtracted, in T.
template <typename T>
void attention_decode_forward(T* out, const T* q, const T* k, const T* v, int n, int past, int q_heads, int kv_heads,
                              int head_dim);

}  // namespace dflash::cpu
