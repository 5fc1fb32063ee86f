#include "lib/model/target_layers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>

#include "lib/core/arena_plan.h"
#include "lib/core/error.h"

namespace dflash::model {

template <typename T>
size_t TargetLayer<T>::elements() const {
  size_t n = 0;
  for (const TargetWeight<T>* w : {&input_layernorm, &q_proj, &k_proj, &v_proj, &q_norm, &k_norm, &o_proj,
                                   &post_attention_layernorm, &gate_proj, &up_proj, &down_proj, &w_qkv, &conv, &w_z,
                                   &w_b, &w_a, &a_log, &dt_bias, &gated_norm, &w_out, &router,
                                   &expert_gate, &expert_up, &expert_down})
    n += w->size();
  return n;
}

template <typename T>
void shard_linear(kernels::Backend<T>& be, T* y, const T* x, const T* W, int N, int in, int out) {
  if (N == 0 || out == 0) return;
  if (in == 0) {
    be.zero(be.context(), y, sizeof(T) * size_t(N) * out);
    return;
  }
  be.linear_forward(be.context(), y, x, W, N, in, out);
}

namespace {

// Each token mixer's scratch, declared once (lib/core/arena_plan.h): bound with ArenaBinder these are the pointers
// its forward uses, under ArenaMeter the same list is its *_scratch_bytes. So the target's arena is sized by the
// lists the forwards allocate from, never by a formula that mirrors them.

// attention_forward: qd = q_count·head_dim, kvd = kv_count·head_dim
template <typename T>
struct AttentionScratch {
  T *q = nullptr, *k = nullptr, *v = nullptr;  // [S, qd], [S, kvd] x2 after the norms and RoPE
  T* attn = nullptr;                           // [S, qd]
  kernels::acc_t<T>* rstd = nullptr;           // [S, max(q_count, kv_count, 1)] q_norm / k_norm statistics
  T* qg = nullptr;                             // hybrid: [S, 2·qd] q_proj output, per head query | gate
  T* gate = nullptr;                           // hybrid: [S, qd] the output gate
};
template <typename T, class Bind>
void bind_attention_scratch(Bind& b, AttentionScratch<T>& a, const QwenConfig& c, const TargetShard& shard, int S) {
  const size_t s = size_t(S), qd = size_t(shard.q_count) * c.head_dim, kvd = size_t(shard.kv_count) * c.head_dim;
  b(a.q, s * qd);
  b(a.k, s * kvd);
  b(a.v, s * kvd);
  b(a.attn, s * qd);
  b(a.rstd, s * size_t(std::max({shard.q_count, shard.kv_count, 1})));
  if (c.hybrid) {
    b(a.qg, s * 2 * qd);
    b(a.gate, s * qd);
  }
}

// gated_deltanet_forward: nk key heads of dk, nv value heads of dv on this rank; C = 2·nk·dk + nv·dv conv channels
template <typename T>
struct DeltaNetScratch {
  T *mixed = nullptr, *conv = nullptr;                 // [S, C] in_proj_qkv output, after the conv and SiLU
  T *q = nullptr, *k = nullptr;                        // [S, nk·dk] split from conv, then l2-normed
  T* v = nullptr;                                      // [S, nv·dv]
  T* z = nullptr;                                      // [S, nv·dv] output gate
  T *b_proj = nullptr, *a_proj = nullptr;              // [S, nv]
  kernels::acc_t<T>*beta = nullptr, *decay = nullptr;  // [S, nv] β and g, in A: they compound over the sequence
  T* o = nullptr;                                      // [S, nv·dv] the delta rule's output, then gated-normed
  unsigned char* rule = nullptr;  // the delta rule's scratch (kernels::gated_delta_rule_scratch_bytes: bf16 on CUDA)
};
template <typename T, class Bind>
void bind_deltanet_scratch(Bind& b, DeltaNetScratch<T>& a, const QwenConfig& c, const TargetShard& shard, int S) {
  const size_t s = size_t(S), nv = size_t(shard.linear.member_count);
  const size_t qkd = size_t(shard.linear.group_count) * c.linear_k_dim, vd = nv * c.linear_v_dim;
  const size_t C = 2 * qkd + vd;
  b(a.mixed, s * C);
  b(a.conv, s * C);
  b(a.q, s * qkd);
  b(a.k, s * qkd);
  b(a.v, s * vd);
  b(a.z, s * vd);
  b(a.b_proj, s * nv);
  b(a.a_proj, s * nv);
  b(a.beta, s * nv);
  b(a.decay, s * nv);
  b(a.o, s * vd);
  b(a.rule, kernels::gated_delta_rule_scratch_bytes<T>(S, shard.linear.group_count, int(nv), c.linear_k_dim,
                                                       c.linear_v_dim));
}

// moe_forward: E1 router rows (E experts, + 1 with a shared expert's gate), k experts per token, I per expert, ic
// this rank's shared-expert channels. An expert meets a token once, so one expert's rows are at most S.
template <typename T>
struct MoeScratch {
  T* logits = nullptr;                             // [S, E1] router logits (and the shared expert's gate)
  float* logits_f32 = nullptr;                     // [S, E1] widened for the host routing (bf16)
  T *shared_gate = nullptr, *shared_up = nullptr;  // [S, ic] the shared expert's gate, up then silu(gate)·up
  kernels::acc_t<T>* shared_weight = nullptr;      // [S] sigmoid(shared_expert_gate(h))
  int32_t* rows = nullptr;                         // [S·k] this rank's experts' token lists
  kernels::acc_t<T>* weights = nullptr;            // [S·k] their routing weights
  T* xe = nullptr;                                 // [S, H] one expert's tokens' normed rows
  T *gate = nullptr, *up = nullptr;                // [S, I] its gate, up then silu(gate)·up
  T* ye = nullptr;                                 // [S, H] its outputs
};
template <typename T, class Bind>
void bind_moe_scratch(Bind& b, MoeScratch<T>& a, const QwenConfig& c, const TargetShard& shard, int S) {
  const size_t s = size_t(S), H = size_t(c.hidden), I = size_t(c.moe_intermediate);
  const size_t E1 = size_t(c.experts) + (c.shared_expert_intermediate > 0), k = size_t(c.experts_per_token);
  const size_t ic = c.shared_expert_intermediate > 0 ? size_t(shard.mlp_end - shard.mlp_begin) : 0;
  b(a.logits, s * E1);
  b(a.logits_f32, s * E1);
  b(a.shared_gate, s * ic);
  b(a.shared_up, s * ic);
  b(a.shared_weight, s);
  b(a.rows, s * k);
  b(a.weights, s * k);
  b(a.xe, s * H);
  b(a.gate, s * I);
  b(a.up, s * I);
  b(a.ye, s * H);
}

}  // namespace

template <typename T>
size_t attention_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S) {
  return arena_bytes([&](ArenaMeter& m) {
    AttentionScratch<T> a;
    bind_attention_scratch(m, a, c, shard, S);
  });
}

