#include "lib/model/drafter.h"

#include <algorithm>

#include "lib/core/error.h"

namespace dflash::model {

DFlashAttentionShape drafter_attention_shape(const DrafterConfig& c, int layer, int seq_len, int n_blocks) {
  DFlashAttentionShape s;
  s.n_blocks = n_blocks;
  s.block = c.block_size;
  s.ctx_len = seq_len;
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.window = c.window.empty() ? 0 : c.window[layer];
  return s;
}

namespace {

// The arrays of one forward + backward, in allocation order. drafter_arena_bytes adds up the same list, so the
// arena's capacity is exactly the peak (a unit test checks arena.peak() against it).
struct DrafterSizes {
  size_t S, NB, H, Q, KV, I, NH, KVH, elem, acc;
  DrafterSizes(const DrafterConfig& c, int seq_len, int n_anchors, size_t elem_bytes, size_t acc_bytes)
      : S(size_t(seq_len)), NB(size_t(n_anchors) * c.block_size), H(size_t(c.hidden)),
        Q(size_t(c.heads) * c.head_dim), KV(size_t(c.kv_heads) * c.head_dim), I(size_t(c.intermediate)),
        NH(size_t(c.heads)), KVH(size_t(c.kv_heads)), elem(elem_bytes), acc(acc_bytes) {}
  static size_t f(size_t bytes) { return Arena::footprint(bytes); }
  size_t e(size_t n) const { return f(n * elem); }
  size_t a(size_t n) const { return f(n * acc); }
  size_t ints(size_t n) const { return f(n * sizeof(int32_t)); }

