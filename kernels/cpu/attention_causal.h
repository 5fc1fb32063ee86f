#pragma once
// Causal grouped-query attention, forward only (the frozen target): out = softmax(q kᵀ / sqrt(head_dim) + causal
// mask) v per head, Q head h reading KV head h / (q_heads / kv_heads). Rows are positions 0..S-1.
// The blocked kernel holds at most one block of query rows × S scores (never a head's full S × S).

namespace dflash::cpu {

// out[S, q_heads, head_dim] (=); q[S, q_heads, head_dim], k and v [S, kv_heads, head_dim] (rows of the
// projections, RoPE already applied). Query blocks of `block` rows; scores and softmax in T.
template <typename T>
void attention_causal_forward(T* out, const T* q, const T* k, const T* v, int S, int q_heads, int kv_heads,
                              int head_dim, int block = 64);

// Plain reference: one query row at a time, straight loops, softmax with the row max subtracted.
template <typename T>
void attention_causal_reference(T* out, const T* q, const T* k, const T* v, int S, int q_heads, int kv_heads,
                                int head_dim);

}  // namespace dflash::cpu
