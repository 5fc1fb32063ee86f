#include "lib/model/target.h"

#include <algorithm>
#include <type_traits>

#include <fmt/format.h>

#include "lib/core/arena_plan.h"
#include "lib/core/error.h"
#include "lib/core/named_enum.h"
#include "lib/core/timer.h"
#include "lib/model/target_layers.h"

namespace dflash::model {

std::string target_layer_tensor(const QwenConfig& c, int l, const std::string& what) {
  return fmt::format("{}layers.{}.{}.weight", c.weight_prefix, l, what);
}

namespace {

// Qwen3.5 RMSNorm computes x̂ · (1 + w): fold the 1 in once at load (in fp32, then one rounding to T)
void fold_norm_offset(const QwenConfig& c, std::vector<float>& w) {
  if (!c.hybrid) return;
  for (float& x : w) x += 1.f;
}

// Slices of layer l's tensors: rows [b, e) of a tensor (dim 0; any rank) or columns [b, e) of a 2-D tensor.
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


// elements of the per-layer cache arrays on this rank
size_t kv_row_elements(const TargetShard& shard, const QwenConfig& c) { return size_t(shard.kv_count) * c.head_dim; }
size_t conv_tail_elements(const TargetShard& shard, const QwenConfig& c) {
  const size_t qkd = size_t(shard.linear.group_count) * c.linear_k_dim, vd = size_t(shard.linear.member_count) * c.linear_v_dim;
  return size_t(c.conv_kernel - 1) * (2 * qkd + vd);
}
size_t delta_state_elements(const TargetShard& shard, const QwenConfig& c) {
  return size_t(shard.linear.member_count) * c.linear_k_dim * c.linear_v_dim;
}

template <typename T>
const char* precision_name() {
  return name_of(kernels::precision_of<T>());
}

}  // namespace

// The model in one compute type: what TargetModel's methods delegate to.
class TargetModel::Engine {
 public:
  virtual ~Engine() = default;
  virtual const std::string& dir() const = 0;
  virtual const QwenConfig& config() const = 0;
  virtual const TargetShard& shard() const = 0;
  virtual TargetStats& stats() = 0;
  virtual const char* backend_name() const = 0;
  virtual const char* precision() const = 0;
  virtual MemoryKind memory() const = 0;
  virtual size_t weight_bytes() const = 0;
  // positions start at cache ? cache->length : 0 (plus the node's depth in a tree); cache (optional) is read and
  // extended; tree_parents (optional, with cache): the rows are the nodes of a tree (forward_tree). outputs: where
  // taps and final_hidden are.
  virtual void run(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps,
                   float* final_hidden, MemoryKind outputs, TargetCache* cache, const int* tree_parents) = 0;
  // the cache holds per-layer buffers (made on a fresh cache) with room for n more positions (grown geometrically)
  virtual void prepare_cache(TargetCache& cache, int n, const char* what) = 0;
  virtual TargetCache copy_cache(const TargetCache& cache) = 0;
  virtual void save_recurrent(const TargetCache& cache, TargetRecurrentState& state) = 0;
  virtual void restore_recurrent(TargetCache& cache, const TargetRecurrentState& state) = 0;
  virtual void keep_cache_path(TargetCache& cache, int past, const std::vector<int>& path) = 0;
  virtual std::vector<float> read_cache(const TargetCache& cache, int layer, TargetCachePart part) = 0;
};

namespace {

// One forward's arrays outside the token mixers, declared once (lib/core/arena_plan.h): bound, the pointers
// EngineT::run uses; metered, their share of the activation arena. ic = this rank's MLP channels.
template <typename T>
struct ForwardArrays {
  T* x = nullptr;                     // [S, H] residual stream (in T, as HF keeps it), identical on every TP rank
  T* h = nullptr;                     // [S, H] normed input of the current sub-block
  T* part = nullptr;                  // [S, H] this rank's row-parallel partial sum, then the full sum
  T *gate = nullptr, *up = nullptr;   // [S, ic] the MLP's gate and up (up then holds silu(gate)·up)
  kernels::acc_t<T>* rstd = nullptr;  // [S] the RMSNorm statistics
  int32_t* pos = nullptr;             // [S] positions
  float* f32 = nullptr;               // [S, H] fp32 scratch (device backends with T ≠ float): uploads, all-reduce
  int32_t* ids = nullptr;             // [S] token ids (a device backend gathers the embedding rows itself)
};
template <typename T, class Bind>
void bind_forward_arrays(Bind& b, ForwardArrays<T>& a, int S, int H, int ic, bool f32_scratch, bool device_embed) {
  const size_t s = size_t(S), sh = s * size_t(H);
  b(a.x, sh);
  b(a.h, sh);
  b(a.part, sh);
  b(a.gate, s * size_t(ic));
  b(a.up, s * size_t(ic));
  b(a.rstd, s);
  b(a.pos, s);
  if (f32_scratch) b(a.f32, sh);
  if (device_embed) b(a.ids, s);
}

// What a forward of S positions binds on a backend (device: not host memory): ForwardArrays' flags, and the arena
// bytes of those arrays plus the largest token mixer's scratch (rewound after each layer, so only one counts).
struct ForwardPlan {
  bool f32_scratch;   // T ≠ float on a device backend: an fp32 [S, H] array (uploads, the all-reduce, the outputs)
  bool device_embed;  // a device backend gathers the embedding rows from its table (token ids in the arena)
};
template <typename T>
ForwardPlan forward_plan(bool device) {
  return {!std::is_same_v<T, float> && device, device};
}
template <typename T>
size_t forward_arena_bytes(const QwenConfig& c, const TargetShard& shard, int S, bool device) {
  const ForwardPlan f = forward_plan<T>(device);
  const int ic = int(shard.mlp_end - shard.mlp_begin);
  ForwardArrays<T> arrays;
  const size_t own = arena_bytes(
      [&](ArenaMeter& m) { bind_forward_arrays(m, arrays, S, c.hidden, ic, f.f32_scratch, f.device_embed); });
  const size_t mixer = std::max({attention_scratch_bytes<T>(c, shard, S),
                                 c.hybrid ? gated_deltanet_scratch_bytes<T>(c, shard, S) : size_t(0),
                                 c.experts > 0 ? moe_scratch_bytes<T>(c, shard, S) : size_t(0)});
  return own + mixer;
}

// The target in compute type T on a Backend<T>: weights, activations, keys/values and conv tails in T; RMSNorm
// statistics, the DeltaNet gates and recurrent state in A.
template <typename T>
class EngineT final : public TargetModel::Engine {
 public:
  using A = kernels::acc_t<T>;
  // The type the TP all-reduce sums in: the transports reduce float and double; bf16 partial sums are widened to
  // fp32 (exact), summed in fp32 and rounded to bf16 once.
  using R = std::conditional_t<std::is_same_v<T, double>, double, float>;

