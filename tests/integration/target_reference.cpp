#include "tests/integration/target_reference.h"

#include <cmath>

#include <fmt/format.h>

#include "kernels/cpu/attention_causal.h"
#include "lib/io/safetensors.h"
#include "lib/model/qwen_config.h"

namespace dflash::test {

namespace {

using Vec = std::vector<double>;

Vec load(const io::Checkpoint& ck, const std::string& name) {
  const auto f = ck.read(name);
  return Vec(f.begin(), f.end());
}

// y[N, out] = x[N, in] · Wᵀ
Vec matmul(const Vec& x, const Vec& W, int N, int in, int out) {
  Vec y(size_t(N) * out, 0.0);
  for (int i = 0; i < N; ++i)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int k = 0; k < in; ++k) s += x[size_t(i) * in + k] * W[size_t(o) * in + k];
      y[size_t(i) * out + o] = s;
    }
  return y;
}

// RMSNorm over rows of `dim`
Vec rmsnorm(const Vec& x, const Vec& w, int dim, double eps) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / dim; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += x[r * dim + i] * x[r * dim + i];
    const double s = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * s * w[i];
  }
  return y;
}

// HF rotate_half RoPE on x[S, heads, hd] at positions 0..S-1
void rope(Vec& x, int S, int heads, int hd, double theta) {
  const int half = hd / 2;
  for (int p = 0; p < S; ++p)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double a = p * std::pow(theta, -2.0 * i / hd), c = std::cos(a), s = std::sin(a);
        double* v = &x[(size_t(p) * heads + h) * hd];
        const double x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
      }
}

}  // namespace

void reference_target_forward(const std::string& dir, const int32_t* tokens, int S,
                              const std::vector<int>& tap_layer_ids, std::vector<double>& taps,
                              std::vector<double>& final_hidden) {
  const model::QwenConfig c = model::load_qwen_config(dir);
  io::Checkpoint ck(dir);
  const int H = c.hidden, hd = c.head_dim, nq = c.heads, nkv = c.kv_heads, I = c.intermediate;
  const int n_taps = int(tap_layer_ids.size());
  const Vec emb = load(ck, "model.embed_tokens.weight");
  Vec x(size_t(S) * H);
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < H; ++j) x[size_t(i) * H + j] = emb[size_t(tokens[i]) * H + j];
  taps.assign(size_t(S) * n_taps * H, 0.0);
  for (int l = 0; l < c.layers; ++l) {
    auto w = [&](const char* what) { return load(ck, fmt::format("model.layers.{}.{}.weight", l, what)); };
    Vec h = rmsnorm(x, w("input_layernorm"), H, c.rms_norm_eps);
    Vec q = matmul(h, w("self_attn.q_proj"), S, H, nq * hd);
    Vec k = matmul(h, w("self_attn.k_proj"), S, H, nkv * hd);
    Vec v = matmul(h, w("self_attn.v_proj"), S, H, nkv * hd);
    q = rmsnorm(q, w("self_attn.q_norm"), hd, c.rms_norm_eps);
    k = rmsnorm(k, w("self_attn.k_norm"), hd, c.rms_norm_eps);
    rope(q, S, nq, hd, c.rope_theta);
    rope(k, S, nkv, hd, c.rope_theta);
    Vec attn(size_t(S) * nq * hd);
    cpu::attention_causal_reference<double>(attn.data(), q.data(), k.data(), v.data(), S, nq, nkv, hd);
    const Vec o = matmul(attn, w("self_attn.o_proj"), S, nq * hd, H);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    h = rmsnorm(x, w("post_attention_layernorm"), H, c.rms_norm_eps);
    const Vec g = matmul(h, w("mlp.gate_proj"), S, H, I);
    Vec u = matmul(h, w("mlp.up_proj"), S, H, I);
    for (size_t i = 0; i < u.size(); ++i) u[i] *= g[i] / (1.0 + std::exp(-g[i]));
    const Vec d = matmul(u, w("mlp.down_proj"), S, I, H);
    for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
    for (int t = 0; t < n_taps; ++t) {
      if (tap_layer_ids[size_t(t)] != l) continue;
      for (int i = 0; i < S; ++i)
        for (int j = 0; j < H; ++j) taps[(size_t(i) * n_taps + t) * H + j] = x[size_t(i) * H + j];
    }
  }
  final_hidden = rmsnorm(x, load(ck, "model.norm.weight"), H, c.rms_norm_eps);
}

}  // namespace dflash::test
