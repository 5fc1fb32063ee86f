#include "lib/model/drafter_params.h"

#include <algorithm>
#include <type_traits>
#include <utility>

#include <fmt/ranges.h>

#include "kernels/bf16.h"
#include "lib/core/error.h"
#include "lib/core/json_field.h"
#include "lib/core/rng.h"

namespace dflash::model {

void DrafterConfig::validate() const {
  auto positive = [](int v, const char* name) {
    DFLASH_USER_CHECK(v > 0, "drafter config: {} must be positive, got {}", name, v);
  };
  positive(hidden, "hidden");
  positive(layers, "layers");
  positive(heads, "heads");
  positive(kv_heads, "kv_heads");
  positive(head_dim, "head_dim");
  positive(intermediate, "intermediate");
  positive(block_size, "block_size");
  positive(n_taps, "n_taps");
  positive(vocab, "vocab");
  DFLASH_USER_CHECK(heads % kv_heads == 0, "drafter config: heads ({}) must be a multiple of kv_heads ({})", heads,
               kv_heads);
  DFLASH_USER_CHECK(head_dim % 2 == 0, "drafter config: head_dim ({}) must be even for RoPE", head_dim);
  DFLASH_USER_CHECK(block_size >= 2, "drafter config: block_size ({}) must be >= 2 (anchor + at least one prediction)",
               block_size);
  DFLASH_USER_CHECK(mask_token_id >= 0 && mask_token_id < vocab,
               "drafter config: mask_token_id {} is outside the vocabulary [0, {})", mask_token_id, vocab);
  DFLASH_USER_CHECK(window.empty() || int(window.size()) == layers,
               "drafter config: {} sliding-window entries for {} layers (give one per layer, 0 = full)",
               window.size(), layers);
  for (size_t l = 0; l < window.size(); ++l)
    DFLASH_USER_CHECK(window[l] >= 0, "drafter config: window of layer {} is {} (must be >= 0)", l, window[l]);
  DFLASH_USER_CHECK(rope_theta > 0 && rms_norm_eps > 0,
                    "drafter config: rope_theta ({}) and rms_norm_eps ({}) must be positive", rope_theta, rms_norm_eps);
}

nlohmann::ordered_json drafter_config_to_json(const DrafterConfig& c) {
  nlohmann::ordered_json j;
  for_each_drafter_field(c, [&](const char* name, const auto& v) { j[name] = v; });
  return j;
}

DrafterConfig drafter_config_from_json(const nlohmann::json& j, const std::string& source) {
  DFLASH_USER_CHECK(j.is_object(), "{}: 'drafter' must be an object", source);
  DrafterConfig c;
  for_each_drafter_field(c, [&](const char* name, auto& v) { v = json_field<std::decay_t<decltype(v)>>(j, name, source); });
  try {
    c.validate();
  } catch (const Error& e) {
    DFLASH_USER_FAIL("{}: {}", source, e.what());
  }
  return c;
}

namespace {

// (name, printed value) of every field: "window" prints as [0, 5], numbers as fmt prints them.
std::vector<std::pair<std::string, std::string>> printed_fields(const DrafterConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  auto print = [](const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::vector<int>>)
      return fmt::format("[{}]", fmt::join(v, ", "));
    else
      return fmt::format("{}", v);
  };
  for_each_drafter_field(c, [&](const char* name, const auto& v) { out.emplace_back(name, print(v)); });
  return out;
}

}  // namespace

DrafterConfigDifference first_difference(const DrafterConfig& a, const DrafterConfig& b) {
  const auto pa = printed_fields(a), pb = printed_fields(b);
  for (size_t i = 0; i < pa.size(); ++i)
    if (pa[i].second != pb[i].second) return {pa[i].first, pa[i].second, pb[i].second};
  return {};
}