  EngineT(const std::string& model_dir, comm::Transport& tp, const TargetOptions& options,
          std::shared_ptr<kernels::Backend<T>> backend);

  const std::string& dir() const override { return dir_; }
  const QwenConfig& config() const override { return config_; }
  const TargetShard& shard() const override { return shard_; }
  TargetStats& stats() override { return stats_; }
  const char* backend_name() const override { return backend_->name(); }
  const char* precision() const override { return precision_name<T>(); }
  MemoryKind memory() const override { return backend_->memory(); }
  size_t weight_bytes() const override;
  void run(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps, float* final_hidden,
           MemoryKind outputs, TargetCache* cache, const int* tree_parents) override;
  void prepare_cache(TargetCache& cache, int n, const char* what) override;
  TargetCache copy_cache(const TargetCache& cache) override;
  void save_recurrent(const TargetCache& cache, TargetRecurrentState& state) override;
  void restore_recurrent(TargetCache& cache, const TargetRecurrentState& state) override;
  void keep_cache_path(TargetCache& cache, int past, const std::vector<int>& path) override;
  std::vector<float> read_cache(const TargetCache& cache, int layer, TargetCachePart part) override;

 private:
  void load_layer(int l);
  void load_attention(int l, TargetLayer<T>& L);
  void load_linear_attention(int l, TargetLayer<T>& L);
  void load_moe(int l, TargetLayer<T>& L);
  // the whole embedding table into embed_table_ (device backends), in row chunks through the fp32 stages
  void load_embedding_table();
  // host floats → a weight in the backend's memory, rounded to T
  TargetWeight<T> upload(const std::vector<float>& host);
  // the activation arena holds at least `bytes` (reallocated, empty, when smaller)
  void reserve_activations(size_t bytes);
  // all-reduce of part[n] in backend memory over the TP group. f32: an fp32 [n] scratch in backend memory (bf16).
  void timed_allreduce(T* part, size_t n, float* f32);
  // data[n] (device memory, `type`) summed over the TP group on the NCCL plane: stream-ordered (queued, tracked in
  // pending_sums_) or host-synchronised (TargetOptions::ordered_allreduce)
  void device_allreduce(void* data, size_t n, comm::Transport::DeviceSum type);
  // waits for the stream-ordered all-reduces queued so far, each with the transport's bounded wait: before any host
  // wait for the backend's stream (which would wait for them unbounded) and at the forward's end
  void settle_sums();
  // the backend's stream synchronised, the pending sums settled first
  void synchronize();
  // dst[S, ld] columns [0, H) (=) src[S, H] as fp32. direct: dst in the backend's memory (a strided conversion
  // there); else dst on the host of a device backend (through f32, an fp32 [S, H] scratch in backend memory for
  // T ≠ float, and the host stage).
  void write_output(float* dst, int ld, const T* src, int S, bool direct, float* f32);
  // n elements of U (T or float) in backend memory as host floats
  template <typename U>
  std::vector<float> host_floats(const U* src, size_t n);

