#include "lib/model/target.h"

#include <algorithm>

#include <fmt/format.h>

#include "lib/core/error.h"
#include "lib/core/timer.h"
#include "lib/model/target_layers.h"

namespace dflash::model {

std::string target_layer_tensor(const QwenConfig& c, int l, const std::string& what) {
  return fmt::format("{}layers.{}.{}.weight", c.weight_prefix, l, what);
}

namespace {

// Qwen3.5 RMSNorm computes x̂ · (1 + w): fold the 1 in once at load
void fold_norm_offset(const QwenConfig& c, std::vector<float>& w) {
  if (!c.hybrid) return;
  for (float& x : w) x += 1.f;
}

}  // namespace

TargetModel::TargetModel(const std::string& model_dir, comm::Transport& tp, TargetOptions options)
    : dir_(model_dir),
      tp_(tp),
      options_(options),
      backend_(options.backend ? options.backend : kernels::make_cpu_backend<float>({options.attention_block})),
      config_(load_qwen_config(model_dir)),
      shard_(plan_target_shard(config_, tp.size(), tp.rank(), options.mlp_grain)),
      ckpt_(model_dir) {
  const int64_t H = config_.hidden;
  ckpt_.expect(config_.weight_prefix + "embed_tokens.weight", {config_.vocab, H});
  std::vector<float> final_norm = ckpt_.read(ckpt_.expect(config_.weight_prefix + "norm.weight", {H}).name);
  fold_norm_offset(config_, final_norm);
  final_norm_ = upload(final_norm);
  layers_.resize(size_t(config_.layers));
  for (int l = 0; l < config_.layers; ++l) load_layer(l);
}

TargetWeight TargetModel::upload(const std::vector<float>& host) {
  TargetWeight w;
  w.count = host.size();
  w.buffer = Buffer(backend_->memory(), host.size() * sizeof(float));
  backend_->upload(backend_->context(), w.buffer.data(), host.data(), host.size() * sizeof(float));
  backend_->synchronize(backend_->context());  // `host` may be freed as soon as this returns
  return w;
}

// Slices of layer l's tensors: rows [b, e) of a tensor (dim 0; any rank) or columns [b, e) of a 2-D tensor.
namespace {
struct LayerReader {
  const io::Checkpoint& ckpt;
  const QwenConfig& c;
  int l;
  void rows(const std::string& what, std::vector<int64_t> shape, int64_t b, int64_t e, std::vector<float>& out) const {
    const std::string n = target_layer_tensor(c, l, what);
    ckpt.expect(n, shape);
    int64_t row = 1;
    for (size_t i = 1; i < shape.size(); ++i) row *= shape[i];
    out.resize(size_t((e - b) * row));
    ckpt.read_rows(n, b, e, out.data());
  }
  // rows of several ranges of one tensor, concatenated in order
  void row_ranges(const std::string& what, std::vector<int64_t> shape,
                  std::initializer_list<std::pair<int64_t, int64_t>> ranges, std::vector<float>& out) const {
    out.clear();
    std::vector<float> part;
    for (auto [b, e] : ranges) {
      rows(what, shape, b, e, part);
      out.insert(out.end(), part.begin(), part.end());
    }
  }
  void cols(const std::string& what, std::vector<int64_t> shape, int64_t b, int64_t e, std::vector<float>& out) const {
    const std::string n = target_layer_tensor(c, l, what);
    ckpt.expect(n, shape);
    out.resize(size_t(shape[0] * (e - b)));
    ckpt.read_cols(n, b, e, out.data());
  }
};
}  // namespace

void TargetModel::load_layer(int l) {
  const QwenConfig& c = config_;
  const int64_t H = c.hidden;
  TargetLayer& L = layers_[size_t(l)];
  const LayerReader r{ckpt_, c, l};
  std::vector<float> input_norm, post_norm, wgate, wup, wdown;
  r.rows("input_layernorm", {H}, 0, H, input_norm);
  r.rows("post_attention_layernorm", {H}, 0, H, post_norm);
  fold_norm_offset(c, input_norm);
  fold_norm_offset(c, post_norm);
  L.input_norm = upload(input_norm);
  L.post_norm = upload(post_norm);
  L.linear = c.is_linear(l);
  if (L.linear) {
    load_linear_attention(l, L);
  } else {
    load_attention(l, L);
  }
  r.rows("mlp.gate_proj", {c.intermediate, H}, shard_.mlp_begin, shard_.mlp_end, wgate);
  L.wgate = upload(wgate);
  r.rows("mlp.up_proj", {c.intermediate, H}, shard_.mlp_begin, shard_.mlp_end, wup);
  L.wup = upload(wup);
  r.cols("mlp.down_proj", {H, c.intermediate}, shard_.mlp_begin, shard_.mlp_end, wdown);
  L.wdown = upload(wdown);
}

void TargetModel::load_attention(int l, TargetLayer& L) {
  const QwenConfig& c = config_;
  const int64_t H = c.hidden, hd = c.head_dim;
  const int64_t qd = int64_t(shard_.q_count) * hd, kvd = int64_t(shard_.kv_count) * hd;
  const LayerReader r{ckpt_, c, l};
  std::vector<float> w;
  r.rows("self_attn.q_norm", {hd}, 0, hd, w);
  fold_norm_offset(c, w);
  L.q_norm = upload(w);
  r.rows("self_attn.k_norm", {hd}, 0, hd, w);
  fold_norm_offset(c, w);
  L.k_norm = upload(w);
  const int64_t q0 = int64_t(shard_.q_begin) * hd, kv0 = int64_t(shard_.kv_begin) * hd;
  // hybrid q_proj: per head [query | output gate], 2·head_dim rows each
  const int64_t qf = c.hybrid ? 2 : 1;
  r.rows("self_attn.q_proj", {qf * c.heads * hd, H}, qf * q0, qf * (q0 + qd), w);
  L.wq = upload(w);
  r.rows("self_attn.k_proj", {c.kv_heads * hd, H}, kv0, kv0 + kvd, w);
  L.wk = upload(w);
  r.rows("self_attn.v_proj", {c.kv_heads * hd, H}, kv0, kv0 + kvd, w);
  L.wv = upload(w);
  r.cols("self_attn.o_proj", {H, c.heads * hd}, q0, q0 + qd, w);
  L.wo = upload(w);
}

void TargetModel::load_linear_attention(int l, TargetLayer& L) {
  const QwenConfig& c = config_;
  const int64_t H = c.hidden, dk = c.linear_k_dim, dv = c.linear_v_dim, K = c.conv_kernel;
  const int64_t key_dim = c.linear_k_heads * dk, value_dim = c.linear_v_heads * dv, conv_dim = c.linear_conv_dim();
  const GroupedSplit& s = shard_.linear;
  const int64_t k0 = int64_t(s.group_begin) * dk, k1 = k0 + int64_t(s.group_count) * dk;
  const int64_t v0 = int64_t(s.member_begin) * dv, v1 = v0 + int64_t(s.member_count) * dv;
  const int64_t h0 = s.member_begin, h1 = s.member_begin + s.member_count;
  const LayerReader r{ckpt_, c, l};
  std::vector<float> w;
  // channels of in_proj_qkv and conv1d: q [0, key_dim), k [key_dim, 2·key_dim), v [2·key_dim, conv_dim)
  const std::initializer_list<std::pair<int64_t, int64_t>> channels = {
      {k0, k1}, {key_dim + k0, key_dim + k1}, {2 * key_dim + v0, 2 * key_dim + v1}};
  r.row_ranges("linear_attn.in_proj_qkv", {conv_dim, H}, channels, w);
  L.w_qkv = upload(w);
  r.row_ranges("linear_attn.conv1d", {conv_dim, 1, K}, channels, w);
  L.conv = upload(w);
  r.rows("linear_attn.in_proj_z", {value_dim, H}, v0, v1, w);
  L.w_z = upload(w);
  r.rows("linear_attn.in_proj_b", {c.linear_v_heads, H}, h0, h1, w);
  L.w_b = upload(w);
  r.rows("linear_attn.in_proj_a", {c.linear_v_heads, H}, h0, h1, w);
  L.w_a = upload(w);
  // A_log and dt_bias are parameters without the ".weight" suffix
  for (auto [name, out] : {std::pair{"A_log", &L.a_log}, std::pair{"dt_bias", &L.dt_bias}}) {
    const std::string n = fmt::format("{}layers.{}.linear_attn.{}", c.weight_prefix, l, name);
    ckpt_.expect(n, {c.linear_v_heads});
    w.resize(size_t(h1 - h0));
    ckpt_.read_rows(n, h0, h1, w.data());
    *out = upload(w);
  }
  r.rows("linear_attn.norm", {dv}, 0, dv, w);
  L.gated_norm = upload(w);
  r.cols("linear_attn.out_proj", {H, value_dim}, v0, v1, w);
  L.w_out = upload(w);
}

size_t TargetModel::weight_bytes() const {
  size_t n = final_norm_.size();
  for (const auto& L : layers_) {
    n += L.input_norm.size() + L.wq.size() + L.wk.size() + L.wv.size() + L.q_norm.size() + L.k_norm.size() +
         L.wo.size() + L.post_norm.size() + L.wgate.size() + L.wup.size() + L.wdown.size();
    n += L.w_qkv.size() + L.conv.size() + L.w_z.size() + L.w_b.size() + L.w_a.size() + L.a_log.size() +
         L.dt_bias.size() + L.gated_norm.size() + L.w_out.size();
  }
  return n * sizeof(float);
}

void TargetModel::timed_allreduce(float* part, size_t n) {
  Timer t;
  if (backend_->memory() == MemoryKind::host) {
    tp_.allreduce_sum(part, n);
  } else {
    // device backend: staged through the host (download → all-reduce → upload). The NCCL transport could take the
    // device pointer directly; that path is not wired for the target yet.
    ExecContext& ctx = backend_->context();
    host_stage_.resize(n);
    backend_->download(ctx, host_stage_.data(), part, n * sizeof(float));
    tp_.allreduce_sum(host_stage_.data(), n);
    backend_->upload(ctx, part, host_stage_.data(), n * sizeof(float));
  }
  stats_.allreduce_seconds += t.seconds();
  ++stats_.allreduces;
}

void TargetModel::reserve_activations(size_t bytes) {
  if (activations_.capacity() >= bytes) return;
  // grown by at least half: a decode loop whose blocks vary in size reallocates rarely
  activations_ = Arena(backend_->memory(), std::max(bytes, activations_.capacity() * 3 / 2), "target activations");
}

void TargetModel::forward(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps,
                          float* final_hidden) {
  run(tokens, S, tap_layer_ids, taps, final_hidden, nullptr);
}

void TargetModel::forward_cached(const int32_t* tokens, int n, TargetCache& cache, float* final_hidden) {
  forward_cached(tokens, n, cache, {}, nullptr, final_hidden);
}

void TargetModel::forward_cached(const int32_t* tokens, int n, TargetCache& cache,
                                 const std::vector<int>& tap_layer_ids, float* taps, float* final_hidden) {
  prepare_cache(cache, n, "forward_cached");
  run(tokens, n, tap_layer_ids, taps, final_hidden, &cache);
  cache.length += n;
}

void TargetModel::forward_tree(const int32_t* tokens, const int* parents, int n, TargetCache& cache,
                               const std::vector<int>& tap_layer_ids, float* taps, float* final_hidden) {
  DFLASH_CHECK(backend_->memory() == MemoryKind::host,
               "target forward_tree: tree verification runs the CPU kernel kernels/cpu/attention_tree on host memory; "
               "this target runs on the {} backend (load the target with the CPU backend for tree verification)",
               backend_->name());
  DFLASH_CHECK(!config_.hybrid, "target forward_tree: {} has Gated DeltaNet layers, whose recurrent state cannot "
               "branch within one forward; tree verification needs a dense target", dir_);
  DFLASH_CHECK(n >= 1 && parents[0] == -1, "target forward_tree: node 0 must be the root (parent -1)");
  for (int i = 1; i < n; ++i)
    DFLASH_CHECK(parents[i] >= 0 && parents[i] < i, "target forward_tree: node {} has parent {}, outside [0, {})", i,
                 parents[i], i);
  prepare_cache(cache, n, "forward_tree");
  run(tokens, n, tap_layer_ids, taps, final_hidden, &cache, parents);
  cache.length += n;
}

void TargetModel::run(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps,
                      float* final_hidden, TargetCache* cache, const int* tree_parents) {
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
  kernels::Backend<float>& be = *backend_;
  ExecContext& ctx = be.context();
  const int H = c.hidden, ic = int(shard_.mlp_end - shard_.mlp_begin);
  const int n_taps = int(tap_layer_ids.size());
  const float eps = float(c.rms_norm_eps);
  const int past = cache ? cache->length : 0;
  const size_t s = size_t(S), sh = s * size_t(H);

  // one arena for the forward: the arrays below, then the token mixer's scratch (rewound after each layer)
  const size_t mixer = std::max(attention_scratch_bytes(c, shard_, S),
                                c.hybrid ? gated_deltanet_scratch_bytes(c, shard_, S) : size_t(0));
  reserve_activations(3 * Arena::footprint(sh * sizeof(float)) + 2 * Arena::footprint(s * size_t(ic) * sizeof(float)) +
                      Arena::footprint(s * sizeof(float)) + Arena::footprint(s * sizeof(int32_t)) + mixer);
  activations_.reset();
  float* x = activations_.alloc<float>(sh);     // [S, H] residual stream, identical on every TP rank
  float* h = activations_.alloc<float>(sh);     // [S, H] normed input of the current sub-block
  float* part = activations_.alloc<float>(sh);  // [S, H] this rank's row-parallel partial sum, then the full sum
  float* gate = activations_.alloc<float>(s * size_t(ic));
  float* up = activations_.alloc<float>(s * size_t(ic));  // up then holds silu(gate)·up
  float* rstd = activations_.alloc<float>(s);
  int32_t* pos = activations_.alloc<int32_t>(s);

  std::vector<int32_t> host_pos(s);
  for (int i = 0; i < S; ++i) host_pos[size_t(i)] = past + i;
  if (tree_parents) {  // a tree node sits at past + its depth
    for (int i = 0; i < S; ++i)
      host_pos[size_t(i)] = tree_parents[i] < 0 ? past : host_pos[size_t(tree_parents[i])] + 1;
  }
  be.upload(ctx, pos, host_pos.data(), s * sizeof(int32_t));

  // embedding rows from the mmapped checkpoint (host), one [S, H] upload
  const std::string embed = c.weight_prefix + "embed_tokens.weight";
  host_stage_.resize(sh);
  for (int i = 0; i < S; ++i) ckpt_.read_rows(embed, tokens[i], tokens[i] + 1, &host_stage_[size_t(i) * H]);
  be.upload(ctx, x, host_stage_.data(), sh * sizeof(float));

  for (int l = 0; l < c.layers; ++l) {
    const TargetLayer& L = layers_[size_t(l)];
    // token mixer: column-parallel in-projections over this rank's heads, row-parallel out-projection + all-reduce
    be.rmsnorm_forward(ctx, h, rstd, x, L.input_norm.data(), S, H, eps);
    const size_t li = size_t(l);
    Timer part_timer;  // on a device backend: launch time (plus any wait for the stream)
    if (L.linear) {
      gated_deltanet_forward(be, activations_, part, h, S, L, c, shard_,
                             cache ? cache->conv_tail[li].as<float>() : nullptr,
                             cache ? cache->delta_state[li].as<float>() : nullptr);
    } else {
      attention_forward(be, activations_, part, h, pos, S, L, c, shard_, cache ? cache->keys[li].as<float>() : nullptr,
                        cache ? cache->values[li].as<float>() : nullptr, past, tree_parents);
    }
    (L.linear ? stats_.linear_attention_seconds : stats_.full_attention_seconds) += part_timer.seconds();
    timed_allreduce(part, sh);
    be.residual_forward(ctx, x, x, part, sh);

    // MLP: column-parallel gate/up over this rank's channels, row-parallel down + all-reduce
    part_timer.reset();
    be.rmsnorm_forward(ctx, h, rstd, x, L.post_norm.data(), S, H, eps);
    shard_linear(be, gate, h, L.wgate.data(), S, H, ic);
    shard_linear(be, up, h, L.wup.data(), S, H, ic);
    be.swiglu_forward(ctx, up, gate, up, s * size_t(ic));
    shard_linear(be, part, up, L.wdown.data(), S, ic, H);
    stats_.mlp_seconds += part_timer.seconds();
    timed_allreduce(part, sh);
    be.residual_forward(ctx, x, x, part, sh);

    for (int t = 0; t < n_taps; ++t) {
      if (tap_layer_ids[size_t(t)] != l || !taps) continue;
      be.download(ctx, host_stage_.data(), x, sh * sizeof(float));
      for (int i = 0; i < S; ++i) {
        std::copy_n(&host_stage_[size_t(i) * H], H, taps + (size_t(i) * n_taps + t) * H);
      }
    }
  }
  if (final_hidden) {
    be.rmsnorm_forward(ctx, h, rstd, x, final_norm_.data(), S, H, eps);
    be.download(ctx, final_hidden, h, sh * sizeof(float));
  }
  be.synchronize(ctx);
  ++stats_.forwards;
  stats_.tokens += S;
  stats_.forward_seconds += timer.seconds();
}

void TargetCache::truncate(int new_length) {
  DFLASH_CHECK(new_length >= 0 && new_length <= length, "target cache: cannot truncate to {} positions: it holds {}",
               new_length, length);
  length = new_length;
}

namespace {

// floats of the per-layer cache arrays on this rank
size_t kv_row_floats(const TargetShard& shard, const QwenConfig& c) { return size_t(shard.kv_count) * c.head_dim; }
size_t conv_tail_floats(const TargetShard& shard, const QwenConfig& c) {
  const size_t qkd = size_t(shard.linear.group_count) * c.linear_k_dim, vd = size_t(shard.linear.member_count) * c.linear_v_dim;
  return size_t(c.conv_kernel - 1) * (2 * qkd + vd);
}
size_t delta_state_floats(const TargetShard& shard, const QwenConfig& c) {
  return size_t(shard.linear.member_count) * c.linear_k_dim * c.linear_v_dim;
}

}  // namespace

void TargetModel::prepare_cache(TargetCache& cache, int n, const char* what) {
  kernels::Backend<float>& be = *backend_;
  ExecContext& ctx = be.context();
  const size_t L = size_t(config_.layers), row = kv_row_floats(shard_, config_);
  if (cache.keys.size() != L) {  // a fresh sequence: per-layer buffers, the recurrent part zeros
    DFLASH_CHECK(cache.length == 0 && cache.keys.empty(), "target {}: a cache at length {} without per-layer state for "
                 "this model's {} layers", what, cache.length, L);
    cache.capacity = 0;
    cache.keys.resize(L);
    cache.values.resize(L);
    cache.conv_tail.resize(L);
    cache.delta_state.resize(L);
    for (size_t l = 0; l < L; ++l) {
      if (!layers_[l].linear) continue;
      const size_t tail = conv_tail_floats(shard_, config_), state = delta_state_floats(shard_, config_);
      cache.conv_tail[l] = Buffer(be.memory(), tail * sizeof(float));
      cache.delta_state[l] = Buffer(be.memory(), state * sizeof(float));
      be.zero(ctx, cache.conv_tail[l].data(), tail * sizeof(float));
      be.zero(ctx, cache.delta_state[l].data(), state * sizeof(float));
    }
  }
  for (size_t l = 0; l < L; ++l) {
    for (const Buffer* b : {&cache.keys[l], &cache.conv_tail[l]}) {
      DFLASH_CHECK(b->data() == nullptr || b->kind() == be.memory(), "target {}: the cache is in {} memory, this "
                   "target runs on the {} backend (a cache belongs to the target that filled it)", what,
                   memory_kind_name(b->kind()), be.name());
    }
  }
  const int need = cache.length + n;
  if (need <= cache.capacity) return;
  // geometric growth: a decode appends a block at a time, so the copies add up to O(final length)
  const int capacity = std::max(need, cache.capacity * 2);
  const size_t bytes = size_t(capacity) * row * sizeof(float), kept = size_t(cache.length) * row * sizeof(float);
  for (size_t l = 0; l < L; ++l) {
    if (layers_[l].linear) continue;
    for (Buffer* b : {&cache.keys[l], &cache.values[l]}) {
      Buffer grown(be.memory(), bytes);
      if (kept > 0) be.copy(ctx, grown.data(), b->data(), kept);
      *b = std::move(grown);
    }
  }
  cache.capacity = capacity;
}

TargetCache TargetModel::copy_cache(const TargetCache& cache) const {
  kernels::Backend<float>& be = *backend_;
  ExecContext& ctx = be.context();
  TargetCache out;
  out.length = cache.length;
  out.capacity = cache.keys.empty() ? 0 : cache.length;
  const size_t kept = size_t(cache.length) * kv_row_floats(shard_, config_) * sizeof(float);
  auto copy_of = [&](const Buffer& b, size_t bytes) {
    if (b.data() == nullptr) return Buffer();
    Buffer c(be.memory(), bytes);
    if (bytes > 0) be.copy(ctx, c.data(), b.data(), bytes);
    return c;
  };
  for (size_t l = 0; l < cache.keys.size(); ++l) {
    const bool attention = !layers_[l].linear;
    out.keys.push_back(attention ? copy_of(cache.keys[l], kept) : Buffer());
    out.values.push_back(attention ? copy_of(cache.values[l], kept) : Buffer());
    out.conv_tail.push_back(copy_of(cache.conv_tail[l], cache.conv_tail[l].bytes()));
    out.delta_state.push_back(copy_of(cache.delta_state[l], cache.delta_state[l].bytes()));
  }
  be.synchronize(ctx);
  return out;
}

void TargetModel::save_recurrent(const TargetCache& cache, TargetRecurrentState& state) const {
  kernels::Backend<float>& be = *backend_;
  ExecContext& ctx = be.context();
  if (!config_.hybrid || cache.conv_tail.empty()) {
    state = {};
    return;
  }
  state.conv_tail.resize(cache.conv_tail.size());
  state.delta_state.resize(cache.delta_state.size());
  auto save = [&](Buffer& into, const Buffer& from) {
    if (into.bytes() != from.bytes() || into.kind() != from.kind()) into = Buffer(from.kind(), from.bytes());
    if (from.bytes() > 0) be.copy(ctx, into.data(), from.data(), from.bytes());
  };
  for (size_t l = 0; l < cache.conv_tail.size(); ++l) {
    save(state.conv_tail[l], cache.conv_tail[l]);
    save(state.delta_state[l], cache.delta_state[l]);
  }
}

void TargetModel::restore_recurrent(TargetCache& cache, const TargetRecurrentState& state) const {
  if (state.conv_tail.empty()) return;
  kernels::Backend<float>& be = *backend_;
  ExecContext& ctx = be.context();
  DFLASH_CHECK(state.conv_tail.size() == cache.conv_tail.size(), "target restore_recurrent: a snapshot of {} layers "
               "for a cache of {}", state.conv_tail.size(), cache.conv_tail.size());
  auto restore = [&](Buffer& into, const Buffer& from) {
    DFLASH_CHECK(into.bytes() == from.bytes(), "target restore_recurrent: a snapshot array of {} bytes for one of {}",
                 from.bytes(), into.bytes());
    if (from.bytes() > 0) be.copy(ctx, into.data(), from.data(), from.bytes());
  };
  for (size_t l = 0; l < cache.conv_tail.size(); ++l) {
    restore(cache.conv_tail[l], state.conv_tail[l]);
    restore(cache.delta_state[l], state.delta_state[l]);
  }
}

void TargetModel::keep_cache_path(TargetCache& cache, int past, const std::vector<int>& path) const {
  const int m = int(path.size());
  DFLASH_CHECK(past >= 0 && past + m <= cache.length, "target keep_cache_path: {} kept nodes after {} positions, "
               "the cache holds {}", m, past, cache.length);
  kernels::Backend<float>& be = *backend_;
  ExecContext& ctx = be.context();
  const size_t row = kv_row_floats(shard_, config_) * sizeof(float);
  for (size_t l = 0; l < cache.keys.size(); ++l) {
    if (layers_[l].linear) continue;
    // row past + d ← row past + path[d]; path[d] ≥ d, so the rows read were not yet overwritten, and a row never
    // overlaps another (one backend copy per row)
    for (int d = 0; d < m; ++d) {
      DFLASH_CHECK(path[size_t(d)] >= d && past + path[size_t(d)] < cache.length,
                   "target keep_cache_path: node {} at depth {} (nodes are numbered after their ancestors)",
                   path[size_t(d)], d);
      const size_t from = size_t(past + path[size_t(d)]) * row, to = size_t(past + d) * row;
      if (from == to) continue;
      be.copy(ctx, cache.keys[l].as<char>() + to, cache.keys[l].as<char>() + from, row);
      be.copy(ctx, cache.values[l].as<char>() + to, cache.values[l].as<char>() + from, row);
    }
  }
  cache.length = past + m;
}

std::vector<float> TargetModel::read_cache(const TargetCache& cache, int layer, TargetCachePart part) const {
  DFLASH_CHECK(layer >= 0 && layer < config_.layers, "target read_cache: layer {} outside [0, {})", layer,
               config_.layers);
  if (cache.keys.empty()) return {};
  const size_t l = size_t(layer);
  const Buffer* b = nullptr;
  size_t floats = 0;
  switch (part) {
    case TargetCachePart::keys:
    case TargetCachePart::values:
      if (layers_[l].linear) return {};
      b = part == TargetCachePart::keys ? &cache.keys[l] : &cache.values[l];
      floats = size_t(cache.length) * kv_row_floats(shard_, config_);
      break;
    case TargetCachePart::conv_tail:
    case TargetCachePart::delta_state:
      if (!layers_[l].linear) return {};
      b = part == TargetCachePart::conv_tail ? &cache.conv_tail[l] : &cache.delta_state[l];
      floats = b->bytes() / sizeof(float);
      break;
  }
  std::vector<float> host(floats);
  kernels::Backend<float>& be = *backend_;
  if (floats > 0) be.download(be.context(), host.data(), b->data(), floats * sizeof(float));
  be.synchronize(be.context());
  return host;
}

TargetVocab load_target_vocab(const std::string& model_dir) {
  const QwenConfig c = load_qwen_config(model_dir);
  io::Checkpoint ckpt(model_dir);
  TargetVocab v;
  v.vocab = c.vocab;
  v.hidden = c.hidden;
  v.embedding = ckpt.read(ckpt.expect(c.weight_prefix + "embed_tokens.weight", {c.vocab, c.hidden}).name);
  v.tied = c.tie_word_embeddings;
  if (!v.tied) {
    DFLASH_CHECK(ckpt.has("lm_head.weight"),
                 "checkpoint {}: tie_word_embeddings is false but lm_head.weight is missing", model_dir);
    v.lm_head_untied = ckpt.read(ckpt.expect("lm_head.weight", {c.vocab, c.hidden}).name);
  }
  return v;
}

}  // namespace dflash::model