template <typename T>
void attention_forward(kernels::Backend<T>& be, Arena& scratch, T* part, const T* h, const int32_t* pos, int S,
                       const TargetLayer<T>& L, const QwenConfig& c, const TargetShard& shard, T* keys, T* values,
                       int past, const int* tree_parents) {
  using A = kernels::acc_t<T>;
  DFLASH_CHECK(!tree_parents || be.supports(kernels::Feature::tree_attention),
               "target forward_tree: the {} backend has no tree attention (use a CPU target for tree verification)",
               be.name());
  ExecContext& ctx = be.context();
  ArenaScope scope(scratch);
  const int H = c.hidden, hd = c.head_dim, qh = shard.q_count, kvh = shard.kv_count;
  const int qd = qh * hd, kvd = kvh * hd;
  const size_t s = size_t(S);
  AttentionScratch<T> a;
  ArenaBinder bind{scratch};
  bind_attention_scratch(bind, a, c, shard, S);
  T *q = a.q, *k = a.k, *v = a.v, *attn = a.attn, *gate = a.gate, *qg = a.qg;
  A* rstd = a.rstd;
  if (c.hybrid) {
    // q_proj rows come per head as [query (hd) | gate (hd)]
    shard_linear(be, qg, h, L.q_proj.data(), S, H, 2 * qd);
    be.copy_strided(ctx, q, hd, qg, 2 * hd, S * qh, hd);
    be.copy_strided(ctx, gate, hd, qg + hd, 2 * hd, S * qh, hd);
  } else {
    shard_linear(be, q, h, L.q_proj.data(), S, H, qd);
  }
  shard_linear(be, k, h, L.k_proj.data(), S, H, kvd);
  shard_linear(be, v, h, L.v_proj.data(), S, H, kvd);
  if (c.rotary_dim == hd) {  // per-head q/k norm and RoPE in one pass each
    be.head_norm_rope_forward(ctx, q, rstd, q, L.q_norm.data(), pos, S, qh, hd, c.rms_norm_eps, c.rope_theta);
    be.head_norm_rope_forward(ctx, k, rstd, k, L.k_norm.data(), pos, S, kvh, hd, c.rms_norm_eps, c.rope_theta);
  } else {  // partial RoPE (Qwen3.5): the norm, then the rotation of the first rotary_dim dims
    be.rmsnorm_forward(ctx, q, rstd, q, L.q_norm.data(), S * qh, hd, c.rms_norm_eps);
    be.rmsnorm_forward(ctx, k, rstd, k, L.k_norm.data(), S * kvh, hd, c.rms_norm_eps);
    be.rope_partial_forward(ctx, q, q, pos, S, qh, hd, c.rotary_dim, c.rope_theta);
    be.rope_partial_forward(ctx, k, k, pos, S, kvh, hd, c.rotary_dim, c.rope_theta);
  }
  // local Q head j belongs to global KV head (q_begin + j) / g, i.e. local KV head j / (qh / kvh) — true for both
  // the whole-group split (qh = kvh·g) and replication (kvh = 1)
  DFLASH_CHECK(keys || past == 0, "target attention: {} earlier positions but no cache", past);
  if (keys) {  // append these S rows to the cache, then attend over all past + S of them
    const size_t at = size_t(past) * size_t(kvd), add = s * size_t(kvd);
    be.copy(ctx, keys + at, k, add * sizeof(T));
    be.copy(ctx, values + at, v, add * sizeof(T));
  }
  const T* kk = keys ? keys : k;
  const T* vv = keys ? values : v;
  if (tree_parents) {
    be.attention_tree_forward(ctx, attn, q, kk, vv, tree_parents, S, past, qh, kvh, hd);
  } else {
    be.attention_cached_forward(ctx, attn, q, kk, vv, S, past, qh, kvh, hd);
  }
  if (c.hybrid) be.sigmoid_gate(ctx, attn, gate, s * size_t(qd));
  shard_linear(be, part, attn, L.o_proj.data(), S, qd, H);
}