  size_t forward_fixed(size_t N) const {
    return ints(N) + ints(S) + ints(NB) + ints(NB) + e(S * H) + a(S) + e(S * H) + e(NB * H) + e(NB * H);
  }
  size_t forward_layer() const {
    return a(NB) + e(NB * H) + e(NB * Q) + a(NB * NH) + e(NB * Q) + e(NB * KV) + a(NB * KVH) + e(NB * KV) +
           e(NB * KV) + e(S * KV) + a(S * KVH) + e(S * KV) + e(S * KV) + e(NB * Q) + a(NB * NH) + e(NB * H) +
           a(NB) + e(NB * H) + 3 * e(NB * I) + e(NB * H);
  }
  size_t forward_final() const { return a(NB) + e(NB * H); }
  // backward: d_x, d_mid, d_ctx persist across layers; then the larger of one layer's scratch and d_fc_out.
  size_t backward_fixed() const { return 2 * e(NB * H) + e(S * H); }
  // d_h, d_gate, d_up; d_xn2; d_attn; d_q, d_kb, d_vb, d_kc, d_vc; d_qraw, d_kbraw, d_kcraw; d_xn
  size_t backward_layer() const {
    return 3 * e(NB * I) + e(NB * H) + e(NB * Q) + e(NB * Q) + 2 * e(NB * KV) + 2 * e(S * KV) + e(NB * Q) +
           e(NB * KV) + e(S * KV) + e(NB * H);
  }
};

}  // namespace

size_t drafter_arena_bytes(const DrafterConfig& c, int seq_len, int n_anchors, size_t elem_bytes, size_t acc_bytes) {
  const DrafterSizes z(c, seq_len, n_anchors, elem_bytes, acc_bytes);
  const size_t fwd = z.forward_fixed(size_t(n_anchors)) + size_t(c.layers) * z.forward_layer() + z.forward_final();
  return fwd + z.backward_fixed() + std::max(z.backward_layer(), z.e(z.S * z.H));
}

template <typename T>
void DrafterActivations<T>::reserve(MemoryKind kind, const DrafterConfig& cfg, int max_seq_len, int n_anchors) {
  const size_t need = drafter_arena_bytes(cfg, max_seq_len, n_anchors, sizeof(T), sizeof(A));
  if (arena.capacity() < need || arena.kind() != kind) arena = Arena(kind, need, "drafter activations");
}

template <typename T>
void drafter_forward(const DrafterConfig& c, const DrafterWeights<T>& w, const DrafterInputs<T>& in,
                     DrafterActivations<T>& a, const DrafterRuntime<T>& rt) {
  using A = kernels::acc_t<T>;
  kernels::Backend<T>& be = rt.backend;
  ExecContext& ec = rt.exec;
  const int S = in.seq_len, N = in.n_anchors, B = c.block_size, H = c.hidden, D = c.head_dim;
  const int NB = N * B, NH = c.heads, KVH = c.kv_heads, I = c.intermediate;
  const double eps = c.rms_eps;
  DFLASH_CHECK(S > 0 && N > 0, "drafter forward: needs a sequence (S = {}) and anchors (N = {})", S, N);

  // host bookkeeping, validated here: kernels never check their input
  a.seq_len = S;
  a.n_blocks = N;
  a.anchors.assign(in.anchors, in.anchors + N);
  std::vector<int32_t> blk_pos(NB), ctx_pos(S);
  a.blk_tokens.resize(NB);
  for (int i = 0; i < S; ++i) ctx_pos[i] = i;
  for (int b = 0; b < N; ++b) {
    DFLASH_CHECK(in.anchors[b] >= 0 && in.anchors[b] < S, "drafter forward: anchor {} = {} is outside [0, {})", b,
                 in.anchors[b], S);
    for (int j = 0; j < B; ++j) {
      blk_pos[b * B + j] = in.anchors[b] + j;
      a.blk_tokens[b * B + j] = j == 0 ? in.tokens[in.anchors[b]] : c.mask_token_id;
    }
  }
  for (int r = 0; r < NB; ++r)
    DFLASH_CHECK(a.blk_tokens[r] >= 0 && a.blk_tokens[r] < c.vocab,
                 "embedding: token id {} at row {} is outside the vocabulary [0, {})", a.blk_tokens[r], r, c.vocab);

  // every array of this forward and its backward lives in the arena
  a.reserve(be.memory(), c, S, N);  // a no-op when the arena already holds this size
  Arena& ar = a.arena;
  ar.reset();
  auto t = [&](size_t n) { return ar.alloc<T>(n); };
  auto acc = [&](size_t n) { return ar.alloc<A>(n); };
  a.anchors_dev = ar.alloc<int32_t>(N);
  a.ctx_pos = ar.alloc<int32_t>(S);
  a.blk_pos = ar.alloc<int32_t>(NB);
  a.blk_tokens_dev = ar.alloc<int32_t>(NB);
  be.upload(ec, a.anchors_dev, a.anchors.data(), sizeof(int32_t) * N);
  be.upload(ec, a.ctx_pos, ctx_pos.data(), sizeof(int32_t) * S);
  be.upload(ec, a.blk_pos, blk_pos.data(), sizeof(int32_t) * NB);
  be.upload(ec, a.blk_tokens_dev, a.blk_tokens.data(), sizeof(int32_t) * NB);

  // context: ctx = hidden_norm(fc(taps))
  a.fc_out = t(size_t(S) * H);
  a.ctx_rstd = acc(S);
  a.ctx = t(size_t(S) * H);
  be.linear_forward(ec, a.fc_out, in.taps, w.fc, S, c.n_taps * H, H);
  be.rmsnorm_forward(ec, a.ctx, a.ctx_rstd, a.fc_out, w.hidden_norm, S, H, eps);

  a.x_embed = t(size_t(NB) * H);
  be.embedding_forward(ec, a.x_embed, in.embed, a.blk_tokens_dev, NB, H, c.vocab);
  a.proj_out = t(size_t(NB) * H);  // o_proj / down_proj outputs before the residual add

  a.layer.assign(c.layers, DrafterLayerActs<T>{});
  const T* x = a.x_embed;  // the residual stream entering layer l
  for (int l = 0; l < c.layers; ++l) {
    const DrafterLayerWeights<T>& lw = w.layers[l];
    DrafterLayerActs<T>& s = a.layer[l];
    s.x_in = x;
    s.rstd_in = acc(NB);
    s.xn = t(size_t(NB) * H);
    be.rmsnorm_forward(ec, s.xn, s.rstd_in, s.x_in, lw.input_norm, NB, H, eps);

    // projections: Q and block K/V from the block, context K/V from ctx with the same k/v weights;
    // q_norm / k_norm per head, then RoPE (block rows at anchor_b + j, context rows at their own positions)
    s.q_raw = t(size_t(NB) * NH * D);
    s.q_rstd = acc(size_t(NB) * NH);
    s.q = t(size_t(NB) * NH * D);
    s.kb_raw = t(size_t(NB) * KVH * D);
    s.kb_rstd = acc(size_t(NB) * KVH);
    s.kb = t(size_t(NB) * KVH * D);
    s.vb = t(size_t(NB) * KVH * D);
    s.kc_raw = t(size_t(S) * KVH * D);
    s.kc_rstd = acc(size_t(S) * KVH);
    s.kc = t(size_t(S) * KVH * D);
    s.vc = t(size_t(S) * KVH * D);
    be.linear_forward(ec, s.q_raw, s.xn, lw.q_proj, NB, H, NH * D);
    be.linear_forward(ec, s.kb_raw, s.xn, lw.k_proj, NB, H, KVH * D);
    be.linear_forward(ec, s.vb, s.xn, lw.v_proj, NB, H, KVH * D);
    be.linear_forward(ec, s.kc_raw, a.ctx, lw.k_proj, S, H, KVH * D);
    be.linear_forward(ec, s.vc, a.ctx, lw.v_proj, S, H, KVH * D);
    // per-head norm and RoPE in one pass each (rstd per (row, head), as rmsnorm_forward saves it)
    be.head_norm_rope_forward(ec, s.q, s.q_rstd, s.q_raw, lw.q_norm, a.blk_pos, NB, NH, D, eps, c.rope_theta);
    be.head_norm_rope_forward(ec, s.kb, s.kb_rstd, s.kb_raw, lw.k_norm, a.blk_pos, NB, KVH, D, eps, c.rope_theta);
    be.head_norm_rope_forward(ec, s.kc, s.kc_rstd, s.kc_raw, lw.k_norm, a.ctx_pos, S, KVH, D, eps, c.rope_theta);

    s.attn = t(size_t(NB) * NH * D);
    s.lse = acc(size_t(NB) * NH);
    be.dflash_attention_forward(ec, s.attn, s.lse, s.q, s.kc, s.vc, s.kb, s.vb, a.anchors_dev,
                                drafter_attention_shape(c, l, S, N));

    s.x_mid = t(size_t(NB) * H);
    be.linear_forward(ec, a.proj_out, s.attn, lw.o_proj, NB, NH * D, H);
    be.residual_forward(ec, s.x_mid, s.x_in, a.proj_out, size_t(NB) * H);

    s.rstd_post = acc(NB);
    s.xn2 = t(size_t(NB) * H);
    be.rmsnorm_forward(ec, s.xn2, s.rstd_post, s.x_mid, lw.post_norm, NB, H, eps);
    s.gate = t(size_t(NB) * I);
    s.up = t(size_t(NB) * I);
    s.h = t(size_t(NB) * I);
    be.linear_forward(ec, s.gate, s.xn2, lw.gate_proj, NB, H, I);
    be.linear_forward(ec, s.up, s.xn2, lw.up_proj, NB, H, I);
    be.swiglu_forward(ec, s.h, s.gate, s.up, size_t(NB) * I);
    s.x_out = t(size_t(NB) * H);
    be.linear_forward(ec, a.proj_out, s.h, lw.down_proj, NB, I, H);
    be.residual_forward(ec, s.x_out, s.x_mid, a.proj_out, size_t(NB) * H);
    x = s.x_out;
  }

  a.rstd_final = acc(NB);
  a.out = t(size_t(NB) * H);
  be.rmsnorm_forward(ec, a.out, a.rstd_final, x, w.norm, NB, H, eps);
}

template <typename T>
void drafter_backward(const DrafterConfig& c, const DrafterWeights<T>& w, const DrafterInputs<T>& in,
                      DrafterActivations<T>& a, const T* d_out, DrafterWeights<kernels::acc_t<T>>& g,
                      const DrafterRuntime<T>& rt) {
  kernels::Backend<T>& be = rt.backend;
  ExecContext& ec = rt.exec;
  const int S = a.seq_len, N = a.n_blocks, B = c.block_size, H = c.hidden, D = c.head_dim;
  const int NB = N * B, NH = c.heads, KVH = c.kv_heads, I = c.intermediate;
  Arena& ar = a.arena;
  ArenaScope backward_scratch(ar);  // everything below is freed when backward returns; the activations stay
  auto zeros = [&](size_t n) {
    T* p = ar.alloc<T>(n);
    be.zero(ec, p, n * sizeof(T));
    return p;
  };

  // final norm: d_x = d(x_L)
  const T* x_last = c.layers > 0 ? a.layer.back().x_out : a.x_embed;
  T* d_x = zeros(size_t(NB) * H);
  T* d_mid = ar.alloc<T>(size_t(NB) * H);
  T* d_ctx = zeros(size_t(S) * H);  // every layer's context K/V add into it
  be.rmsnorm_backward(ec, d_x, g.norm, d_out, x_last, w.norm, a.rstd_final, NB, H);

  for (int l = c.layers - 1; l >= 0; --l) {
    ArenaScope layer_scratch(ar);
    const DrafterLayerWeights<T>& lw = w.layers[l];
    DrafterLayerWeights<kernels::acc_t<T>>& lg = g.layers[l];
    const DrafterLayerActs<T>& s = a.layer[l];

    // MLP: x_out = x_mid + down(silu(gate(xn2)) * up(xn2)); d_x is d(x_out)
    T* d_h = zeros(size_t(NB) * I);
    T* d_gate = zeros(size_t(NB) * I);
    T* d_up = zeros(size_t(NB) * I);
    T* d_xn2 = zeros(size_t(NB) * H);
    be.linear_backward(ec, d_h, lg.down_proj, d_x, s.h, lw.down_proj, NB, I, H);
    be.swiglu_backward(ec, d_gate, d_up, d_h, s.gate, s.up, size_t(NB) * I);
    be.linear_backward(ec, d_xn2, lg.gate_proj, d_gate, s.xn2, lw.gate_proj, NB, H, I);
    be.linear_backward(ec, d_xn2, lg.up_proj, d_up, s.xn2, lw.up_proj, NB, H, I);
    be.copy(ec, d_mid, d_x, sizeof(T) * size_t(NB) * H);  // residual path
    be.rmsnorm_backward(ec, d_mid, lg.post_norm, d_xn2, s.x_mid, lw.post_norm, s.rstd_post, NB, H);

    // attention: x_mid = x_in + o_proj(attn)
    T* d_attn = zeros(size_t(NB) * NH * D);
    be.linear_backward(ec, d_attn, lg.o_proj, d_mid, s.attn, lw.o_proj, NB, NH * D, H);
    T* d_q = zeros(size_t(NB) * NH * D);
    T* d_kb = zeros(size_t(NB) * KVH * D);
    T* d_vb = zeros(size_t(NB) * KVH * D);
    T* d_kc = zeros(size_t(S) * KVH * D);
    T* d_vc = zeros(size_t(S) * KVH * D);
    be.dflash_attention_backward(ec, d_q, d_kc, d_vc, d_kb, d_vb, d_attn, s.attn, s.lse, s.q, s.kc, s.vc, s.kb,
                                 s.vb, a.anchors_dev, drafter_attention_shape(c, l, S, N));

    // RoPE, then q_norm / k_norm, back to the raw projections: one fused pass each (rmsnorm_backward of Rᵀ d)
    T* d_qraw = zeros(size_t(NB) * NH * D);
    T* d_kbraw = zeros(size_t(NB) * KVH * D);
    T* d_kcraw = zeros(size_t(S) * KVH * D);
    be.head_norm_rope_backward(ec, d_qraw, lg.q_norm, d_q, s.q_raw, lw.q_norm, s.q_rstd, a.blk_pos, NB, NH, D,
                               c.rope_theta);
    be.head_norm_rope_backward(ec, d_kbraw, lg.k_norm, d_kb, s.kb_raw, lw.k_norm, s.kb_rstd, a.blk_pos, NB, KVH, D,
                               c.rope_theta);
    be.head_norm_rope_backward(ec, d_kcraw, lg.k_norm, d_kc, s.kc_raw, lw.k_norm, s.kc_rstd, a.ctx_pos, S, KVH, D,
                               c.rope_theta);

    // projections: block side into d_xn, context side into d_ctx (shared k/v weights get both)
    T* d_xn = zeros(size_t(NB) * H);
    be.linear_backward(ec, d_xn, lg.q_proj, d_qraw, s.xn, lw.q_proj, NB, H, NH * D);
    be.linear_backward(ec, d_xn, lg.k_proj, d_kbraw, s.xn, lw.k_proj, NB, H, KVH * D);
    be.linear_backward(ec, d_xn, lg.v_proj, d_vb, s.xn, lw.v_proj, NB, H, KVH * D);
    be.linear_backward(ec, d_ctx, lg.k_proj, d_kcraw, a.ctx, lw.k_proj, S, H, KVH * D);
    be.linear_backward(ec, d_ctx, lg.v_proj, d_vc, a.ctx, lw.v_proj, S, H, KVH * D);

    // input_layernorm + residual: d(x_in) = d_mid + norm backward
    be.rmsnorm_backward(ec, d_mid, lg.input_norm, d_xn, s.x_in, lw.input_norm, s.rstd_in, NB, H);
    std::swap(d_x, d_mid);
  }
  // d_x now holds d(embedding rows): the embedding is frozen, so it stops here.

  // context: ctx = hidden_norm(fc(taps)); the taps come from the frozen target, so no d(taps)
  T* d_fc_out = zeros(size_t(S) * H);
  be.rmsnorm_backward(ec, d_fc_out, g.hidden_norm, d_ctx, a.fc_out, w.hidden_norm, a.ctx_rstd, S, H);
  be.linear_backward(ec, nullptr, g.fc, d_fc_out, in.taps, w.fc, S, c.n_taps * H, H);
}

template <typename T>
void drafter_forward(const DrafterConfig& c, const DrafterParams<T>& w, const DrafterInputs<T>& in,
                     DrafterActivations<T>& acts) {
  drafter_forward<T>(c, static_cast<const DrafterWeights<T>&>(w), in, acts,
                     DrafterRuntime<T>{kernels::cpu_backend<T>(), kernels::host_exec_context()});
}

template <typename T>
void drafter_backward(const DrafterConfig& c, const DrafterParams<T>& w, const DrafterInputs<T>& in,
                      DrafterActivations<T>& acts, const T* d_out, DrafterParams<T>& grads) {
  drafter_backward<T>(c, static_cast<const DrafterWeights<T>&>(w), in, acts, d_out,
                      static_cast<DrafterWeights<T>&>(grads),
                      DrafterRuntime<T>{kernels::cpu_backend<T>(), kernels::host_exec_context()});
}

DrafterFlops drafter_flops(const DrafterConfig& c, int S, const std::vector<int>& anchors) {
  const double NB = double(anchors.size()) * c.block_size, H = c.hidden, Q = double(c.heads) * c.head_dim;
  const double KV = double(c.kv_heads) * c.head_dim, I = c.intermediate;
  // per layer GEMMs: q, block k/v, o, gate/up/down on NB rows; context k/v on S rows
  const double layer_gemm = 2 * NB * H * (Q + 2 * KV) + 2 * NB * Q * H + 3 * 2 * NB * H * I + 2 * 2 * S * H * KV;
  const double fc_gemm = 2.0 * S * c.n_taps * H * H;
  double attn_pairs = 0;
  for (int l = 0; l < c.layers; ++l)
    attn_pairs += double(kernels::dflash_attention_pairs(anchors.data(), drafter_attention_shape(c, l, S, anchors.size())));
  DrafterFlops f;
  f.forward = c.layers * layer_gemm + fc_gemm + 4 * c.head_dim * attn_pairs;
  // backward: two GEMMs (d input, d weight) per forward GEMM, but fc needs no d(taps); attention recomputes the
  // scores and forms dQ, dK, dV, dP: 10·D per pair
  f.backward = 2 * c.layers * layer_gemm + fc_gemm + 10 * c.head_dim * attn_pairs;
  return f;
}

#define DFLASH_INSTANTIATE_DRAFTER_BACKEND(T)                                                                      \
  template struct DrafterActivations<T>;                                                                         \
  template void drafter_forward<T>(const DrafterConfig&, const DrafterWeights<T>&, const DrafterInputs<T>&,     \
                                   DrafterActivations<T>&, const DrafterRuntime<T>&);                           \
  template void drafter_backward<T>(const DrafterConfig&, const DrafterWeights<T>&, const DrafterInputs<T>&,    \
                                    DrafterActivations<T>&, const T*, DrafterWeights<kernels::acc_t<T>>&,       \
                                    const DrafterRuntime<T>&);
#define DFLASH_INSTANTIATE_DRAFTER(T)                                                                              \
  DFLASH_INSTANTIATE_DRAFTER_BACKEND(T)                                                                          \
  template void drafter_forward<T>(const DrafterConfig&, const DrafterParams<T>&, const DrafterInputs<T>&,      \
                                   DrafterActivations<T>&);                                                      \
  template void drafter_backward<T>(const DrafterConfig&, const DrafterParams<T>&, const DrafterInputs<T>&,     \
                                    DrafterActivations<T>&, const T*, DrafterParams<T>&);
DFLASH_INSTANTIATE_DRAFTER(float)
DFLASH_INSTANTIATE_DRAFTER(double)
DFLASH_INSTANTIATE_DRAFTER_BACKEND(kernels::bf16)  // bf16 activations: the CUDA backend only

}  // namespace dflash::model
