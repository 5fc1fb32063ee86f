#pragma once
// Tree attention for speculative verification (docs/eval.md, "Tree verification"): n query rows are the nodes of a
// tree of candidate tokens hanging after `past` cached positions; node i sees every cached key and the keys of its
// own ancestors in the tree (itself included), nothing of its siblings or cousins. Forward only.
//
// parents[n]: parents[0] = −1 (the root), 0 ≤ parents[i] < i otherwise (a parent comes before its children).
// Keys are visited in index order (cache, then ancestor nodes by index), so on a chain (parents[i] = i − 1) every
// row is computed exactly as attention_decode_forward computes it: bit for bit.

namespace dflash::cpu {

// out[n, q_heads, head_dim] (=); q[n, q_heads, head_dim]; k, v [past + n, kv_heads, head_dim] (row past + i =
// node i). Q head h reads KV head h / (q_heads / kv_heads). Scale 1/sqrt(head_dim), softmax with the row max
// subtracted, in T.
template <typename T>
void attention_tree_forward(T* out, const T* q, const T* k, const T* v, const int* parents, int n, int past,
                            int q_heads, int kv_heads, int head_dim);

// Plain reference: builds the dense [n, past + n] visibility mask from the ancestor relation (ancestor(j, i): walk
// i's parents) and runs masked softmax attention over every key, one row at a time. For tests.
template <typename T>
void attention_tree_reference(T* out, const T* q, const T* k, const T* v, const int* parents, int n, int past,
                              int q_heads, int kv_heads, int head_dim);

}  // namespace dflash::cpu
