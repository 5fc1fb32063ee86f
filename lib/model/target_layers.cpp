#include "lib/model/target_layers.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_tree.h"
#include "lib/core/error.h"

namespace dflash::model {

void shard_linear(kernels::Backend<float>& be, float* y, const float* x, const float* W, int N, int in, int out) {
  if (N == 0 || out == 0) return;
  if (in == 0) {
    be.zero(be.context(), y, sizeof(float) * size_t(N) * out);
    return;
  }
  be.linear_forward(be.context(), y, x, W, N, in, out);
}

namespace {

// arena bytes of float arrays of these sizes (Arena::footprint per array)
size_t floats_footprint(std::initializer_list<size_t> counts) {
  size_t n = 0;
  for (size_t c : counts) n += Arena::footprint(c * sizeof(float));
  return n;
}

}  // namespace

size_t attention_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S) {
  const size_t s = size_t(S), hd = size_t(c.head_dim), qh = size_t(shard.q_count), kvh = size_t(shard.kv_count);
  const size_t qd = qh * hd, kvd = kvh * hd;
  size_t n = floats_footprint({s * qd, s * kvd, s * kvd, s * qd, s * std::max<size_t>({qh, kvh, 1})});
  if (c.hybrid) n += floats_footprint({s * 2 * qd, s * qd});
  return n;
}

void attention_forward(kernels::Backend<float>& be, Arena& scratch, float* part, const float* h, const int32_t* pos,
                       int S, const TargetLayer& L, const QwenConfig& c, const TargetShard& shard,
                       float* keys, float* values, int past, const int* tree_parents) {
  DFLASH_CHECK(!tree_parents || be.memory() == MemoryKind::host,
               "target forward_tree: tree verification runs the CPU kernel kernels/cpu/attention_tree on host "
               "memory; this target runs on the {} backend (use a CPU target for tree verification)",
               be.name());
  ExecContext& ctx = be.context();
  ArenaScope scope(scratch);
  const int H = c.hidden, hd = c.head_dim, qh = shard.q_count, kvh = shard.kv_count;
  const int qd = qh * hd, kvd = kvh * hd;
  const size_t s = size_t(S);
  float* q = scratch.alloc<float>(s * qd);
  float* k = scratch.alloc<float>(s * kvd);
  float* v = scratch.alloc<float>(s * kvd);
  float* attn = scratch.alloc<float>(s * qd);
  float* rstd = scratch.alloc<float>(s * size_t(std::max({qh, kvh, 1})));
  float* gate = nullptr;  // [S, qd] hybrid output gate
  if (c.hybrid) {
    // q_proj rows come per head as [query (hd) | gate (hd)]
    float* qg = scratch.alloc<float>(s * 2 * qd);
    gate = scratch.alloc<float>(s * qd);
    shard_linear(be, qg, h, L.wq.data(), S, H, 2 * qd);
    be.copy_strided(ctx, q, hd, qg, 2 * hd, S * qh, hd);
    be.copy_strided(ctx, gate, hd, qg + hd, 2 * hd, S * qh, hd);
  } else {
    shard_linear(be, q, h, L.wq.data(), S, H, qd);
  }
  shard_linear(be, k, h, L.wk.data(), S, H, kvd);
  shard_linear(be, v, h, L.wv.data(), S, H, kvd);
  be.rmsnorm_forward(ctx, q, rstd, q, L.q_norm.data(), S * qh, hd, c.rms_norm_eps);
  be.rmsnorm_forward(ctx, k, rstd, k, L.k_norm.data(), S * kvh, hd, c.rms_norm_eps);
  if (c.rotary_dim == hd) {
    be.rope_forward(ctx, q, q, pos, S, qh, hd, c.rope_theta);
    be.rope_forward(ctx, k, k, pos, S, kvh, hd, c.rope_theta);
  } else {
    be.rope_partial_forward(ctx, q, q, pos, S, qh, hd, c.rotary_dim, c.rope_theta);
    be.rope_partial_forward(ctx, k, k, pos, S, kvh, hd, c.rotary_dim, c.rope_theta);
  }
  // local Q head j belongs to global KV head (q_begin + j) / g, i.e. local KV head j / (qh / kvh) — true for both
  // the whole-group split (qh = kvh·g) and replication (kvh = 1)
  DFLASH_CHECK(keys || past == 0, "target attention: {} earlier positions but no cache", past);
  if (keys) {  // append these S rows to the cache, then attend over all past + S of them
    const size_t at = size_t(past) * size_t(kvd), add = s * size_t(kvd);
    be.copy(ctx, keys + at, k, add * sizeof(float));
    be.copy(ctx, values + at, v, add * sizeof(float));
  }
  const float* kk = keys ? keys : k;
  const float* vv = keys ? values : v;
  if (tree_parents) {
    // tree verification has no backend entry: the CPU kernel on host memory (checked above)
    cpu::attention_tree_forward<float>(attn, q, kk, vv, tree_parents, S, past, qh, kvh, hd);
  } else {
    be.attention_cached_forward(ctx, attn, q, kk, vv, S, past, qh, kvh, hd);
  }
  if (c.hybrid) be.sigmoid_gate(ctx, attn, gate, s * size_t(qd));
  shard_linear(be, part, attn, L.wo.data(), S, qd, H);
}