  std::string dir_;
  comm::Transport& tp_;
  std::shared_ptr<kernels::Backend<T>> backend_;  // declared before the weights, which live in its memory
  QwenConfig config_;
  TargetShard shard_;
  io::Checkpoint ckpt_;  // kept open: a host backend reads the embedding rows per forward
  std::vector<TargetLayer<T>> layers_;
  TargetWeight<T> final_norm_;  // [H]
  Buffer embed_table_;          // [vocab, H] in T on a device backend (gathered there); empty on the host
  Arena activations_;           // one forward's activations and scratch (backend memory)
  Buffer load_stage_;           // fp32 staging of one tensor at load (device backends with T ≠ float)
  std::vector<float> host_stage_;   // [S, H] host staging: embedding rows, taps (device backends)
  std::vector<R> reduce_stage_;     // [S, H] host staging of the all-reduce (device backend, host transport)
  bool bf16_allreduce_ = false;     // TargetOptions::tp_allreduce bf16
  bool sync_part_timing_ = false;   // TargetOptions::sync_part_timing
  bool ordered_allreduce_ = true;   // TargetOptions::ordered_allreduce
  // the stream-ordered all-reduces queued on the backend's stream and not yet waited for (in issue order)
  std::vector<comm::Request> pending_sums_;
  TargetStats stats_;
  MoeRouting routing_;  // the last MoE layer's routing (host)
};

template <typename T>
EngineT<T>::EngineT(const std::string& model_dir, comm::Transport& tp, const TargetOptions& options,
                    std::shared_ptr<kernels::Backend<T>> backend)
    : dir_(model_dir),
      tp_(tp),
      backend_(std::move(backend)),
      config_(load_qwen_config(model_dir)),
      shard_(plan_target_shard(config_, tp.size(), tp.rank(), options.mlp_grain)),
      ckpt_(model_dir) {
  bf16_allreduce_ = options.tp_allreduce == TpAllreduce::bf16;
  sync_part_timing_ = options.sync_part_timing;
  ordered_allreduce_ = options.ordered_allreduce;
  const int64_t H = config_.hidden;
  ckpt_.expect(config_.weight_prefix + "embed_tokens.weight", {config_.vocab, H});
  if (backend_->memory() != MemoryKind::host) load_embedding_table();
  std::vector<float> final_norm = ckpt_.read(ckpt_.expect(config_.weight_prefix + "norm.weight", {H}).name);
  fold_norm_offset(config_, final_norm);
  final_norm_ = upload(final_norm);
  layers_.resize(size_t(config_.layers));
  for (int l = 0; l < config_.layers; ++l) load_layer(l);
  backend_->synchronize(backend_->context());
  load_stage_ = Buffer();
}

template <typename T>
TargetWeight<T> EngineT<T>::upload(const std::vector<float>& host) {
  kernels::Backend<T>& be = *backend_;
  ExecContext& ctx = be.context();
  TargetWeight<T> w;
  w.count = host.size();
  w.buffer = Buffer(be.memory(), host.size() * sizeof(T));
  if constexpr (std::is_same_v<T, float>) {
    be.upload(ctx, w.buffer.data(), host.data(), host.size() * sizeof(float));
  } else {
    const float* src = host.data();
    if (be.memory() != MemoryKind::host) {  // through fp32 in device memory (ordered on the stream before reuse)
      if (load_stage_.bytes() < host.size() * sizeof(float)) {
        be.synchronize(ctx);
        load_stage_ = Buffer(be.memory(), host.size() * sizeof(float));
      }
      be.upload(ctx, load_stage_.data(), host.data(), host.size() * sizeof(float));
      src = load_stage_.as<float>();
    }
    be.convert_from_float(ctx, w.buffer.template as<T>(), src, host.size());
  }
  return w;
}

template <typename T>
void EngineT<T>::load_embedding_table() {
  kernels::Backend<T>& be = *backend_;
  ExecContext& ctx = be.context();
  const int64_t V = config_.vocab, H = config_.hidden;
  const std::string name = config_.weight_prefix + "embed_tokens.weight";
  embed_table_ = Buffer(be.memory(), size_t(V) * size_t(H) * sizeof(T));
  // chunks of ~16 Mi floats (64 MiB of host staging), not the whole fp32 table on the host at once
  const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 24) / H);
  host_stage_.resize(size_t(std::min(chunk, V) * H));
  if constexpr (!std::is_same_v<T, float>) {
    if (load_stage_.bytes() < host_stage_.size() * sizeof(float)) {
      be.synchronize(ctx);
      load_stage_ = Buffer(be.memory(), host_stage_.size() * sizeof(float));
    }
  }
  for (int64_t r0 = 0; r0 < V; r0 += chunk) {
    const int64_t r1 = std::min(V, r0 + chunk);
    const size_t n = size_t(r1 - r0) * size_t(H);
    T* dst = embed_table_.as<T>() + size_t(r0) * size_t(H);
    // the host stage is refilled only after the previous chunk's upload has been taken from it
    be.synchronize(ctx);
    ckpt_.read_rows(name, r0, r1, host_stage_.data());
    if constexpr (std::is_same_v<T, float>) {
      be.upload(ctx, dst, host_stage_.data(), n * sizeof(float));
    } else {
      be.upload(ctx, load_stage_.data(), host_stage_.data(), n * sizeof(float));
      be.convert_from_float(ctx, dst, load_stage_.as<float>(), n);
    }
  }
  be.synchronize(ctx);
  host_stage_ = std::vector<float>();  // the forwards size it again for their own S
}

template <typename T>
void EngineT<T>::load_layer(int l) {
  const QwenConfig& c = config_;
  const int64_t H = c.hidden;
  TargetLayer<T>& L = layers_[size_t(l)];
  const LayerReader r{ckpt_, c, l};
  std::vector<float> input_layernorm, post_attention_layernorm, gate_proj, up_proj, down_proj;
  r.rows("input_layernorm", {H}, 0, H, input_layernorm);
  r.rows("post_attention_layernorm", {H}, 0, H, post_attention_layernorm);
  fold_norm_offset(c, input_layernorm);
  fold_norm_offset(c, post_attention_layernorm);
  L.input_layernorm = upload(input_layernorm);
  L.post_attention_layernorm = upload(post_attention_layernorm);
  L.linear = c.is_linear(l);
  if (L.linear) {
    load_linear_attention(l, L);
  } else {
    load_attention(l, L);
  }
  L.moe = c.is_moe(l);
  if (L.moe) {
    load_moe(l, L);
    return;
  }
  r.rows("mlp.gate_proj", {c.intermediate, H}, shard_.mlp_begin, shard_.mlp_end, gate_proj);
  L.gate_proj = upload(gate_proj);
  r.rows("mlp.up_proj", {c.intermediate, H}, shard_.mlp_begin, shard_.mlp_end, up_proj);
  L.up_proj = upload(up_proj);
  r.cols("mlp.down_proj", {H, c.intermediate}, shard_.mlp_begin, shard_.mlp_end, down_proj);
  L.down_proj = upload(down_proj);
}

template <typename T>
void EngineT<T>::load_attention(int l, TargetLayer<T>& L) {
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
  L.q_proj = upload(w);
  r.rows("self_attn.k_proj", {c.kv_heads * hd, H}, kv0, kv0 + kvd, w);
  L.k_proj = upload(w);
  r.rows("self_attn.v_proj", {c.kv_heads * hd, H}, kv0, kv0 + kvd, w);
  L.v_proj = upload(w);
  r.cols("self_attn.o_proj", {H, c.heads * hd}, q0, q0 + qd, w);
  L.o_proj = upload(w);
}