template <typename T>
size_t gated_deltanet_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S) {
  return arena_bytes([&](ArenaMeter& m) {
    DeltaNetScratch<T> a;
    bind_deltanet_scratch(m, a, c, shard, S);
  });
}

template <typename T>
void gated_deltanet_forward(kernels::Backend<T>& be, Arena& scratch, T* part, const T* h, int S,
                            const TargetLayer<T>& L, const QwenConfig& c, const TargetShard& shard, T* conv_tail,
                            kernels::acc_t<T>* state) {
  using A = kernels::acc_t<T>;
  ExecContext& ctx = be.context();
  ArenaScope scope(scratch);
  const int H = c.hidden, dk = c.linear_k_dim, dv = c.linear_v_dim, K = c.conv_kernel;
  const int nk = shard.linear.group_count, nv = shard.linear.member_count;
  const int qkd = nk * dk, vd = nv * dv, C = 2 * qkd + vd;
  DeltaNetScratch<T> a;
  ArenaBinder bind{scratch};
  bind_deltanet_scratch(bind, a, c, shard, S);
  T *mixed = a.mixed, *conv = a.conv, *q = a.q, *k = a.k, *v = a.v, *z = a.z, *b_proj = a.b_proj, *a_proj = a.a_proj;
  T* o = a.o;
  A *beta = a.beta, *decay = a.decay;
  shard_linear(be, mixed, h, L.w_qkv.data(), S, H, C);
  // with a cache the conv continues from the last K−1 inputs (conv_tail, zeros before position 0) and keeps them,
  // and the delta rule continues from the cache's state; both are updated in place
  be.causal_conv1d_silu_forward(ctx, conv, mixed, L.conv.data(), conv_tail, S, C, K);
  // split the conv output's channels q | k | v into per-head rows
  be.copy_strided(ctx, q, qkd, conv, C, S, qkd);
  be.copy_strided(ctx, k, qkd, conv + qkd, C, S, qkd);
  be.copy_strided(ctx, v, vd, conv + 2 * qkd, C, S, vd);
  // the constants as float, as the layer computes them (the backend narrows its double arguments to its type)
  be.l2norm_forward(ctx, q, S * nk, dk, double(1e-6f), double(1.f / std::sqrt(float(dk))));
  be.l2norm_forward(ctx, k, S * nk, dk, double(1e-6f), 1.0);

  shard_linear(be, z, h, L.w_z.data(), S, H, vd);
  shard_linear(be, b_proj, h, L.w_b.data(), S, H, nv);
  shard_linear(be, a_proj, h, L.w_a.data(), S, H, nv);
  // β = sigmoid(b), g = −exp(A_log) · softplus(a + dt_bias), in A: they compound over the sequence
  be.deltanet_gates_forward(ctx, decay, beta, a_proj, b_proj, L.a_log.data(), L.dt_bias.data(), S, nv);
  // local value head j reads local key head j / (nv / nk): whole groups (nv = nk·r) or one replicated key head
  if (nv > 0) be.gated_delta_rule_forward(ctx, o, q, k, v, decay, beta, state, S, nk, nv, dk, dv, a.rule);
  be.gated_rmsnorm_forward(ctx, o, o, z, L.gated_norm.data(), S * nv, dv, c.rms_norm_eps);
  shard_linear(be, part, o, L.w_out.data(), S, vd, H);
}