size_t gated_deltanet_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S) {
  const size_t s = size_t(S), dk = size_t(c.linear_k_dim), dv = size_t(c.linear_v_dim);
  const size_t nk = size_t(shard.linear.group_count), nv = size_t(shard.linear.member_count);
  const size_t qkd = nk * dk, vd = nv * dv, C = 2 * qkd + vd;
  return floats_footprint({s * C, s * C, s * qkd, s * qkd, s * vd, s * vd, s * nv, s * nv, s * vd});
}

void gated_deltanet_forward(kernels::Backend<float>& be, Arena& scratch, float* part, const float* h, int S,
                            const TargetLayer& L, const QwenConfig& c, const TargetShard& shard,
                            float* conv_tail, float* state) {
  ExecContext& ctx = be.context();
  ArenaScope scope(scratch);
  const int H = c.hidden, dk = c.linear_k_dim, dv = c.linear_v_dim, K = c.conv_kernel;
  const int nk = shard.linear.group_count, nv = shard.linear.member_count;
  const int qkd = nk * dk, vd = nv * dv, C = 2 * qkd + vd;
  const size_t s = size_t(S);
  float* mixed = scratch.alloc<float>(s * C);
  float* conv = scratch.alloc<float>(s * C);
  shard_linear(be, mixed, h, L.w_qkv.data(), S, H, C);
  // with a cache the conv continues from the last K−1 inputs (conv_tail, zeros before position 0) and keeps them,
  // and the delta rule continues from the cache's state; both are updated in place
  be.causal_conv1d_silu_forward(ctx, conv, mixed, L.conv.data(), conv_tail, S, C, K);
  // split the conv output's channels q | k | v into per-head rows
  float* q = scratch.alloc<float>(s * qkd);
  float* k = scratch.alloc<float>(s * qkd);
  float* v = scratch.alloc<float>(s * vd);
  be.copy_strided(ctx, q, qkd, conv, C, S, qkd);
  be.copy_strided(ctx, k, qkd, conv + qkd, C, S, qkd);
  be.copy_strided(ctx, v, vd, conv + 2 * qkd, C, S, vd);
  // the constants as float, as the layer computes them (the backend narrows its double arguments to float)
  be.l2norm_forward(ctx, q, S * nk, dk, double(1e-6f), double(1.f / std::sqrt(float(dk))));
  be.l2norm_forward(ctx, k, S * nk, dk, double(1e-6f), 1.0);

  float* z = scratch.alloc<float>(s * vd);
  float* beta = scratch.alloc<float>(s * nv);
  float* decay = scratch.alloc<float>(s * nv);
  shard_linear(be, z, h, L.w_z.data(), S, H, vd);
  shard_linear(be, beta, h, L.w_b.data(), S, H, nv);
  shard_linear(be, decay, h, L.w_a.data(), S, H, nv);
  // β = sigmoid(b), g = −exp(A_log) · softplus(a + dt_bias), in place
  be.deltanet_gates_forward(ctx, decay, beta, decay, beta, L.a_log.data(), L.dt_bias.data(), S, nv);
  // local value head j reads local key head j / (nv / nk): whole groups (nv = nk·r) or one replicated key head
  float* o = scratch.alloc<float>(s * vd);
  if (nv > 0) be.gated_delta_rule_forward(ctx, o, q, k, v, decay, beta, state, S, nk, nv, dk, dv);
  be.gated_rmsnorm_forward(ctx, o, o, z, L.gated_norm.data(), S * nv, dv, c.rms_norm_eps);
  shard_linear(be, part, o, L.w_out.data(), S, vd, H);
}

}  // namespace dflash::model
