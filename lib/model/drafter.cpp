#include "lib/model/drafter.h"

#include <algorithm>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "lib/core/error.h"

namespace dflash {

using namespace cpu;

cpu::DFlashAttentionShape drafter_attention_shape(const DrafterConfig& c, int layer, int seq_len, int n_blocks) {
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

template <typename T>
void drafter_forward(const DrafterConfig& c, const DrafterParams<T>& w, const DrafterInputs<T>& in,
                     DrafterActivations<T>& a) {
  const int S = in.seq_len, N = in.n_anchors, B = c.block_size, H = c.hidden, D = c.head_dim;
  const int NB = N * B, NH = c.heads, KVH = c.kv_heads, I = c.intermediate;
  const T eps = T(c.rms_eps);
  DFLASH_CHECK(S > 0 && N > 0, "drafter forward: needs a sequence (S = {}) and anchors (N = {})", S, N);
  a.seq_len = S;
  a.n_blocks = N;
  a.anchors.assign(in.anchors, in.anchors + N);
  a.ctx_pos.resize(S);
  for (int i = 0; i < S; ++i) a.ctx_pos[i] = i;
  a.blk_pos.resize(NB);
  a.blk_tokens.resize(NB);
  for (int b = 0; b < N; ++b) {
    DFLASH_CHECK(in.anchors[b] >= 0 && in.anchors[b] < S, "drafter forward: anchor {} = {} is outside [0, {})", b,
                 in.anchors[b], S);
    for (int j = 0; j < B; ++j) {
      a.blk_pos[b * B + j] = in.anchors[b] + j;
      a.blk_tokens[b * B + j] = j == 0 ? in.tokens[in.anchors[b]] : c.mask_token_id;
    }
  }

  // context: ctx = hidden_norm(fc(taps))
  a.fc_out.resize(size_t(S) * H);
  a.ctx_rstd.resize(S);
  a.ctx.resize(size_t(S) * H);
  linear_forward(a.fc_out.data(), in.taps, w.fc, S, c.n_taps * H, H);
  rmsnorm_forward(a.ctx.data(), a.ctx_rstd.data(), a.fc_out.data(), w.hidden_norm, S, H, eps);

  std::vector<T> x(size_t(NB) * H);  // the residual stream
  embedding_forward(x.data(), in.embed, a.blk_tokens.data(), NB, H, c.vocab);
  std::vector<T> tmp(size_t(NB) * H);  // o_proj / down_proj outputs before the residual add

  a.layer.resize(c.layers);
  for (int l = 0; l < c.layers; ++l) {
    const DrafterLayerWeights<T>& lw = w.layers[l];
    DrafterLayerActs<T>& s = a.layer[l];
    s.x_in = x;
    s.rstd_in.resize(NB);
    s.xn.resize(size_t(NB) * H);
    rmsnorm_forward(s.xn.data(), s.rstd_in.data(), s.x_in.data(), lw.input_norm, NB, H, eps);

    // projections: Q and block K/V from the block, context K/V from ctx with the same k/v weights
    s.q_raw.resize(size_t(NB) * NH * D);
    s.kb_raw.resize(size_t(NB) * KVH * D);
    s.vb.resize(size_t(NB) * KVH * D);
    s.kc_raw.resize(size_t(S) * KVH * D);
    s.vc.resize(size_t(S) * KVH * D);
    linear_forward(s.q_raw.data(), s.xn.data(), lw.q_proj, NB, H, NH * D);
    linear_forward(s.kb_raw.data(), s.xn.data(), lw.k_proj, NB, H, KVH * D);
    linear_forward(s.vb.data(), s.xn.data(), lw.v_proj, NB, H, KVH * D);
    linear_forward(s.kc_raw.data(), a.ctx.data(), lw.k_proj, S, H, KVH * D);
    linear_forward(s.vc.data(), a.ctx.data(), lw.v_proj, S, H, KVH * D);

    // q_norm / k_norm per head, then RoPE (block rows at anchor_b + j, context rows at their own positions)
    s.q_rstd.resize(size_t(NB) * NH);
    s.kb_rstd.resize(size_t(NB) * KVH);
    s.kc_rstd.resize(size_t(S) * KVH);
    s.q.resize(s.q_raw.size());
    s.kb.resize(s.kb_raw.size());
    s.kc.resize(s.kc_raw.size());
    rmsnorm_forward(s.q.data(), s.q_rstd.data(), s.q_raw.data(), lw.q_norm, NB * NH, D, eps);
    rmsnorm_forward(s.kb.data(), s.kb_rstd.data(), s.kb_raw.data(), lw.k_norm, NB * KVH, D, eps);
    rmsnorm_forward(s.kc.data(), s.kc_rstd.data(), s.kc_raw.data(), lw.k_norm, S * KVH, D, eps);
    rope_forward(s.q.data(), s.q.data(), a.blk_pos.data(), NB, NH, D, c.rope_theta);
    rope_forward(s.kb.data(), s.kb.data(), a.blk_pos.data(), NB, KVH, D, c.rope_theta);
    rope_forward(s.kc.data(), s.kc.data(), a.ctx_pos.data(), S, KVH, D, c.rope_theta);

    s.attn.resize(size_t(NB) * NH * D);
    s.lse.resize(size_t(NB) * NH);
    const auto shape = drafter_attention_shape(c, l, S, N);
    dflash_attention_forward(s.attn.data(), s.lse.data(), s.q.data(), s.kc.data(), s.vc.data(), s.kb.data(),
                             s.vb.data(), a.anchors.data(), shape);

    s.x_mid.resize(size_t(NB) * H);
    linear_forward(tmp.data(), s.attn.data(), lw.o_proj, NB, NH * D, H);
    residual_forward(s.x_mid.data(), s.x_in.data(), tmp.data(), s.x_mid.size());

    s.rstd_post.resize(NB);
    s.xn2.resize(size_t(NB) * H);
    rmsnorm_forward(s.xn2.data(), s.rstd_post.data(), s.x_mid.data(), lw.post_norm, NB, H, eps);
    s.gate.resize(size_t(NB) * I);
    s.up.resize(size_t(NB) * I);
    s.h.resize(size_t(NB) * I);
    linear_forward(s.gate.data(), s.xn2.data(), lw.gate_proj, NB, H, I);
    linear_forward(s.up.data(), s.xn2.data(), lw.up_proj, NB, H, I);
    swiglu_forward(s.h.data(), s.gate.data(), s.up.data(), s.h.size());
    linear_forward(tmp.data(), s.h.data(), lw.down_proj, NB, I, H);
    residual_forward(x.data(), s.x_mid.data(), tmp.data(), x.size());
  }

  a.x_last = x;
  a.rstd_final.resize(NB);
  a.out.resize(size_t(NB) * H);
  rmsnorm_forward(a.out.data(), a.rstd_final.data(), a.x_last.data(), w.norm, NB, H, eps);
}

template <typename T>
void drafter_backward(const DrafterConfig& c, const DrafterParams<T>& w, const DrafterInputs<T>& in,
                      const DrafterActivations<T>& a, const T* d_out, DrafterParams<T>& g) {
  const int S = a.seq_len, N = a.n_blocks, B = c.block_size, H = c.hidden, D = c.head_dim;
  const int NB = N * B, NH = c.heads, KVH = c.kv_heads, I = c.intermediate;
  auto zeros = [](size_t n) { return std::vector<T>(n, T(0)); };

  // final norm: d_x = d(x_last)
  std::vector<T> d_x = zeros(size_t(NB) * H);
  rmsnorm_backward(d_x.data(), g.norm, d_out, a.x_last.data(), w.norm, a.rstd_final.data(), NB, H);

  std::vector<T> d_ctx = zeros(size_t(S) * H);  // every layer's context K/V add into it
  for (int l = c.layers - 1; l >= 0; --l) {
    const DrafterLayerWeights<T>& lw = w.layers[l];
    DrafterLayerWeights<T>& lg = g.layers[l];
    const DrafterLayerActs<T>& s = a.layer[l];

    // MLP: x_out = x_mid + down(silu(gate(xn2)) * up(xn2)); d_x is d(x_out)
    std::vector<T> d_h = zeros(size_t(NB) * I), d_gate = zeros(size_t(NB) * I), d_up = zeros(size_t(NB) * I);
    std::vector<T> d_xn2 = zeros(size_t(NB) * H);
    linear_backward(d_h.data(), lg.down_proj, d_x.data(), s.h.data(), lw.down_proj, NB, I, H);
    swiglu_backward(d_gate.data(), d_up.data(), d_h.data(), s.gate.data(), s.up.data(), d_h.size());
    linear_backward(d_xn2.data(), lg.gate_proj, d_gate.data(), s.xn2.data(), lw.gate_proj, NB, H, I);
    linear_backward(d_xn2.data(), lg.up_proj, d_up.data(), s.xn2.data(), lw.up_proj, NB, H, I);
    std::vector<T> d_mid = d_x;  // residual path
    rmsnorm_backward(d_mid.data(), lg.post_norm, d_xn2.data(), s.x_mid.data(), lw.post_norm, s.rstd_post.data(),
                     NB, H);

    // attention: x_mid = x_in + o_proj(attn)
    std::vector<T> d_attn = zeros(s.attn.size());
    linear_backward(d_attn.data(), lg.o_proj, d_mid.data(), s.attn.data(), lw.o_proj, NB, NH * D, H);
    std::vector<T> d_q = zeros(s.q.size()), d_kb = zeros(s.kb.size()), d_vb = zeros(s.vb.size());
    std::vector<T> d_kc = zeros(s.kc.size()), d_vc = zeros(s.vc.size());
    const auto shape = drafter_attention_shape(c, l, S, N);
    dflash_attention_backward(d_q.data(), d_kc.data(), d_vc.data(), d_kb.data(), d_vb.data(), d_attn.data(),
                              s.attn.data(), s.lse.data(), s.q.data(), s.kc.data(), s.vc.data(), s.kb.data(),
                              s.vb.data(), a.anchors.data(), shape);

    // RoPE, then q_norm / k_norm, back to the raw projections
    std::vector<T> d_qn = zeros(s.q.size()), d_kbn = zeros(s.kb.size()), d_kcn = zeros(s.kc.size());
    rope_backward(d_qn.data(), d_q.data(), a.blk_pos.data(), NB, NH, D, c.rope_theta);
    rope_backward(d_kbn.data(), d_kb.data(), a.blk_pos.data(), NB, KVH, D, c.rope_theta);
    rope_backward(d_kcn.data(), d_kc.data(), a.ctx_pos.data(), S, KVH, D, c.rope_theta);
    std::vector<T> d_qraw = zeros(s.q.size()), d_kbraw = zeros(s.kb.size()), d_kcraw = zeros(s.kc.size());
    rmsnorm_backward(d_qraw.data(), lg.q_norm, d_qn.data(), s.q_raw.data(), lw.q_norm, s.q_rstd.data(), NB * NH, D);
    rmsnorm_backward(d_kbraw.data(), lg.k_norm, d_kbn.data(), s.kb_raw.data(), lw.k_norm, s.kb_rstd.data(),
                     NB * KVH, D);
    rmsnorm_backward(d_kcraw.data(), lg.k_norm, d_kcn.data(), s.kc_raw.data(), lw.k_norm, s.kc_rstd.data(),
                     S * KVH, D);

    // projections: block side into d_xn, context side into d_ctx (shared k/v weights get both)
    std::vector<T> d_xn = zeros(size_t(NB) * H);
    linear_backward(d_xn.data(), lg.q_proj, d_qraw.data(), s.xn.data(), lw.q_proj, NB, H, NH * D);
    linear_backward(d_xn.data(), lg.k_proj, d_kbraw.data(), s.xn.data(), lw.k_proj, NB, H, KVH * D);
    linear_backward(d_xn.data(), lg.v_proj, d_vb.data(), s.xn.data(), lw.v_proj, NB, H, KVH * D);
    linear_backward(d_ctx.data(), lg.k_proj, d_kcraw.data(), a.ctx.data(), lw.k_proj, S, H, KVH * D);
    linear_backward(d_ctx.data(), lg.v_proj, d_vc.data(), a.ctx.data(), lw.v_proj, S, H, KVH * D);

    // input_layernorm + residual: d(x_in) = d_mid + norm backward
    rmsnorm_backward(d_mid.data(), lg.input_norm, d_xn.data(), s.x_in.data(), lw.input_norm, s.rstd_in.data(), NB,
                     H);
    d_x.swap(d_mid);
  }
  // d_x now holds d(embedding rows): the embedding is frozen, so it stops here.

  // context: ctx = hidden_norm(fc(taps)); the taps come from the frozen target, so no d(taps)
  std::vector<T> d_fc_out = zeros(size_t(S) * H);
  rmsnorm_backward(d_fc_out.data(), g.hidden_norm, d_ctx.data(), a.fc_out.data(), w.hidden_norm,
                   a.ctx_rstd.data(), S, H);
  linear_backward((T*)nullptr, g.fc, d_fc_out.data(), in.taps, w.fc, S, c.n_taps * H, H);
}

DrafterFlops drafter_flops(const DrafterConfig& c, int S, const std::vector<int>& anchors) {
  const double NB = double(anchors.size()) * c.block_size, H = c.hidden, Q = double(c.heads) * c.head_dim;
  const double KV = double(c.kv_heads) * c.head_dim, I = c.intermediate;
  // per layer GEMMs: q, block k/v, o, gate/up/down on NB rows; context k/v on S rows
  const double layer_gemm = 2 * NB * H * (Q + 2 * KV) + 2 * NB * Q * H + 3 * 2 * NB * H * I + 2 * 2 * S * H * KV;
  const double fc_gemm = 2.0 * S * c.n_taps * H * H;
  double attn_pairs = 0;
  for (int l = 0; l < c.layers; ++l)
    attn_pairs += double(cpu::dflash_attention_pairs(anchors.data(), drafter_attention_shape(c, l, S, anchors.size())));
  DrafterFlops f;
  f.forward = c.layers * layer_gemm + fc_gemm + 4 * c.head_dim * attn_pairs;
  // backward: two GEMMs (d input, d weight) per forward GEMM, but fc needs no d(taps); attention recomputes the
  // scores and forms dQ, dK, dV, dP: 10·D per pair
  f.backward = 2 * c.layers * layer_gemm + fc_gemm + 10 * c.head_dim * attn_pairs;
  return f;
}

template void drafter_forward<float>(const DrafterConfig&, const DrafterParams<float>&, const DrafterInputs<float>&,
                                     DrafterActivations<float>&);
template void drafter_forward<double>(const DrafterConfig&, const DrafterParams<double>&,
                                      const DrafterInputs<double>&, DrafterActivations<double>&);
template void drafter_backward<float>(const DrafterConfig&, const DrafterParams<float>&, const DrafterInputs<float>&,
                                      const DrafterActivations<float>&, const float*, DrafterParams<float>&);
template void drafter_backward<double>(const DrafterConfig&, const DrafterParams<double>&,
                                       const DrafterInputs<double>&, const DrafterActivations<double>&,
                                       const double*, DrafterParams<double>&);

}  // namespace dflash