template <typename T>
void EngineT<T>::load_linear_attention(int l, TargetLayer<T>& L) {
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

// The router (replicated) and this rank's whole experts. The layout is read from the names present: per expert
// (`mlp.experts.{e}.{gate,up,down}_proj.weight`, as Qwen3-MoE is published) or fused 3-D without the .weight suffix
// (`mlp.experts.gate_up_proj [E, 2I, H]`, each expert's gate rows then its up rows, `mlp.experts.down_proj
// [E, H, I]`, as transformers 5 holds them and the Qwen3.5/3.6 MoE checkpoints store them).
template <typename T>
void EngineT<T>::load_moe(int l, TargetLayer<T>& L) {
  const QwenConfig& c = config_;
  const int64_t H = c.hidden, E = c.experts, I = c.moe_intermediate;
  const int64_t e0 = shard_.expert_begin, ne = shard_.expert_count;
  const LayerReader r{ckpt_, c, l};
  std::vector<float> w;
  r.rows("mlp.gate", {E, H}, 0, E, w);
  if (c.shared_expert_intermediate > 0) {
    // the shared expert's gate as the router's last row; its channels split like a dense MLP
    std::vector<float> g, gate_s, up_s, down_s;
    const int64_t Is = c.shared_expert_intermediate;
    r.rows("mlp.shared_expert_gate", {1, H}, 0, 1, g);
    w.insert(w.end(), g.begin(), g.end());
    r.rows("mlp.shared_expert.gate_proj", {Is, H}, shard_.mlp_begin, shard_.mlp_end, gate_s);
    r.rows("mlp.shared_expert.up_proj", {Is, H}, shard_.mlp_begin, shard_.mlp_end, up_s);
    r.cols("mlp.shared_expert.down_proj", {H, Is}, shard_.mlp_begin, shard_.mlp_end, down_s);
    L.gate_proj = upload(gate_s);
    L.up_proj = upload(up_s);
    L.down_proj = upload(down_s);
  }
  L.router = upload(w);
  const std::string base = fmt::format("{}layers.{}.mlp.experts.", c.weight_prefix, l);
  std::vector<float> gate(size_t(ne * I * H)), up(size_t(ne * I * H)), down(size_t(ne * H * I));
  if (ckpt_.has(base + "gate_up_proj")) {
    DFLASH_USER_CHECK(ckpt_.has(base + "down_proj"), "checkpoint {}: {}gate_up_proj (fused experts) without {}down_proj",
                      dir_, base, base);
    ckpt_.expect(base + "gate_up_proj", {E, 2 * I, H});
    ckpt_.expect(base + "down_proj", {E, H, I});
    w.resize(size_t(ne * 2 * I * H));
    if (ne > 0) ckpt_.read_rows(base + "gate_up_proj", e0, e0 + ne, w.data());
    for (int64_t j = 0; j < ne; ++j) {
      const float* g = &w[size_t(j * 2 * I * H)];
      std::copy_n(g, I * H, &gate[size_t(j * I * H)]);
      std::copy_n(g + I * H, I * H, &up[size_t(j * I * H)]);
    }
    if (ne > 0) ckpt_.read_rows(base + "down_proj", e0, e0 + ne, down.data());
  } else {
    DFLASH_USER_CHECK(ckpt_.has(base + "0.gate_proj.weight"),
                      "checkpoint {}: layer {} has routed experts (config.json) but neither {}gate_up_proj (fused) "
                      "nor {}0.gate_proj.weight (per expert) is in it",
                      dir_, l, base, base);
    for (int64_t j = 0; j < ne; ++j) {
      const int64_t e = e0 + j;
      r.rows(fmt::format("mlp.experts.{}.gate_proj", e), {I, H}, 0, I, w);
      std::copy(w.begin(), w.end(), gate.begin() + j * I * H);
      r.rows(fmt::format("mlp.experts.{}.up_proj", e), {I, H}, 0, I, w);
      std::copy(w.begin(), w.end(), up.begin() + j * I * H);
      r.rows(fmt::format("mlp.experts.{}.down_proj", e), {H, I}, 0, H, w);
      std::copy(w.begin(), w.end(), down.begin() + j * H * I);
    }
  }
  L.expert_gate = upload(gate);
  L.expert_up = upload(up);
  L.expert_down = upload(down);
}

template <typename T>
size_t EngineT<T>::weight_bytes() const {
  size_t n = final_norm_.size();
  for (const auto& L : layers_) n += L.elements();
  return n * sizeof(T);
}

template <typename T>
void EngineT<T>::timed_allreduce(T* part, size_t n, float* f32) {
  Timer t;
  if (tp_.size() > 1) {  // a group of one has nothing to sum
    kernels::Backend<T>& be = *backend_;
    ExecContext& ctx = be.context();
    const bool device = be.memory() != MemoryKind::host;
    bool summed = false;
    if constexpr (std::is_same_v<T, kernels::bf16>) {
      // tp_allreduce bf16 on NCCL: the bf16 partials summed as bf16 on the device (the ring rounds every hop),
      // half the bytes of the fp32 sum and no widening or narrowing pass
      if (bf16_allreduce_ && device && tp_.sums_bf16_on_device()) {
        static_assert(sizeof(kernels::bf16) == sizeof(uint16_t));
        device_allreduce(part, n, comm::Transport::DeviceSum::bf16);
        summed = true;
      }
    }
    if (!summed) {
      R* sum = nullptr;
      if constexpr (std::is_same_v<T, R>) {
        sum = part;
      } else {  // bf16: the partial sums widened to fp32 (exact), one rounding of the total below
        be.convert_to_float(ctx, f32, part, n);
        sum = f32;
      }
      if (!device) {
        tp_.allreduce_sum(sum, n);
      } else if (tp_.takes_device_pointers()) {
        if constexpr (std::is_same_v<R, float>) device_allreduce(sum, n, comm::Transport::DeviceSum::fp32);
        else DFLASH_FAIL("target forward: an fp64 sum on a device transport (no device backend computes in fp64)");
      } else {
        // a host transport (MPI here is not CUDA-aware): staged through the host
        settle_sums();
        reduce_stage_.resize(n);
        be.download(ctx, reduce_stage_.data(), sum, n * sizeof(R));
        tp_.allreduce_sum(reduce_stage_.data(), n);
        be.upload(ctx, sum, reduce_stage_.data(), n * sizeof(R));
        stats_.host_waits += 2;  // the download, the blocking all-reduce
      }
      if constexpr (!std::is_same_v<T, R>) be.convert_from_float(ctx, part, f32, n);
    }
  }
  stats_.allreduce_seconds += t.seconds();
  ++stats_.allreduces;
}

template <typename T>
void EngineT<T>::device_allreduce(void* data, size_t n, comm::Transport::DeviceSum type) {
  ExecContext& ctx = backend_->context();
  if (ordered_allreduce_ && tp_.orders_on_device_streams()) {
    // the stream-ordered sum: NCCL's stream waits for the partials, the backend's stream for the sum; the host
    // goes on queueing the next kernels (docs/cuda.md, "The TP all-reduce in bf16")
    pending_sums_.push_back(tp_.allreduce_sum_ordered(data, n, type, ctx.stream));
    if (sync_part_timing_) settle_sums();  // the benchmark's part timers: allreduce_seconds holds the sum's time
    return;
  }
  // host-synchronised: NCCL reduces in place on its own stream and returns when it is done, so the backend's
  // stream must have finished writing the partials first
  synchronize();
  if (type == comm::Transport::DeviceSum::bf16) tp_.allreduce_sum_bf16_device(static_cast<uint16_t*>(data), n);
  else tp_.allreduce_sum(static_cast<float*>(data), n);
  ++stats_.host_waits;  // the all-reduce's own wait for NCCL's stream
}

template <typename T>
void EngineT<T>::settle_sums() {
  if (pending_sums_.empty()) return;
  for (comm::Request& r : pending_sums_) r.wait();  // in issue order: the first that never completes is named
  pending_sums_.clear();
  ++stats_.host_waits;
}

template <typename T>
void EngineT<T>::synchronize() {
  settle_sums();
  backend_->synchronize(backend_->context());
  if (backend_->memory() != MemoryKind::host) ++stats_.host_waits;
}

template <typename T>
void EngineT<T>::reserve_activations(size_t bytes) {
  if (activations_.capacity() >= bytes) return;
  // grown by at least half: a decode loop whose blocks vary in size reallocates rarely
  activations_ = Arena(backend_->memory(), std::max(bytes, activations_.capacity() * 3 / 2), "target activations");
}

template <typename T>
void EngineT<T>::write_output(float* dst, int ld, const T* src, int S, bool direct, float* f32) {
  kernels::Backend<T>& be = *backend_;
  ExecContext& ctx = be.context();
  const int H = config_.hidden;
  const size_t sh = size_t(S) * size_t(H);
  if (direct) {
    be.convert_to_float_strided(ctx, dst, ld, src, H, S, H);
    return;
  }
  settle_sums();  // the download below waits for the backend's stream on the host
  ++stats_.host_waits;
  const float* from = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    from = src;
  } else {
    be.convert_to_float(ctx, f32, src, sh);
    from = f32;
  }
  if (ld == H) {
    be.download(ctx, dst, from, sh * sizeof(float));
    return;
  }
  host_stage_.resize(sh);
  be.download(ctx, host_stage_.data(), from, sh * sizeof(float));
  for (int i = 0; i < S; ++i) std::copy_n(&host_stage_[size_t(i) * H], H, dst + size_t(i) * size_t(ld));
}

