#include "lib/model/drafter.h"

#include <algorithm>

#include "lib/core/arena_plan.h"
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

// The activation arena's arrays, declared once. Each bind_* below names every array of one stage with its element
// count; its element type is the member's. Bound with ArenaBinder they are the pointers drafter_forward and
// drafter_backward use; bound with ArenaMeter the same calls add up drafter_arena_bytes. So the arena's capacity is
// exactly the peak (a unit test checks arena.peak() against it: it fails if a stage allocates outside its list).
struct DrafterDims {
  size_t S, N, NB, H, Q, KV, I, NH, KVH;
  DrafterDims(const DrafterConfig& c, int seq_len, int n_anchors)
      : S(size_t(seq_len)), N(size_t(n_anchors)), NB(size_t(n_anchors) * c.block_size), H(size_t(c.hidden)),
        Q(size_t(c.heads) * c.head_dim), KV(size_t(c.kv_heads) * c.head_dim), I(size_t(c.intermediate)),
        NH(size_t(c.heads)), KVH(size_t(c.kv_heads)) {}
};

// As ArenaBinder (lib/core/arena_plan.h), each array zeroed on the backend as it is bound: backward's gradients
// accumulate (+=) into them.
template <typename T>
struct ZeroedArenaBinder {
  Arena& arena;
  kernels::Backend<T>& be;
  ExecContext& ec;
  template <typename U>
  void operator()(U*& p, size_t count) {
    p = arena.alloc<U>(count);
    be.zero(ec, p, count * sizeof(U));
  }
};

// Forward: the bookkeeping, the context, the embedded block, each layer's saved activations, the final norm. All of
// it stays until the next forward (backward reads it).
template <typename T, class Bind>
void bind_forward(Bind& b, DrafterActivations<T>& a, const DrafterDims& z, int layers) {
  b(a.anchors_dev, z.N);
  b(a.ctx_pos, z.S);
  b(a.blk_pos, z.NB);
  b(a.blk_tokens_dev, z.NB);
  b(a.fc_out, z.S * z.H);
  b(a.ctx_rstd, z.S);
  b(a.ctx, z.S * z.H);
  b(a.x_embed, z.NB * z.H);
  b(a.proj_out, z.NB * z.H);
  a.layer.assign(layers, DrafterLayerActs<T>{});
  for (DrafterLayerActs<T>& s : a.layer) {
    b(s.rstd_in, z.NB);
    b(s.xn, z.NB * z.H);
    b(s.q_raw, z.NB * z.Q);
    b(s.q_rstd, z.NB * z.NH);
    b(s.q, z.NB * z.Q);
    b(s.kb_raw, z.NB * z.KV);
    b(s.kb_rstd, z.NB * z.KVH);
    b(s.kb, z.NB * z.KV);
    b(s.vb, z.NB * z.KV);
    b(s.kc_raw, z.S * z.KV);
    b(s.kc_rstd, z.S * z.KVH);
    b(s.kc, z.S * z.KV);
    b(s.vc, z.S * z.KV);
    b(s.attn, z.NB * z.Q);
    b(s.lse, z.NB * z.NH);
    b(s.x_mid, z.NB * z.H);
    b(s.rstd_post, z.NB);
    b(s.xn2, z.NB * z.H);
    b(s.gate, z.NB * z.I);
    b(s.up, z.NB * z.I);
    b(s.h, z.NB * z.I);
    b(s.x_out, z.NB * z.H);
  }
  b(a.rstd_final, z.NB);
  b(a.out, z.NB * z.H);
}

// Backward, kept across the layers: d(residual stream) in two buffers that swap, and d(ctx) every layer adds into.
template <typename T>
struct DrafterBackwardStreams {
  T* d_x = nullptr;    // [NB, H]
  T* d_mid = nullptr;  // [NB, H]
  T* d_ctx = nullptr;  // [S, H]
};
// `zeroed` binds what backward accumulates into (d_x, d_ctx); `plain` binds d_mid, which every layer writes whole (a
// copy of d_x) before reading it.
template <typename T, class Zeroed, class Plain>
void bind_backward_streams(Zeroed& zeroed, Plain& plain, DrafterBackwardStreams<T>& g, const DrafterDims& z) {
  zeroed(g.d_x, z.NB * z.H);
  plain(g.d_mid, z.NB * z.H);
  zeroed(g.d_ctx, z.S * z.H);
}

