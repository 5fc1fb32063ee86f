#include "lib/model/target.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/cpu/attention_causal.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"

namespace dflash::model {

namespace {

std::string layer_name(int l, const char* what) { return fmt::format("model.layers.{}.{}.weight", l, what); }

// y[N, out] (=) x[N, in] · Wᵀ, tolerating an empty shard (out = 0) or an empty input (in = 0 → zeros)
void linear(float* y, const float* x, const float* W, int N, int in, int out) {
  if (N == 0 || out == 0) return;
  if (in == 0) {
    std::fill(y, y + size_t(N) * out, 0.f);
    return;
  }
  cpu::linear_forward<float>(y, x, W, N, in, out);
}

}  // namespace

TargetModel::TargetModel(const std::string& model_dir, comm::Transport& tp, TargetOptions options)
    : dir_(model_dir),
      tp_(tp),
      options_(options),
      config_(load_qwen_config(model_dir)),
      shard_(plan_target_shard(config_, tp.size(), tp.rank(), options.mlp_grain)),
      ckpt_(model_dir) {
  const int64_t H = config_.hidden;
  ckpt_.expect("model.embed_tokens.weight", {config_.vocab, H});
  final_norm_ = ckpt_.read(ckpt_.expect("model.norm.weight", {H}).name);
  layers_.resize(size_t(config_.layers));
  for (int l = 0; l < config_.layers; ++l) load_layer(l);
}

void TargetModel::load_layer(int l) {
  const QwenConfig& c = config_;
  const int64_t H = c.hidden, hd = c.head_dim;
  const int64_t qd = int64_t(shard_.q_count) * hd, kvd = int64_t(shard_.kv_count) * hd;
  TargetLayer& L = layers_[size_t(l)];
  auto rows = [&](const char* what, std::vector<int64_t> shape, int64_t b, int64_t e, std::vector<float>& out) {
    const std::string n = layer_name(l, what);
    ckpt_.expect(n, shape);
    out.resize(size_t((e - b) * (shape.size() > 1 ? shape[1] : 1)));
    ckpt_.read_rows(n, b, e, out.data());
  };
  auto cols = [&](const char* what, std::vector<int64_t> shape, int64_t b, int64_t e, std::vector<float>& out) {
    const std::string n = layer_name(l, what);
    ckpt_.expect(n, shape);
    out.resize(size_t(shape[0] * (e - b)));
    ckpt_.read_cols(n, b, e, out.data());
  };
  rows("input_layernorm", {H}, 0, H, L.input_norm);
  rows("post_attention_layernorm", {H}, 0, H, L.post_norm);
  rows("self_attn.q_norm", {hd}, 0, hd, L.q_norm);
  rows("self_attn.k_norm", {hd}, 0, hd, L.k_norm);
  const int64_t q0 = int64_t(shard_.q_begin) * hd, kv0 = int64_t(shard_.kv_begin) * hd;
  rows("self_attn.q_proj", {c.heads * hd, H}, q0, q0 + qd, L.wq);
  rows("self_attn.k_proj", {c.kv_heads * hd, H}, kv0, kv0 + kvd, L.wk);
  rows("self_attn.v_proj", {c.kv_heads * hd, H}, kv0, kv0 + kvd, L.wv);
  cols("self_attn.o_proj", {H, c.heads * hd}, q0, q0 + qd, L.wo);
  rows("mlp.gate_proj", {c.intermediate, H}, shard_.mlp_begin, shard_.mlp_end, L.wgate);
  rows("mlp.up_proj", {c.intermediate, H}, shard_.mlp_begin, shard_.mlp_end, L.wup);
  cols("mlp.down_proj", {H, c.intermediate}, shard_.mlp_begin, shard_.mlp_end, L.wdown);
}

size_t TargetModel::weight_bytes() const {
  size_t n = final_norm_.size();
  for (const auto& L : layers_) {
    n += L.input_norm.size() + L.wq.size() + L.wk.size() + L.wv.size() + L.q_norm.size() + L.k_norm.size() +
         L.wo.size() + L.post_norm.size() + L.wgate.size() + L.wup.size() + L.wdown.size();
  }
  return n * sizeof(float);
}

void TargetModel::timed_allreduce(float* data, size_t n) {
  Timer t;
  tp_.allreduce_sum(data, n);
  stats_.allreduce_seconds += t.seconds();
  ++stats_.allreduces;
}

void TargetModel::forward(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps,
                          float* final_hidden) {
  const QwenConfig& c = config_;
  DFLASH_CHECK(S >= 1, "target forward: sequence length {} must be ≥ 1", S);
  for (int id : tap_layer_ids) {
    DFLASH_CHECK(id >= 0 && id < c.layers, "target forward: tap layer id {} outside [0, {}) (num_hidden_layers)",
                 id, c.layers);
  }
  for (int i = 0; i < S; ++i) {
    DFLASH_CHECK(tokens[i] >= 0 && tokens[i] < c.vocab, "target forward: token {} at position {} outside [0, {})",
                 tokens[i], i, c.vocab);
  }
  Timer timer;
  const int H = c.hidden, hd = c.head_dim, qh = shard_.q_count, kvh = shard_.kv_count;
  const int qd = qh * hd, kvd = kvh * hd, ic = int(shard_.mlp_end - shard_.mlp_begin);
  const int n_taps = int(tap_layer_ids.size());
  const float eps = float(c.rms_norm_eps);

  std::vector<float> x(size_t(S) * H);      // [S, H] residual stream, identical on every TP rank
  std::vector<float> h(size_t(S) * H);      // [S, H] normed input of the current sub-block
  std::vector<float> part(size_t(S) * H);   // [S, H] this rank's row-parallel partial sum, then the full sum
  std::vector<float> q(size_t(S) * qd), k(size_t(S) * kvd), v(size_t(S) * kvd), attn(size_t(S) * qd);
  std::vector<float> gate(size_t(S) * ic), up(size_t(S) * ic);  // up then holds silu(gate)·up
  std::vector<float> rstd(size_t(S) * std::max({qh, kvh, 1}));
  std::vector<int> pos(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) pos[size_t(i)] = i;

  for (int i = 0; i < S; ++i) ckpt_.read_rows("model.embed_tokens.weight", tokens[i], tokens[i] + 1, &x[size_t(i) * H]);

  for (int l = 0; l < c.layers; ++l) {
    const TargetLayer& L = layers_[size_t(l)];
    // attention: column-parallel q/k/v over this rank's heads, row-parallel o + all-reduce
    cpu::rmsnorm_forward<float>(h.data(), rstd.data(), x.data(), L.input_norm.data(), S, H, eps);
    linear(q.data(), h.data(), L.wq.data(), S, H, qd);
    linear(k.data(), h.data(), L.wk.data(), S, H, kvd);
    linear(v.data(), h.data(), L.wv.data(), S, H, kvd);
    cpu::rmsnorm_forward<float>(q.data(), rstd.data(), q.data(), L.q_norm.data(), S * qh, hd, eps);
    cpu::rmsnorm_forward<float>(k.data(), rstd.data(), k.data(), L.k_norm.data(), S * kvh, hd, eps);
    cpu::rope_forward<float>(q.data(), q.data(), pos.data(), S, qh, hd, c.rope_theta);
    cpu::rope_forward<float>(k.data(), k.data(), pos.data(), S, kvh, hd, c.rope_theta);
    // local Q head j belongs to global KV head (q_begin + j) / g, i.e. local KV head j / (qh / kvh) — true for both
    // the whole-group split (qh = kvh·g) and replication (kvh = 1)
    cpu::attention_causal_forward<float>(attn.data(), q.data(), k.data(), v.data(), S, qh, kvh, hd,
                                         options_.attention_block);
    linear(part.data(), attn.data(), L.wo.data(), S, qd, H);
    timed_allreduce(part.data(), part.size());
    cpu::residual_forward<float>(x.data(), x.data(), part.data(), x.size());

    // MLP: column-parallel gate/up over this rank's channels, row-parallel down + all-reduce
    cpu::rmsnorm_forward<float>(h.data(), rstd.data(), x.data(), L.post_norm.data(), S, H, eps);
    linear(gate.data(), h.data(), L.wgate.data(), S, H, ic);
    linear(up.data(), h.data(), L.wup.data(), S, H, ic);
    cpu::swiglu_forward<float>(up.data(), gate.data(), up.data(), up.size());
    linear(part.data(), up.data(), L.wdown.data(), S, ic, H);
    timed_allreduce(part.data(), part.size());
    cpu::residual_forward<float>(x.data(), x.data(), part.data(), x.size());

    for (int t = 0; t < n_taps; ++t) {
      if (tap_layer_ids[size_t(t)] != l || !taps) continue;
      for (int i = 0; i < S; ++i) {
        std::copy_n(&x[size_t(i) * H], H, taps + (size_t(i) * n_taps + t) * H);
      }
    }
  }
  if (final_hidden) cpu::rmsnorm_forward<float>(final_hidden, rstd.data(), x.data(), final_norm_.data(), S, H, eps);
  ++stats_.forwards;
  stats_.tokens += S;
  stats_.forward_seconds += timer.seconds();
}

TargetVocab load_target_vocab(const std::string& model_dir) {
  const QwenConfig c = load_qwen_config(model_dir);
  io::Checkpoint ckpt(model_dir);
  TargetVocab v;
  v.vocab = c.vocab;
  v.hidden = c.hidden;
  v.embedding = ckpt.read(ckpt.expect("model.embed_tokens.weight", {c.vocab, c.hidden}).name);
  v.tied = c.tie_word_embeddings;
  if (!v.tied) {
    DFLASH_CHECK(ckpt.has("lm_head.weight"),
                 "checkpoint {}: tie_word_embeddings is false but lm_head.weight is missing", model_dir);
    v.lm_head_untied = ckpt.read(ckpt.expect("lm_head.weight", {c.vocab, c.hidden}).name);
  }
  return v;
}

}  // namespace dflash::model