template <typename T>
void EngineT<T>::run(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps,
                     float* final_hidden, MemoryKind outputs, TargetCache* cache, const int* tree_parents) {
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
  kernels::Backend<T>& be = *backend_;
  DFLASH_CHECK(outputs == MemoryKind::host || outputs == be.memory(), "target forward: outputs in {} memory, but "
               "this target runs on the {} backend ({} memory); pass MemoryKind::{}", memory_kind_name(outputs),
               be.name(), memory_kind_name(be.memory()), memory_kind_name(be.memory()));
  Timer timer;
  ExecContext& ctx = be.context();
  const int H = c.hidden, ic = int(shard_.mlp_end - shard_.mlp_begin);
  const int n_taps = int(tap_layer_ids.size());
  const float eps = float(c.rms_norm_eps);
  const int past = cache ? cache->length : 0;
  const size_t s = size_t(S), sh = s * size_t(H);
  // outputs written in place by the backend (host memory of a CPU backend, or the device outputs of a device one)
  const bool direct = outputs == be.memory();
  const bool device = be.memory() != MemoryKind::host;
  const ForwardPlan plan = forward_plan<T>(device);
  DFLASH_CHECK(plan.device_embed == (embed_table_.data() != nullptr),
               "target forward: the embedding table is {} but the backend's memory is {}",
               embed_table_.data() ? "uploaded" : "not uploaded", memory_kind_name(be.memory()));

  // one arena for the forward: the arrays below, then the token mixer's scratch (rewound after each layer), both
  // sized by the lists the forwards bind (lib/core/arena_plan.h)
  stats_.activation_bytes = forward_arena_bytes<T>(c, shard_, S, device);
  reserve_activations(stats_.activation_bytes);
  activations_.reset();
  ForwardArrays<T> arrays;
  ArenaBinder binder{activations_};
  bind_forward_arrays(binder, arrays, S, H, ic, plan.f32_scratch, plan.device_embed);
  T *x = arrays.x, *h = arrays.h, *part = arrays.part, *gate = arrays.gate, *up = arrays.up;
  A* rstd = arrays.rstd;
  int32_t *pos = arrays.pos, *ids = arrays.ids;
  float* f32 = arrays.f32;

  std::vector<int32_t> host_pos(s);
  for (int i = 0; i < S; ++i) host_pos[size_t(i)] = past + i;
  if (tree_parents) {  // a tree node sits at past + its depth
    for (int i = 0; i < S; ++i)
      host_pos[size_t(i)] = tree_parents[i] < 0 ? past : host_pos[size_t(tree_parents[i])] + 1;
  }
  // TargetOptions::sync_part_timing: each part timer then measures the device's work, not its launches
  const bool sync_parts = device && sync_part_timing_;
  auto part_begin = [&](Timer& t) {
    if (sync_parts) synchronize();
    t.reset();
  };
  auto part_seconds = [&](const Timer& t) {
    if (sync_parts) synchronize();
    return t.seconds();
  };
  // an error while sums are pending: their requests, released as it unwinds, abort the TP communicator (no waiting
  // for peers); none is left pending after a forward that returns
  struct DropPendingSums {
    std::vector<comm::Request>& pending;
    ~DropPendingSums() { pending.clear(); }
  } drop_pending_sums{pending_sums_};
  Timer part_timer;
  part_begin(part_timer);
  be.upload(ctx, pos, host_pos.data(), s * sizeof(int32_t));

  // embedding rows: a device backend gathers them from its table (S ids uploaded, no [S, H] upload); a host one
  // reads them from the mmapped checkpoint (no second copy of the table in host memory)
  const std::string embed = c.weight_prefix + "embed_tokens.weight";
  if (plan.device_embed) {
    be.upload(ctx, ids, tokens, s * sizeof(int32_t));
    be.embedding_forward(ctx, x, embed_table_.as<T>(), ids, S, H, c.vocab);
  } else {
    host_stage_.resize(sh);
    for (int i = 0; i < S; ++i) ckpt_.read_rows(embed, tokens[i], tokens[i] + 1, &host_stage_[size_t(i) * H]);
    if constexpr (std::is_same_v<T, float>) {
      be.upload(ctx, x, host_stage_.data(), sh * sizeof(float));
    } else if (f32) {
      be.upload(ctx, f32, host_stage_.data(), sh * sizeof(float));
      be.convert_from_float(ctx, x, f32, sh);
    } else {
      be.convert_from_float(ctx, x, host_stage_.data(), sh);  // a host backend reads the host stage itself
    }
  }

  stats_.embed_seconds += part_seconds(part_timer);
  const size_t tap_ld = size_t(n_taps) * size_t(H);
  for (int l = 0; l < c.layers; ++l) {
    const TargetLayer<T>& L = layers_[size_t(l)];
    // token mixer: column-parallel in-projections over this rank's heads, row-parallel out-projection + all-reduce
    be.rmsnorm_forward(ctx, h, rstd, x, L.input_layernorm.data(), S, H, eps);
    const size_t li = size_t(l);
    part_begin(part_timer);  // on a device backend without sync_part_timing: launch time (plus stream waits)
    if (L.linear) {
      gated_deltanet_forward<T>(be, activations_, part, h, S, L, c, shard_,
                                cache ? cache->conv_tail[li].as<T>() : nullptr,
                                cache ? cache->delta_state[li].as<A>() : nullptr);
    } else {
      attention_forward<T>(be, activations_, part, h, pos, S, L, c, shard_, cache ? cache->keys[li].as<T>() : nullptr,
                           cache ? cache->values[li].as<T>() : nullptr, past, tree_parents);
    }
    (L.linear ? stats_.linear_attention_seconds : stats_.full_attention_seconds) += part_seconds(part_timer);
    timed_allreduce(part, sh, f32);
    be.residual_forward(ctx, x, x, part, sh);

    // MLP: column-parallel gate/up over this rank's channels, row-parallel down + all-reduce
    part_begin(part_timer);
    be.rmsnorm_forward(ctx, h, rstd, x, L.post_attention_layernorm.data(), S, H, eps);
    if (L.moe) {  // routed experts: this rank's experts' share, joined by the same all-reduce
      if (device) {  // the router's table is read on the host (a download): the attention's sum settled first
        settle_sums();
        ++stats_.host_waits;
      }
      moe_forward<T>(be, activations_, part, h, S, L, c, shard_, routing_);
      const int64_t e0 = shard_.expert_begin, e1 = e0 + shard_.expert_count;
      stats_.expert_rows += routing_.expert_start[size_t(e1)] - routing_.expert_start[size_t(e0)];
    } else {
      shard_linear<T>(be, gate, h, L.gate_proj.data(), S, H, ic);
      shard_linear<T>(be, up, h, L.up_proj.data(), S, H, ic);
      be.swiglu_forward(ctx, up, gate, up, s * size_t(ic));
      shard_linear<T>(be, part, up, L.down_proj.data(), S, ic, H);
    }
    stats_.mlp_seconds += part_seconds(part_timer);
    timed_allreduce(part, sh, f32);
    be.residual_forward(ctx, x, x, part, sh);

    part_begin(part_timer);
    for (int t = 0; t < n_taps; ++t) {
      if (tap_layer_ids[size_t(t)] != l || !taps) continue;
      write_output(taps + size_t(t) * H, int(tap_ld), x, S, direct, f32);
    }
    stats_.output_seconds += part_seconds(part_timer);
  }
  if (final_hidden) {
    be.rmsnorm_forward(ctx, h, rstd, x, final_norm_.data(), S, H, eps);
    write_output(final_hidden, H, h, S, direct, f32);
  }
  synchronize();
  stats_.activation_peak_bytes = activations_.peak();
  ++stats_.forwards;
  stats_.tokens += S;
  stats_.forward_seconds += timer.seconds();
}