// Backward scratch of one layer (released before the next layer's).
template <typename T>
struct DrafterLayerGrads {
  T *d_h, *d_gate, *d_up, *d_xn2;                  // [NB, I] x3, [NB, H]: the MLP
  T* d_attn;                                       // [NB, NH*D]
  T *d_q, *d_kb, *d_vb, *d_kc, *d_vc;              // attention inputs: [NB, NH*D], [NB, KVH*D] x2, [S, KVH*D] x2
  T *d_qraw, *d_kbraw, *d_kcraw;                   // before q_norm / k_norm and RoPE
  T* d_xn;                                         // [NB, H] input_layernorm output
};
template <typename T, class Bind>
void bind_layer_grads(Bind& b, DrafterLayerGrads<T>& g, const DrafterDims& z) {
  b(g.d_h, z.NB * z.I);
  b(g.d_gate, z.NB * z.I);
  b(g.d_up, z.NB * z.I);
  b(g.d_xn2, z.NB * z.H);
  b(g.d_attn, z.NB * z.Q);
  b(g.d_q, z.NB * z.Q);
  b(g.d_kb, z.NB * z.KV);
  b(g.d_vb, z.NB * z.KV);
  b(g.d_kc, z.S * z.KV);
  b(g.d_vc, z.S * z.KV);
  b(g.d_qraw, z.NB * z.Q);
  b(g.d_kbraw, z.NB * z.KV);
  b(g.d_kcraw, z.S * z.KV);
  b(g.d_xn, z.NB * z.H);
}

// Backward scratch of the context (after the layers' is released): d(fc output).
template <typename T, class Bind>
void bind_context_grads(Bind& b, T*& d_fc_out, const DrafterDims& z) {
  b(d_fc_out, z.S * z.H);
}

// The arena's peak over the stages in drafter_backward's order: forward, the streams, one layer's scratch (every
// layer's is the same size and released before the next), then the context's.
template <typename T>
size_t arena_peak(const DrafterConfig& c, int seq_len, int n_anchors) {
  const DrafterDims z(c, seq_len, n_anchors);
  ArenaMeter m;
  DrafterActivations<T> a;
  bind_forward(m, a, z, c.layers);
  DrafterBackwardStreams<T> streams;
  bind_backward_streams(m, m, streams, z);
  const size_t before_scratch = m.mark();
  DrafterLayerGrads<T> layer;
  bind_layer_grads(m, layer, z);
  m.rewind(before_scratch);
  T* d_fc_out = nullptr;
  bind_context_grads(m, d_fc_out, z);
  return m.peak;
}

}  // namespace

size_t drafter_arena_bytes(const DrafterConfig& c, int seq_len, int n_anchors, size_t elem_bytes, size_t acc_bytes) {
  // the element types the backends instantiate: fp32 and double (CPU, CUDA fp32), bf16 with fp32 accumulators
  if (elem_bytes == 4 && acc_bytes == 4) return arena_peak<float>(c, seq_len, n_anchors);
  if (elem_bytes == 8 && acc_bytes == 8) return arena_peak<double>(c, seq_len, n_anchors);
  DFLASH_CHECK(elem_bytes == 2 && acc_bytes == 4,
               "drafter_arena_bytes: no drafter instantiation has {}-byte elements and {}-byte accumulators",
               elem_bytes, acc_bytes);
  return arena_peak<kernels::bf16>(c, seq_len, n_anchors);
}

template <typename T>
void DrafterActivations<T>::reserve(MemoryKind kind, const DrafterConfig& cfg, int max_seq_len, int n_anchors) {
  const size_t need = arena_peak<T>(cfg, max_seq_len, n_anchors);
  if (arena.capacity() < need || arena.kind() != kind) arena = Arena(kind, need, "drafter activations");
}