std::vector<ParamInfo> drafter_param_layout(const DrafterConfig& c) {
  c.validate();
  std::vector<ParamInfo> out;
  size_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, bool is_norm) {
    size_t n = 1;
    for (auto d : shape) n *= size_t(d);
    out.push_back({std::move(name), std::move(shape), offset, n, is_norm});
    offset += n;
  };
  const int64_t H = c.hidden, Q = int64_t(c.heads) * c.head_dim, KV = int64_t(c.kv_heads) * c.head_dim;
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, true);
    add(p + "self_attn.q_proj.weight", {Q, H}, false);
    add(p + "self_attn.k_proj.weight", {KV, H}, false);
    add(p + "self_attn.v_proj.weight", {KV, H}, false);
    add(p + "self_attn.o_proj.weight", {H, Q}, false);
    add(p + "self_attn.q_norm.weight", {c.head_dim}, true);
    add(p + "self_attn.k_norm.weight", {c.head_dim}, true);
    add(p + "post_attention_layernorm.weight", {H}, true);
    add(p + "mlp.gate_proj.weight", {c.intermediate, H}, false);
    add(p + "mlp.up_proj.weight", {c.intermediate, H}, false);
    add(p + "mlp.down_proj.weight", {H, c.intermediate}, false);
  }
  add("fc.weight", {H, int64_t(c.n_taps) * H}, false);
  add("hidden_norm.weight", {H}, true);
  add("norm.weight", {H}, true);
  return out;
}

template <typename T>
DrafterParams<T>::DrafterParams(const DrafterConfig& cfg) : layout(drafter_param_layout(cfg)), cfg_(cfg) {
  flat.assign(param_count(layout), T(0));
  bind();
}

template <typename T>
DrafterParams<T>::DrafterParams(const DrafterParams& o) : flat(o.flat), layout(o.layout), cfg_(o.cfg_) {
  bind();
}

template <typename T>
DrafterParams<T>& DrafterParams<T>::operator=(const DrafterParams& o) {
  flat = o.flat;
  layout = o.layout;
  cfg_ = o.cfg_;
  bind();
  return *this;
}

template <typename T>
DrafterWeights<T> DrafterWeights<T>::bind(const DrafterConfig& cfg, T* flat) {
  // Each view by its export name in the layout (not by position), so reordering or adding tensors there cannot
  // shift a view onto the wrong tensor.
  const std::vector<ParamInfo> layout = drafter_param_layout(cfg);
  auto at = [&](const std::string& name) {
    auto it = std::find_if(layout.begin(), layout.end(), [&](const ParamInfo& p) { return p.name == name; });
    DFLASH_CHECK(it != layout.end(), "drafter parameter layout has no tensor '{}'", name);
    return flat + it->offset;
  };
  DrafterWeights<T> w;
  w.layers.resize(cfg.layers);
  for (int i = 0; i < cfg.layers; ++i) {
    DrafterLayerWeights<T>& l = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    l.input_layernorm = at(p + "input_layernorm.weight");
    l.q_proj = at(p + "self_attn.q_proj.weight");
    l.k_proj = at(p + "self_attn.k_proj.weight");
    l.v_proj = at(p + "self_attn.v_proj.weight");
    l.o_proj = at(p + "self_attn.o_proj.weight");
    l.q_norm = at(p + "self_attn.q_norm.weight");
    l.k_norm = at(p + "self_attn.k_norm.weight");
    l.post_attention_layernorm = at(p + "post_attention_layernorm.weight");
    l.gate_proj = at(p + "mlp.gate_proj.weight");
    l.up_proj = at(p + "mlp.up_proj.weight");
    l.down_proj = at(p + "mlp.down_proj.weight");
  }
  w.fc = at("fc.weight");
  w.hidden_norm = at("hidden_norm.weight");
  w.norm = at("norm.weight");
  return w;
}

template <typename T>
void DrafterParams<T>::bind() {
  static_cast<DrafterWeights<T>&>(*this) = DrafterWeights<T>::bind(cfg_, flat.data());
}

template <typename T>
void DrafterParams<T>::init_random(uint64_t seed, double init_std) {
  for (size_t t = 0; t < layout.size(); ++t) {
    const ParamInfo& p = layout[t];
    Rng rng(seed, 1000 + t);  // one stream per tensor: adding a layer does not reshuffle the others
    T* x = data(p);
    for (size_t k = 0; k < p.numel; ++k) x[k] = p.is_norm ? T(1) : T(init_std * rng.normal());
  }
}

template <typename T>
void DrafterParams<T>::zero() {
  std::fill(flat.begin(), flat.end(), T(0));
}

template struct DrafterWeights<float>;
template struct DrafterWeights<double>;
template struct DrafterWeights<kernels::bf16>;  // views of the bf16 compute copy of the weights (CUDA)
template class DrafterParams<float>;
template class DrafterParams<double>;

}  // namespace dflash::model
