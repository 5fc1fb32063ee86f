#include "lib/model/target_layers.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_causal.h"
#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/attention_tree.h"
#include "kernels/cpu/gated_deltanet.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/rope_partial.h"

namespace dflash::model {

void shard_linear(float* y, const float* x, const float* W, int N, int in, int out) {
  if (N == 0 || out == 0) return;
  if (in == 0) {
    std::fill(y, y + size_t(N) * out, 0.f);
    return;
  }
  cpu::linear_forward<float>(y, x, W, N, in, out);
}

void attention_forward(float* part, const float* h, const int* pos, int S, const TargetLayer& L,
                       const QwenConfig& c, const TargetShard& shard, int attention_block, std::vector<float>* keys,
                       std::vector<float>* values, const int* tree_parents) {
  const int H = c.hidden, hd = c.head_dim, qh = shard.q_count, kvh = shard.kv_count;
  const int qd = qh * hd, kvd = kvh * hd;
  const float eps = float(c.rms_norm_eps);
  std::vector<float> q(size_t(S) * qd), k(size_t(S) * kvd), v(size_t(S) * kvd), attn(size_t(S) * qd);
  std::vector<float> gate;  // [S, qd] hybrid output gate
  std::vector<float> rstd(size_t(S) * std::max({qh, kvh, 1}));
  if (c.hybrid) {
    // q_proj rows come per head as [query (hd) | gate (hd)]
    std::vector<float> qg(size_t(S) * 2 * qd);
    shard_linear(qg.data(), h, L.wq.data(), S, H, 2 * qd);
    gate.resize(size_t(S) * qd);
    for (size_t r = 0; r < size_t(S) * qh; ++r) {
      std::copy_n(&qg[r * 2 * hd], hd, &q[r * hd]);
      std::copy_n(&qg[r * 2 * hd + hd], hd, &gate[r * hd]);
    }
  } else {
    shard_linear(q.data(), h, L.wq.data(), S, H, qd);
  }
  shard_linear(k.data(), h, L.wk.data(), S, H, kvd);
  shard_linear(v.data(), h, L.wv.data(), S, H, kvd);
  cpu::rmsnorm_forward<float>(q.data(), rstd.data(), q.data(), L.q_norm.data(), S * qh, hd, eps);
  cpu::rmsnorm_forward<float>(k.data(), rstd.data(), k.data(), L.k_norm.data(), S * kvh, hd, eps);
  if (c.rotary_dim == hd) {
    cpu::rope_forward<float>(q.data(), q.data(), pos, S, qh, hd, c.rope_theta);
    cpu::rope_forward<float>(k.data(), k.data(), pos, S, kvh, hd, c.rope_theta);
  } else {
    cpu::rope_partial_forward<float>(q.data(), pos, S, qh, hd, c.rotary_dim, c.rope_theta);
    cpu::rope_partial_forward<float>(k.data(), pos, S, kvh, hd, c.rotary_dim, c.rope_theta);
  }
  // local Q head j belongs to global KV head (q_begin + j) / g, i.e. local KV head j / (qh / kvh) — true for both
  // the whole-group split (qh = kvh·g) and replication (kvh = 1)
  const int past = keys ? int(keys->size() / std::max<size_t>(size_t(kvd), 1)) : 0;
  if (keys) {
    keys->insert(keys->end(), k.begin(), k.end());
    values->insert(values->end(), v.begin(), v.end());
  }
  if (tree_parents) {
    cpu::attention_tree_forward<float>(attn.data(), q.data(), keys->data(), values->data(), tree_parents, S, past, qh,
                                       kvh, hd);
  } else if (past == 0) {
    cpu::attention_causal_forward<float>(attn.data(), q.data(), k.data(), v.data(), S, qh, kvh, hd, attention_block);
  } else {
    cpu::attention_decode_forward<float>(attn.data(), q.data(), keys->data(), values->data(), S, past, qh, kvh, hd);
  }
  if (c.hybrid) {
    for (size_t i = 0; i < attn.size(); ++i) attn[i] *= 1.f / (1.f + std::exp(-gate[i]));
  }
  shard_linear(part, attn.data(), L.wo.data(), S, qd, H);
}

void gated_deltanet_forward(float* part, const float* h, int S, const TargetLayer& L, const QwenConfig& c,
                            const TargetShard& shard, std::vector<float>* conv_tail, std::vector<float>* state) {
  const int H = c.hidden, dk = c.linear_k_dim, dv = c.linear_v_dim, K = c.conv_kernel;
  const int nk = shard.linear.group_count, nv = shard.linear.member_count;
  const int qkd = nk * dk, vd = nv * dv, C = 2 * qkd + vd;
  // with a cache the conv runs over [the last K−1 inputs ; these S rows] and keeps the outputs of these S rows
  const int T = conv_tail ? K - 1 + S : S;
  std::vector<float> mixed(size_t(T) * C), conv(size_t(T) * C);
  float* fresh = mixed.data() + size_t(T - S) * C;
  shard_linear(fresh, h, L.w_qkv.data(), S, H, C);
  if (conv_tail) {
    if (conv_tail->empty()) conv_tail->assign(size_t(K - 1) * C, 0.f);  // zeros before position 0
    std::copy(conv_tail->begin(), conv_tail->end(), mixed.begin());
    std::copy(mixed.end() - long(size_t(K - 1) * C), mixed.end(), conv_tail->begin());
    if (state->empty()) state->assign(size_t(nv) * dk * dv, 0.f);
  }
  cpu::causal_conv1d_silu_forward<float>(conv.data(), mixed.data(), L.conv.data(), T, C, K);
  conv.erase(conv.begin(), conv.begin() + long(size_t(T - S) * C));
  // split the conv output's channels q | k | v into per-head rows
  std::vector<float> q(size_t(S) * qkd), k(size_t(S) * qkd), v(size_t(S) * vd);
  for (int t = 0; t < S; ++t) {
    const float* row = &conv[size_t(t) * C];
    std::copy_n(row, qkd, &q[size_t(t) * qkd]);
    std::copy_n(row + qkd, qkd, &k[size_t(t) * qkd]);
    std::copy_n(row + 2 * qkd, vd, &v[size_t(t) * vd]);
  }
  cpu::l2norm_forward<float>(q.data(), S * nk, dk, 1e-6f, 1.f / std::sqrt(float(dk)));
  cpu::l2norm_forward<float>(k.data(), S * nk, dk, 1e-6f, 1.f);

  std::vector<float> z(size_t(S) * vd), beta(size_t(S) * nv), decay(size_t(S) * nv);
  shard_linear(z.data(), h, L.w_z.data(), S, H, vd);
  shard_linear(beta.data(), h, L.w_b.data(), S, H, nv);
  shard_linear(decay.data(), h, L.w_a.data(), S, H, nv);
  for (int t = 0; t < S; ++t)
    for (int j = 0; j < nv; ++j) {
      const size_t i = size_t(t) * nv + j;
      beta[i] = 1.f / (1.f + std::exp(-beta[i]));
      // g = −exp(A_log) · softplus(a + dt_bias), softplus linear above 20 as torch's
      const float x = decay[i] + L.dt_bias[size_t(j)];
      const float softplus = x > 20.f ? x : std::log1p(std::exp(x));
      decay[i] = -std::exp(L.a_log[size_t(j)]) * softplus;
    }
  // local value head j reads local key head j / (nv / nk): whole groups (nv = nk·r) or one replicated key head
  std::vector<float> o(size_t(S) * vd);
  if (nv > 0)
    cpu::gated_delta_rule_forward<float>(o.data(), q.data(), k.data(), v.data(), decay.data(), beta.data(), S, nk,
                                         nv, dk, dv, 64, state ? state->data() : nullptr);
  cpu::gated_rmsnorm_forward<float>(o.data(), o.data(), z.data(), L.gated_norm.data(), S * nv, dv,
                                    float(c.rms_norm_eps));
  shard_linear(part, o.data(), L.w_out.data(), S, vd, H);
}

}  // namespace dflash::model