template <typename T>
void drafter_forward(const DrafterConfig& c, const DrafterWeights<T>& w, const DrafterInputs<T>& in,
                     DrafterActivations<T>& a, const DrafterRuntime<T>& rt) {
  kernels::Backend<T>& be = rt.backend;
  ExecContext& ec = rt.exec;
  const int S = in.seq_len, N = in.n_anchors, B = c.block_size, H = c.hidden, D = c.head_dim;
  const int NB = N * B, NH = c.heads, KVH = c.kv_heads, I = c.intermediate;
  const double eps = c.rms_norm_eps;
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
  ArenaBinder bind{ar};
  bind_forward(bind, a, DrafterDims(c, S, N), c.layers);  // every pointer below comes from this one list
  be.upload(ec, a.anchors_dev, a.anchors.data(), sizeof(int32_t) * N);
  be.upload(ec, a.ctx_pos, ctx_pos.data(), sizeof(int32_t) * S);
  be.upload(ec, a.blk_pos, blk_pos.data(), sizeof(int32_t) * NB);
  be.upload(ec, a.blk_tokens_dev, a.blk_tokens.data(), sizeof(int32_t) * NB);

  // context: ctx = hidden_norm(fc(taps))
  be.linear_forward(ec, a.fc_out, in.taps, w.fc, S, c.n_taps * H, H);
  be.rmsnorm_forward(ec, a.ctx, a.ctx_rstd, a.fc_out, w.hidden_norm, S, H, eps);

  be.embedding_forward(ec, a.x_embed, in.embed, a.blk_tokens_dev, NB, H, c.vocab);

  const T* x = a.x_embed;  // the residual stream entering layer l
  for (int l = 0; l < c.layers; ++l) {
    const DrafterLayerWeights<T>& lw = w.layers[l];
    DrafterLayerActs<T>& s = a.layer[l];
    s.x_in = x;
    be.rmsnorm_forward(ec, s.xn, s.rstd_in, s.x_in, lw.input_layernorm, NB, H, eps);

    // projections: Q and block K/V from the block, context K/V from ctx with the same k/v weights;
    // q_norm / k_norm per head, then RoPE (block rows at anchor_b + j, context rows at their own positions)
    be.linear_forward(ec, s.q_raw, s.xn, lw.q_proj, NB, H, NH * D);
    be.linear_forward(ec, s.kb_raw, s.xn, lw.k_proj, NB, H, KVH * D);
    be.linear_forward(ec, s.vb, s.xn, lw.v_proj, NB, H, KVH * D);
    be.linear_forward(ec, s.kc_raw, a.ctx, lw.k_proj, S, H, KVH * D);
    be.linear_forward(ec, s.vc, a.ctx, lw.v_proj, S, H, KVH * D);
    // per-head norm and RoPE in one pass each (rstd per (row, head), as rmsnorm_forward saves it)
    be.head_norm_rope_forward(ec, s.q, s.q_rstd, s.q_raw, lw.q_norm, a.blk_pos, NB, NH, D, eps, c.rope_theta);
    be.head_norm_rope_forward(ec, s.kb, s.kb_rstd, s.kb_raw, lw.k_norm, a.blk_pos, NB, KVH, D, eps, c.rope_theta);
    be.head_norm_rope_forward(ec, s.kc, s.kc_rstd, s.kc_raw, lw.k_norm, a.ctx_pos, S, KVH, D, eps, c.rope_theta);

    be.dflash_attention_forward(ec, s.attn, s.lse, s.q, s.kc, s.vc, s.kb, s.vb, a.anchors_dev,
                                drafter_attention_shape(c, l, S, N));

    be.linear_forward(ec, a.proj_out, s.attn, lw.o_proj, NB, NH * D, H);
    be.residual_forward(ec, s.x_mid, s.x_in, a.proj_out, size_t(NB) * H);

    be.rmsnorm_forward(ec, s.xn2, s.rstd_post, s.x_mid, lw.post_attention_layernorm, NB, H, eps);
    be.linear_forward(ec, s.gate, s.xn2, lw.gate_proj, NB, H, I);
    be.linear_forward(ec, s.up, s.xn2, lw.up_proj, NB, H, I);
    be.swiglu_forward(ec, s.h, s.gate, s.up, size_t(NB) * I);
    be.linear_forward(ec, a.proj_out, s.h, lw.down_proj, NB, I, H);
    be.residual_forward(ec, s.x_out, s.x_mid, a.proj_out, size_t(NB) * H);
    x = s.x_out;
  }

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
  ZeroedArenaBinder<T> bind{ar, be, ec};
  ArenaBinder plain{ar};
  const DrafterDims z(c, S, N);

  // final norm: d_x = d(x_L); every layer's context K/V add into d_ctx
  const T* x_last = c.layers > 0 ? a.layer.back().x_out : a.x_embed;
  DrafterBackwardStreams<T> st;
  bind_backward_streams(bind, plain, st, z);
  T *d_x = st.d_x, *d_mid = st.d_mid, *d_ctx = st.d_ctx;
  be.rmsnorm_backward(ec, d_x, g.norm, d_out, x_last, w.norm, a.rstd_final, NB, H);

  for (int l = c.layers - 1; l >= 0; --l) {
    ArenaScope layer_scratch(ar);
    const DrafterLayerWeights<T>& lw = w.layers[l];
    DrafterLayerWeights<kernels::acc_t<T>>& lg = g.layers[l];
    const DrafterLayerActs<T>& s = a.layer[l];
    DrafterLayerGrads<T> d;
    bind_layer_grads(bind, d, z);
    T *d_h = d.d_h, *d_gate = d.d_gate, *d_up = d.d_up, *d_xn2 = d.d_xn2, *d_attn = d.d_attn, *d_q = d.d_q;
    T *d_kb = d.d_kb, *d_vb = d.d_vb, *d_kc = d.d_kc, *d_vc = d.d_vc, *d_qraw = d.d_qraw, *d_kbraw = d.d_kbraw;
    T *d_kcraw = d.d_kcraw, *d_xn = d.d_xn;

    // MLP: x_out = x_mid + down(silu(gate(xn2)) * up(xn2)); d_x is d(x_out)
    be.linear_backward(ec, d_h, lg.down_proj, d_x, s.h, lw.down_proj, NB, I, H);
    be.swiglu_backward(ec, d_gate, d_up, d_h, s.gate, s.up, size_t(NB) * I);
    be.linear_backward(ec, d_xn2, lg.gate_proj, d_gate, s.xn2, lw.gate_proj, NB, H, I);
    be.linear_backward(ec, d_xn2, lg.up_proj, d_up, s.xn2, lw.up_proj, NB, H, I);
    be.copy(ec, d_mid, d_x, sizeof(T) * size_t(NB) * H);  // residual path
    be.rmsnorm_backward(ec, d_mid, lg.post_attention_layernorm, d_xn2, s.x_mid, lw.post_attention_layernorm, s.rstd_post, NB, H);

    // attention: x_mid = x_in + o_proj(attn)
    be.linear_backward(ec, d_attn, lg.o_proj, d_mid, s.attn, lw.o_proj, NB, NH * D, H);
    be.dflash_attention_backward(ec, d_q, d_kc, d_vc, d_kb, d_vb, d_attn, s.attn, s.lse, s.q, s.kc, s.vc, s.kb,
                                 s.vb, a.anchors_dev, drafter_attention_shape(c, l, S, N));

    // RoPE, then q_norm / k_norm, back to the raw projections: one fused pass each (rmsnorm_backward of Rᵀ d)
    be.head_norm_rope_backward(ec, d_qraw, lg.q_norm, d_q, s.q_raw, lw.q_norm, s.q_rstd, a.blk_pos, NB, NH, D,
                               c.rope_theta);
    be.head_norm_rope_backward(ec, d_kbraw, lg.k_norm, d_kb, s.kb_raw, lw.k_norm, s.kb_rstd, a.blk_pos, NB, KVH, D,
                               c.rope_theta);
    be.head_norm_rope_backward(ec, d_kcraw, lg.k_norm, d_kc, s.kc_raw, lw.k_norm, s.kc_rstd, a.ctx_pos, S, KVH, D,
                               c.rope_theta);

    // projections: block side into d_xn, context side into d_ctx (shared k/v weights get both)
    be.linear_backward(ec, d_xn, lg.q_proj, d_qraw, s.xn, lw.q_proj, NB, H, NH * D);
    be.linear_backward(ec, d_xn, lg.k_proj, d_kbraw, s.xn, lw.k_proj, NB, H, KVH * D);
    be.linear_backward(ec, d_xn, lg.v_proj, d_vb, s.xn, lw.v_proj, NB, H, KVH * D);
    be.linear_backward(ec, d_ctx, lg.k_proj, d_kcraw, a.ctx, lw.k_proj, S, H, KVH * D);
    be.linear_backward(ec, d_ctx, lg.v_proj, d_vc, a.ctx, lw.v_proj, S, H, KVH * D);

    // input_layernorm + residual: d(x_in) = d_mid + norm backward
    be.rmsnorm_backward(ec, d_mid, lg.input_layernorm, d_xn, s.x_in, lw.input_layernorm, s.rstd_in, NB, H);
    std::swap(d_x, d_mid);
  }
  // d_x now holds d(embedding rows): the embedding is frozen, so it stops here.

  // context: ctx = hidden_norm(fc(taps)); the taps come from the frozen target, so no d(taps)
  T* d_fc_out = nullptr;
  bind_context_grads(bind, d_fc_out, z);
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