template <typename T>
void EngineT<T>::prepare_cache(TargetCache& cache, int n, const char* what) {
  kernels::Backend<T>& be = *backend_;
  ExecContext& ctx = be.context();
  const size_t L = size_t(config_.layers), row = kv_row_elements(shard_, config_);
  const size_t tail = conv_tail_elements(shard_, config_), state = delta_state_elements(shard_, config_);
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
      cache.conv_tail[l] = Buffer(be.memory(), tail * sizeof(T));
      cache.delta_state[l] = Buffer(be.memory(), state * sizeof(A));
      be.zero(ctx, cache.conv_tail[l].data(), tail * sizeof(T));
      be.zero(ctx, cache.delta_state[l].data(), state * sizeof(A));
    }
  }
  for (size_t l = 0; l < L; ++l) {
    for (const Buffer* b : {&cache.keys[l], &cache.conv_tail[l]}) {
      DFLASH_CHECK(b->data() == nullptr || b->kind() == be.memory(), "target {}: the cache is in {} memory, this "
                   "target runs on the {} backend (a cache belongs to the target that filled it)", what,
                   memory_kind_name(b->kind()), be.name());
    }
    // the sizes say which compute type filled it
    const bool sized = layers_[l].linear ? cache.delta_state[l].bytes() == state * sizeof(A)
                                         : cache.keys[l].bytes() == size_t(cache.capacity) * row * sizeof(T);
    DFLASH_CHECK(sized, "target {}: layer {} of the cache does not have this {} target's sizes (a cache belongs to "
                 "the target that filled it)", what, l, precision_name<T>());
  }
  const int need = cache.length + n;
  if (need <= cache.capacity) return;
  // geometric growth: a decode appends a block at a time, so the copies add up to O(final length)
  const int capacity = std::max(need, cache.capacity * 2);
  const size_t bytes = size_t(capacity) * row * sizeof(T), kept = size_t(cache.length) * row * sizeof(T);
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