template <typename U>
MoeRouting route_tokens(const U* logits, int S, int E, int k, bool norm_topk_prob, int ld) {
  if (ld == 0) ld = E;
  DFLASH_CHECK(S >= 0 && E >= 1 && k >= 1 && k <= E && ld >= E, "route_tokens: S {} E {} k {} ld {}", S, E, k, ld);
  MoeRouting r;
  r.S = S;
  r.E = E;
  r.k = k;
  r.chosen.resize(size_t(S) * k);
  r.weight.resize(size_t(S) * k);
  std::vector<int> order(static_cast<size_t>(E));
  std::vector<double> z(static_cast<size_t>(E));
  for (int t = 0; t < S; ++t) {
    // a NaN logit ranks below every number (and is never chosen while k numbers remain)
    for (int e = 0; e < E; ++e) {
      const double v = double(logits[size_t(t) * ld + e]);
      z[size_t(e)] = std::isnan(v) ? -std::numeric_limits<double>::infinity() : v;
    }
    std::iota(order.begin(), order.end(), 0);
    // the tie rule: equal logits go to the lower expert index (a strict total order, so the choice is unique)
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
      return z[size_t(a)] > z[size_t(b)] || (z[size_t(a)] == z[size_t(b)] && a < b);
    });
    // softmax over all E logits, in double from the largest
    const double top = z[size_t(order[0])];
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(z[size_t(e)] - top);
    double chosen_sum = 0;
    for (int j = 0; j < k; ++j) {
      const int e = order[size_t(j)];
      const double p = std::exp(z[size_t(e)] - top) / sum;
      r.chosen[size_t(t) * k + j] = e;
      r.weight[size_t(t) * k + j] = p;
      chosen_sum += p;
    }
    if (norm_topk_prob)
      for (int j = 0; j < k; ++j) r.weight[size_t(t) * k + j] /= chosen_sum;
  }
  // per expert, its tokens in ascending order (a counting sort over the choices)
  r.expert_start.assign(size_t(E) + 1, 0);
  for (int32_t e : r.chosen) ++r.expert_start[size_t(e) + 1];
  for (int e = 0; e < E; ++e) r.expert_start[size_t(e) + 1] += r.expert_start[size_t(e)];
  std::vector<int64_t> at(r.expert_start.begin(), r.expert_start.end() - 1);
  r.tokens.resize(r.chosen.size());
  r.token_weight.resize(r.chosen.size());
  for (int t = 0; t < S; ++t) {
    for (int j = 0; j < k; ++j) {
      const size_t i = size_t(at[size_t(r.chosen[size_t(t) * k + j])]++);
      r.tokens[i] = t;
      r.token_weight[i] = r.weight[size_t(t) * k + j];
    }
  }
  return r;
}
template MoeRouting route_tokens<float>(const float*, int, int, int, bool, int);
template MoeRouting route_tokens<double>(const double*, int, int, int, bool, int);

