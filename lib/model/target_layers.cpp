#include "lib/model/target_layers.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_tree.h"
#include "kernels/cpu/gemm.h"

namespace dflash::model {

void shard_linear(float* y, const float* x, const float* W, int N, int in, int out) {
  if (N == 0 || out == 0) return;
  if (in == 0) {
    std::fill(y, y + size_t(N) * out, 0.f);
    return;
  }
  cpu::linear_forward<float>(y, x, W, N, in, out);
}

namespace {

// shard_linear on the backend: y[N, out] (=) x · Wᵀ, zeros when in = 0, nothing when the shard is empty
void linear(kernels::Backend<float>& be, float* y, const float* x, const float* W, int N, int in, int out) {
  if (N == 0 || out == 0) return;
  if (in == 0) {
    be.zero(be.context(), y, sizeof(float) * size_t(N) * out);
    return;
  }
  be.linear_forward(be.context(), y, x, W, N, in, out);
}

}  // namespace

void attention_forward(kernels::Backend<float>& be, float* part, const float* h, const int* pos, int S,
                       const TargetLayer& L, const QwenConfig& c, const TargetShard& shard, std::vector<float>* keys,
                       std::vector<float>* values, const int* tree_parents) {
  ExecContext& ctx = be.context();
  const int H = c.hidden, hd = c.head_dim, qh = shard.q_count, kvh = shard.kv_count;
  const int qd = qh * hd, kvd = kvh * hd;
  std::vector<float> q(size_t(S) * qd), k(size_t(S) * kvd), v(size_t(S) * kvd), attn(size_t(S) * qd);
  std::vector<float> gate;  // [S, qd] hybrid output gate
  std::vector<float> rstd(size_t(S) * std::max({qh, kvh, 1}));
  if (c.hybrid) {
    // q_proj rows come per head as [query (hd) | gate (hd)]
    std::vector<float> qg(size_t(S) * 2 * qd);
    linear(be, qg.data(), h, L.wq.data(), S, H, 2 * qd);
    gate.resize(size_t(S) * qd);
    be.copy_strided(ctx, q.data(), hd, qg.data(), 2 * hd, S * qh, hd);
    be.copy_strided(ctx, gate.data(), hd, qg.data() + hd, 2 * hd, S * qh, hd);
  } else {
    linear(be, q.data(), h, L.wq.data(), S, H, qd);
  }
  linear(be, k.data(), h, L.wk.data(), S, H, kvd);
  linear(be, v.data(), h, L.wv.data(), S, H, kvd);
  be.rmsnorm_forward(ctx, q.data(), rstd.data(), q.data(), L.q_norm.data(), S * qh, hd, c.rms_norm_eps);
  be.rmsnorm_forward(ctx, k.data(), rstd.data(), k.data(), L.k_norm.data(), S * kvh, hd, c.rms_norm_eps);
  if (c.rotary_dim == hd) {
    be.rope_forward(ctx, q.data(), q.data(), pos, S, qh, hd, c.rope_theta);
    be.rope_forward(ctx, k.data(), k.data(), pos, S, kvh, hd, c.rope_theta);
  } else {
    be.rope_partial_forward(ctx, q.data(), q.data(), pos, S, qh, hd, c.rotary_dim, c.rope_theta);
    be.rope_partial_forward(ctx, k.data(), k.data(), pos, S, kvh, hd, c.rotary_dim, c.rope_theta);
  }
  // local Q head j belongs to global KV head (q_begin + j) / g, i.e. local KV head j / (qh / kvh) — true for both
  // the whole-group split (qh = kvh·g) and replication (kvh = 1)
  const int past = keys ? int(keys->size() / std::max<size_t>(size_t(kvd), 1)) : 0;
  if (keys) {
    keys->insert(keys->end(), k.begin(), k.end());
    values->insert(values->end(), v.begin(), v.end());
  }
  if (tree_parents) {
    // tree verification has no backend entry yet: the CPU kernel on the host arrays (the target runs on the CPU)
    cpu::attention_tree_forward<float>(attn.data(), q.data(), keys->data(), values->data(), tree_parents, S, past, qh,
                                       kvh, hd);
  } else {
    // after a cache the keys are the cache's (these S rows appended); from position 0 they are just these rows
    const float* kk = past > 0 ? keys->data() : k.data();
    const float* vv = past > 0 ? values->data() : v.data();
    be.attention_cached_forward(ctx, attn.data(), q.data(), kk, vv, S, past, qh, kvh, hd);
  }
  if (c.hybrid) be.sigmoid_gate(ctx, attn.data(), gate.data(), attn.size());
  linear(be, part, attn.data(), L.wo.data(), S, qd, H);
}

void gated_deltanet_forward(kernels::Backend<float>& be, float* part, const float* h, int S, const TargetLayer& L,
                            const QwenConfig& c, const TargetShard& shard, std::vector<float>* conv_tail,
                            std::vector<float>* state) {
  ExecContext& ctx = be.context();
  const int H = c.hidden, dk = c.linear_k_dim, dv = c.linear_v_dim, K = c.conv_kernel;
  const int nk = shard.linear.group_count, nv = shard.linear.member_count;
  const int qkd = nk * dk, vd = nv * dv, C = 2 * qkd + vd;
  std::vector<float> mixed(size_t(S) * C), conv(size_t(S) * C);
  linear(be, mixed.data(), h, L.w_qkv.data(), S, H, C);
  // with a cache the conv continues from the last K−1 inputs (conv_tail, zeros before position 0) and keeps them
  float* tail = nullptr;
  if (conv_tail) {
    if (conv_tail->empty()) conv_tail->assign(size_t(K - 1) * C, 0.f);
    if (state->empty()) state->assign(size_t(nv) * dk * dv, 0.f);
    tail = conv_tail->data();
  }
  be.causal_conv1d_silu_forward(ctx, conv.data(), mixed.data(), L.conv.data(), tail, S, C, K);
  // split the conv output's channels q | k | v into per-head rows
  std::vector<float> q(size_t(S) * qkd), k(size_t(S) * qkd), v(size_t(S) * vd);
  be.copy_strided(ctx, q.data(), qkd, conv.data(), C, S, qkd);
  be.copy_strided(ctx, k.data(), qkd, conv.data() + qkd, C, S, qkd);
  be.copy_strided(ctx, v.data(), vd, conv.data() + 2 * qkd, C, S, vd);
  // the constants as float, as the layer computes them (the backend narrows its double arguments to float)
  be.l2norm_forward(ctx, q.data(), S * nk, dk, double(1e-6f), double(1.f / std::sqrt(float(dk))));
  be.l2norm_forward(ctx, k.data(), S * nk, dk, double(1e-6f), 1.0);

  std::vector<float> z(size_t(S) * vd), beta(size_t(S) * nv), decay(size_t(S) * nv);
  linear(be, z.data(), h, L.w_z.data(), S, H, vd);
  linear(be, beta.data(), h, L.w_b.data(), S, H, nv);
  linear(be, decay.data(), h, L.w_a.data(), S, H, nv);
  // β = sigmoid(b), g = −exp(A_log) · softplus(a + dt_bias), in place
  be.deltanet_gates_forward(ctx, decay.data(), beta.data(), decay.data(), beta.data(), L.a_log.data(),
                            L.dt_bias.data(), S, nv);
  // local value head j reads local key head j / (nv / nk): whole groups (nv = nk·r) or one replicated key head
  std::vector<float> o(size_t(S) * vd);
  if (nv > 0)
    be.gated_delta_rule_forward(ctx, o.data(), q.data(), k.data(), v.data(), decay.data(), beta.data(),
                                state ? state->data() : nullptr, S, nk, nv, dk, dv);
  be.gated_rmsnorm_forward(ctx, o.data(), o.data(), z.data(), L.gated_norm.data(), S * nv, dv, c.rms_norm_eps);
  linear(be, part, o.data(), L.w_out.data(), S, vd, H);
}

}  // namespace dflash::model