template <typename T>
TargetCache EngineT<T>::copy_cache(const TargetCache& cache) {
  kernels::Backend<T>& be = *backend_;
  ExecContext& ctx = be.context();
  TargetCache out;
  out.length = cache.length;
  out.capacity = cache.keys.empty() ? 0 : cache.length;
  const size_t kept = size_t(cache.length) * kv_row_elements(shard_, config_) * sizeof(T);
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

template <typename T>
void EngineT<T>::save_recurrent(const TargetCache& cache, TargetRecurrentState& state) {
  kernels::Backend<T>& be = *backend_;
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

template <typename T>
void EngineT<T>::restore_recurrent(TargetCache& cache, const TargetRecurrentState& state) {
  if (state.conv_tail.empty()) return;
  kernels::Backend<T>& be = *backend_;
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

template <typename T>
void EngineT<T>::keep_cache_path(TargetCache& cache, int past, const std::vector<int>& path) {
  const int m = int(path.size());
  DFLASH_CHECK(past >= 0 && past + m <= cache.length, "target keep_cache_path: {} kept nodes after {} positions, "
               "the cache holds {}", m, past, cache.length);
  kernels::Backend<T>& be = *backend_;
  ExecContext& ctx = be.context();
  const size_t row = kv_row_elements(shard_, config_) * sizeof(T);
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

template <typename T>
template <typename U>
std::vector<float> EngineT<T>::host_floats(const U* src, size_t n) {
  kernels::Backend<T>& be = *backend_;
  ExecContext& ctx = be.context();
  std::vector<float> host(n);
  if (n == 0) return host;
  if constexpr (std::is_same_v<U, float>) {
    be.download(ctx, host.data(), src, n * sizeof(float));
  } else {
    static_assert(std::is_same_v<U, T>, "cache arrays are in T or in acc_t<T>, which is float or T");
    if (be.memory() == MemoryKind::host) {
      be.convert_to_float(ctx, host.data(), src, n);
    } else {
      Buffer f32(be.memory(), n * sizeof(float));
      be.convert_to_float(ctx, f32.as<float>(), src, n);
      be.download(ctx, host.data(), f32.data(), n * sizeof(float));
    }
  }
  be.synchronize(ctx);
  return host;
}

template <typename T>
std::vector<float> EngineT<T>::read_cache(const TargetCache& cache, int layer, TargetCachePart part) {
  DFLASH_CHECK(layer >= 0 && layer < config_.layers, "target read_cache: layer {} outside [0, {})", layer,
               config_.layers);
  if (cache.keys.empty()) return {};
  const size_t l = size_t(layer);
  switch (part) {
    case TargetCachePart::keys:
    case TargetCachePart::values: {
      if (layers_[l].linear) return {};
      const Buffer& b = part == TargetCachePart::keys ? cache.keys[l] : cache.values[l];
      return host_floats(b.as<T>(), size_t(cache.length) * kv_row_elements(shard_, config_));
    }
    case TargetCachePart::conv_tail:
      if (!layers_[l].linear) return {};
      return host_floats(cache.conv_tail[l].as<T>(), cache.conv_tail[l].bytes() / sizeof(T));
    case TargetCachePart::delta_state:
      if (!layers_[l].linear) return {};
      return host_floats(cache.delta_state[l].as<A>(), cache.delta_state[l].bytes() / sizeof(A));
  }
  return {};
}

// The engine options ask for (TargetOptions: precision, device, an injected fp32 backend).
std::unique_ptr<TargetModel::Engine> make_engine(const std::string& dir, comm::Transport& tp,
                                                 const TargetOptions& o) {
  if (o.backend) {
    DFLASH_USER_CHECK(o.precision == kernels::Precision::fp32, "target {}: precision {} with an injected backend "
                      "(TargetOptions::backend), which is fp32; drop the backend or ask for fp32", dir,
                      name_of(o.precision));
    return std::make_unique<EngineT<float>>(dir, tp, o, o.backend);
  }
  // which device computes in which precision is make_backend's to say (kernels/device.h)
  const std::string refusal = kernels::backend_refusal(o.device, o.precision);
  DFLASH_USER_CHECK(refusal.empty(), "target {}: {}", dir, refusal);
  const kernels::CpuBackendOptions cpu{o.attention_block};
  switch (o.precision) {
    case kernels::Precision::fp32:
      return std::make_unique<EngineT<float>>(dir, tp, o, kernels::make_backend<float>(o.device, cpu));
    case kernels::Precision::fp64:
      return std::make_unique<EngineT<double>>(dir, tp, o, kernels::make_backend<double>(o.device, cpu));
    case kernels::Precision::bf16:
      return std::make_unique<EngineT<kernels::bf16>>(dir, tp, o, kernels::make_backend<kernels::bf16>(o.device));
  }
  DFLASH_FAIL("target {}: precision {}", dir, int(o.precision));
}

}  // namespace

TargetModel::TargetModel(const std::string& model_dir, comm::Transport& tp, TargetOptions options)
    : engine_(make_engine(model_dir, tp, options)) {}
TargetModel::~TargetModel() = default;
TargetModel::TargetModel(TargetModel&&) noexcept = default;
TargetModel& TargetModel::operator=(TargetModel&&) noexcept = default;

size_t target_activation_bytes(const QwenConfig& c, const TargetShard& shard, int S, kernels::Precision precision,
                               bool device) {
  switch (precision) {
    case kernels::Precision::fp32: return forward_arena_bytes<float>(c, shard, S, device);
    case kernels::Precision::bf16: return forward_arena_bytes<kernels::bf16>(c, shard, S, device);
    case kernels::Precision::fp64: return forward_arena_bytes<double>(c, shard, S, device);
  }
  DFLASH_FAIL("target_activation_bytes: precision {}", int(precision));
}

const QwenConfig& TargetModel::config() const { return engine_->config(); }
const TargetShard& TargetModel::shard() const { return engine_->shard(); }
const TargetStats& TargetModel::stats() const { return engine_->stats(); }
void TargetModel::reset_stats() { engine_->stats() = {}; }
const char* TargetModel::backend_name() const { return engine_->backend_name(); }
const char* TargetModel::precision() const { return engine_->precision(); }
MemoryKind TargetModel::memory() const { return engine_->memory(); }
size_t TargetModel::weight_bytes() const { return engine_->weight_bytes(); }

void TargetModel::forward(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps,
                          float* final_hidden) {
  engine_->run(tokens, S, tap_layer_ids, taps, final_hidden, MemoryKind::host, nullptr, nullptr);
}

void TargetModel::forward(const int32_t* tokens, int S, const std::vector<int>& tap_layer_ids, float* taps,
                          float* final_hidden, MemoryKind outputs) {
  engine_->run(tokens, S, tap_layer_ids, taps, final_hidden, outputs, nullptr, nullptr);
}

void TargetModel::forward_cached(const int32_t* tokens, int n, TargetCache& cache, float* final_hidden) {
  forward_cached(tokens, n, cache, {}, nullptr, final_hidden);
}

void TargetModel::forward_cached(const int32_t* tokens, int n, TargetCache& cache,
                                 const std::vector<int>& tap_layer_ids, float* taps, float* final_hidden) {
  engine_->prepare_cache(cache, n, "forward_cached");
  engine_->run(tokens, n, tap_layer_ids, taps, final_hidden, MemoryKind::host, &cache, nullptr);
  cache.length += n;
}

void TargetModel::forward_tree(const int32_t* tokens, const int* parents, int n, TargetCache& cache,
                               const std::vector<int>& tap_layer_ids, float* taps, float* final_hidden) {
  DFLASH_CHECK(memory() == MemoryKind::host,
               "target forward_tree: tree verification runs the CPU kernel kernels/cpu/attention_tree on host memory; "
               "this target runs on the {} backend (load the target with the CPU backend for tree verification)",
               backend_name());
  DFLASH_CHECK(!config().hybrid, "target forward_tree: {} has Gated DeltaNet layers, whose recurrent state cannot "
               "branch within one forward; tree verification needs a dense target", engine_->dir());
  DFLASH_CHECK(n >= 1 && parents[0] == -1, "target forward_tree: node 0 must be the root (parent -1)");
  for (int i = 1; i < n; ++i)
    DFLASH_CHECK(parents[i] >= 0 && parents[i] < i, "target forward_tree: node {} has parent {}, outside [0, {})", i,
                 parents[i], i);
  engine_->prepare_cache(cache, n, "forward_tree");
  engine_->run(tokens, n, tap_layer_ids, taps, final_hidden, MemoryKind::host, &cache, parents);
  cache.length += n;
}

void TargetCache::truncate(int new_length) {
  DFLASH_CHECK(new_length >= 0 && new_length <= length, "target cache: cannot truncate to {} positions: it holds {}",
               new_length, length);
  length = new_length;
}

TargetCache TargetModel::copy_cache(const TargetCache& cache) const { return engine_->copy_cache(cache); }
void TargetModel::save_recurrent(const TargetCache& cache, TargetRecurrentState& state) const {
  engine_->save_recurrent(cache, state);
}
void TargetModel::restore_recurrent(TargetCache& cache, const TargetRecurrentState& state) const {
  engine_->restore_recurrent(cache, state);
}
void TargetModel::keep_cache_path(TargetCache& cache, int past, const std::vector<int>& path) const {
  engine_->keep_cache_path(cache, past, path);
}
std::vector<float> TargetModel::read_cache(const TargetCache& cache, int layer, TargetCachePart part) const {
  return engine_->read_cache(cache, layer, part);
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