template <typename T>
size_t moe_scratch_bytes(const QwenConfig& c, const TargetShard& shard, int S) {
  return arena_bytes([&](ArenaMeter& m) {
    MoeScratch<T> a;
    bind_moe_scratch(m, a, c, shard, S);
  });
}

template <typename T>
void moe_forward(kernels::Backend<T>& be, Arena& scratch, T* part, const T* h, int S, const TargetLayer<T>& L,
                 const QwenConfig& c, const TargetShard& shard, MoeRouting& routing) {
  ExecContext& ctx = be.context();
  ArenaScope scope(scratch);
  const int H = c.hidden, E = c.experts, I = c.moe_intermediate, k = c.experts_per_token;
  const bool shared = c.shared_expert_intermediate > 0;
  const int E1 = E + (shared ? 1 : 0);  // router rows, then the shared expert's gate
  using A = kernels::acc_t<T>;
  const size_t s = size_t(S);
  MoeScratch<T> a;
  ArenaBinder bind{scratch};
  bind_moe_scratch(bind, a, c, shard, S);
  // router logits [S, E1] on the backend, the choice on the host (small: S·E1 values)
  T* logits = a.logits;
  shard_linear(be, logits, h, L.router.data(), S, H, E1);
  auto route = [&](const auto* host) {
    routing = route_tokens(host, S, E, k, c.norm_topk_prob, E1);
    if (shared) {
      routing.shared_gate.resize(s);
      for (int t = 0; t < S; ++t)
        routing.shared_gate[size_t(t)] = 1.0 / (1.0 + std::exp(-double(host[size_t(t) * E1 + E])));
    }
  };
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    std::vector<T> host(s * size_t(E1));
    be.download(ctx, host.data(), logits, host.size() * sizeof(T));
    be.synchronize(ctx);
    route(host.data());
  } else {  // bf16: widened to fp32 (exact) on the device first
    std::vector<float> host(s * size_t(E1));
    be.convert_to_float(ctx, a.logits_f32, logits, host.size());
    be.download(ctx, host.data(), a.logits_f32, host.size() * sizeof(float));
    be.synchronize(ctx);
    route(host.data());
  }
  const int ic = shared ? int(shard.mlp_end - shard.mlp_begin) : 0;
  if (ic > 0) {
    // the shared expert over this rank's channels (split like a dense MLP), each token's row scaled by its gate
    T *sg = a.shared_gate, *su = a.shared_up;
    shard_linear(be, sg, h, L.gate_proj.data(), S, H, ic);
    shard_linear(be, su, h, L.up_proj.data(), S, H, ic);
    be.swiglu_forward(ctx, su, sg, su, s * size_t(ic));
    shard_linear(be, part, su, L.down_proj.data(), S, ic, H);
    // each token's row scaled by its gate, in one launch
    const std::vector<A> g(routing.shared_gate.begin(), routing.shared_gate.end());
    be.upload(ctx, a.shared_weight, g.data(), s * sizeof(A));
    be.scale_rows(ctx, part, a.shared_weight, S, H);
  } else {
    be.zero(ctx, part, sizeof(T) * s * size_t(H));
  }
  const int e0 = shard.expert_begin, ne = shard.expert_count;
  if (ne == 0) return;
  // this rank's experts' token lists, one upload
  const int64_t first = routing.expert_start[size_t(e0)], last = routing.expert_start[size_t(e0 + ne)];
  if (last == first) return;
  int32_t* rows = a.rows;
  be.upload(ctx, rows, routing.tokens.data() + first, size_t(last - first) * sizeof(int32_t));
  const std::vector<A> w(routing.token_weight.begin() + first, routing.token_weight.begin() + last);
  A* weights = a.weights;
  be.upload(ctx, weights, w.data(), w.size() * sizeof(A));
  T *xe = a.xe, *gate = a.gate, *up = a.up, *ye = a.ye;  // [n, H], [n, I] x2, [n, H] for an expert's n tokens
  const size_t ih = size_t(I) * size_t(H);
  for (int j = 0; j < ne; ++j) {
    const int e = e0 + j, n = routing.count(e);
    if (n == 0) continue;
    const int64_t at = routing.expert_start[size_t(e)];
    be.gather_rows(ctx, xe, h, rows + (at - first), n, H);
    shard_linear(be, gate, xe, L.expert_gate.data() + size_t(j) * ih, n, H, I);
    shard_linear(be, up, xe, L.expert_up.data() + size_t(j) * ih, n, H, I);
    be.swiglu_forward(ctx, up, gate, up, size_t(n) * size_t(I));
    shard_linear(be, ye, up, L.expert_down.data() + size_t(j) * ih, n, I, H);
    // weighted add back to the tokens' rows in one launch (an expert's tokens are distinct: one writer per row)
    be.scatter_add_rows(ctx, part, ye, rows + (at - first), weights + (at - first), n, H);
  }
}

#define DFLASH_TARGET_LAYERS_INSTANTIATE(T)                                                                        \
  template struct TargetLayer<T>;                                                                                  \
  template void shard_linear<T>(kernels::Backend<T>&, T*, const T*, const T*, int, int, int);                      \
  template size_t attention_scratch_bytes<T>(const QwenConfig&, const TargetShard&, int);                          \
  template void attention_forward<T>(kernels::Backend<T>&, Arena&, T*, const T*, const int32_t*, int,              \
                                     const TargetLayer<T>&, const QwenConfig&, const TargetShard&, T*, T*, int,    \
                                     const int*);                                                                  \
  template size_t gated_deltanet_scratch_bytes<T>(const QwenConfig&, const TargetShard&, int);                     \
  template void gated_deltanet_forward<T>(kernels::Backend<T>&, Arena&, T*, const T*, int, const TargetLayer<T>&,  \
                                          const QwenConfig&, const TargetShard&, T*, kernels::acc_t<T>*);  \
  template size_t moe_scratch_bytes<T>(const QwenConfig&, const TargetShard&, int);                              \
  template void moe_forward<T>(kernels::Backend<T>&, Arena&, T*, const T*, int, const TargetLayer<T>&,            \
                               const QwenConfig&, const TargetShard&, MoeRouting&);
DFLASH_TARGET_LAYERS_INSTANTIATE(float)
DFLASH_TARGET_LAYERS_INSTANTIATE(double)
DFLASH_TARGET_LAYERS_INSTANTIATE(kernels::bf16)
#undef DFLASH_TARGET_LAYERS_INSTANTIATE

}  // namespace dflash::model
