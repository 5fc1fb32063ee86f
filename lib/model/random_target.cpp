#include "lib/model/random_target.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/core/rng.h"

namespace dflash::model {

QwenConfig RandomTargetSpec::config() const {
  QwenConfig c;
  c.hidden = hidden;
  c.layers = layers;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.intermediate = intermediate;
  c.vocab = vocab;
  c.rms_norm_eps = rms_norm_eps;
  c.rope_theta = rope_theta;
  c.tie_word_embeddings = tie;
  c.rotary_dim = head_dim;
  c.layer_types.assign(size_t(layers), LayerType::full_attention);
  if (experts > 0) {
    c.architecture = "Qwen3MoeForCausalLM";
    c.experts = experts;
    c.experts_per_token = experts_per_token;
    c.moe_intermediate = moe_intermediate;
    c.norm_topk_prob = norm_topk_prob || hybrid;  // the Qwen3.5/3.6 MoE router always renormalises
    c.moe_layers.assign(size_t(layers), true);
    if (hybrid) {
      DFLASH_USER_CHECK(mlp_only_layers.empty(), "random target: a Qwen3.5/3.6 MoE has experts in every layer "
                        "(no --mlp-only-layers)");
      c.intermediate = 0;
      c.shared_expert_intermediate = shared_expert_intermediate;
    }
    for (int l : mlp_only_layers) {
      DFLASH_USER_CHECK(l >= 0 && l < layers, "random target: --mlp-only-layers entry {} outside [0, {})", l, layers);
      c.moe_layers[size_t(l)] = false;
    }
  }
  if (hybrid) {
    c.hybrid = true;
    c.rotary_dim = int(head_dim * partial_rotary_factor);
    c.linear_k_heads = linear_k_heads;
    c.linear_v_heads = linear_v_heads;
    c.linear_k_dim = linear_k_dim;
    c.linear_v_dim = linear_v_dim;
    c.conv_kernel = conv_kernel;
    for (int l = 0; l < layers; ++l)
      c.layer_types[size_t(l)] = (l + 1) % full_attention_interval ? LayerType::linear_attention
                                                                   : LayerType::full_attention;
  }
  return c;
}

void write_random_target(const std::string& dir, const RandomTargetSpec& spec) {
  const QwenConfig c = spec.config();
  // validate through the same parser a reader uses, so a spec that cannot be loaded cannot be written
  parse_qwen_config(qwen_config_json(c), "random target spec");
  DFLASH_CHECK(spec.files >= 1 && spec.files <= spec.layers + 1, "random target: files {} must be in [1, layers+1]",
               spec.files);
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  DFLASH_CHECK(!ec, "random target: cannot create directory {}: {}", dir, ec.message());

  const int64_t H = c.hidden, hd = c.head_dim, I = c.intermediate, V = c.vocab;
  uint64_t stream = 0;
  // one tensor: `scale` · N(0,1) + `shift`, from its own stream so that sizes of other tensors do not matter
  auto tensor = [&](std::string name, std::vector<int64_t> shape, double scale, double shift) {
    const uint64_t s = stream++;
    const uint64_t seed = spec.seed;
    return io::TensorToWrite{std::move(name), spec.dtype, shape, [seed, s, shape, scale, shift](float* out) {
                               int64_t n = 1;
                               for (int64_t d : shape) n *= d;
                               Rng rng(seed, s);
                               for (int64_t i = 0; i < n; ++i) out[i] = float(shift + scale * rng.normal());
                             }};
  };
  auto linear = [&](std::string name, int64_t out, int64_t in) {
    return tensor(std::move(name), {out, in}, 1.0 / std::sqrt(double(in)), 0.0);
  };
  // hybrid RMSNorms store the offset from 1 (Qwen3.5 computes x̂ · (1 + w))
  auto norm = [&](std::string name, int64_t n) { return tensor(std::move(name), {n}, 0.1, c.hybrid ? 0.0 : 1.0); };

  // group the tensors by file: file 0 gets the embedding and the first layers, the last file the final norm/head
  std::vector<std::vector<io::TensorToWrite>> files(size_t(spec.files));
  auto file_of_layer = [&](int l) { return size_t(int64_t(l) * spec.files / (c.layers + 1)); };
  files[0].push_back(tensor("model.embed_tokens.weight", {V, H}, 1.0, 0.0));
  for (int l = 0; l < c.layers; ++l) {
    auto& f = files[file_of_layer(l)];
    auto n = [&](const char* what) { return fmt::format("model.layers.{}.{}.weight", l, what); };
    f.push_back(norm(n("input_layernorm"), H));
    if (c.is_linear(l)) {
      const int64_t key_dim = int64_t(c.linear_k_heads) * c.linear_k_dim;
      const int64_t value_dim = int64_t(c.linear_v_heads) * c.linear_v_dim, nv = c.linear_v_heads;
      const int64_t K = c.conv_kernel;
      auto param = [&](const char* what) { return fmt::format("model.layers.{}.linear_attn.{}", l, what); };
      f.push_back(linear(n("linear_attn.in_proj_qkv"), 2 * key_dim + value_dim, H));
      f.push_back(linear(n("linear_attn.in_proj_z"), value_dim, H));
      f.push_back(linear(n("linear_attn.in_proj_b"), nv, H));
      f.push_back(linear(n("linear_attn.in_proj_a"), nv, H));
      f.push_back(tensor(n("linear_attn.conv1d"), {2 * key_dim + value_dim, 1, K}, 1.0 / std::sqrt(double(K)), 0.0));
      f.push_back(tensor(param("A_log"), {nv}, 0.5, 0.0));
      f.push_back(tensor(param("dt_bias"), {nv}, 0.5, 0.0));
      f.push_back(tensor(n("linear_attn.norm"), {c.linear_v_dim}, 0.1, 1.0));
      f.push_back(linear(n("linear_attn.out_proj"), H, value_dim));
    } else {
      const int64_t qf = c.hybrid ? 2 : 1;  // hybrid q_proj: per head [query | output gate]
      f.push_back(linear(n("self_attn.q_proj"), qf * c.heads * hd, H));
      f.push_back(linear(n("self_attn.k_proj"), c.kv_heads * hd, H));
      f.push_back(linear(n("self_attn.v_proj"), c.kv_heads * hd, H));
      f.push_back(norm(n("self_attn.q_norm"), hd));
      f.push_back(norm(n("self_attn.k_norm"), hd));
      f.push_back(linear(n("self_attn.o_proj"), H, c.heads * hd));
    }
    f.push_back(norm(n("post_attention_layernorm"), H));
    if (c.is_moe(l)) {
      const int64_t E = c.experts, Im = c.moe_intermediate;
      f.push_back(linear(n("mlp.gate"), E, H));
      if (c.shared_expert_intermediate > 0) {
        const int64_t Is = c.shared_expert_intermediate;
        f.push_back(linear(n("mlp.shared_expert_gate"), 1, H));
        f.push_back(linear(n("mlp.shared_expert.gate_proj"), Is, H));
        f.push_back(linear(n("mlp.shared_expert.up_proj"), Is, H));
        f.push_back(linear(n("mlp.shared_expert.down_proj"), H, Is));
      }
      if (spec.fused_experts) {  // 3-D parameters without the .weight suffix; gate_up_proj: gate rows then up rows
        const std::string p = fmt::format("model.layers.{}.mlp.experts.", l);
        f.push_back(tensor(p + "gate_up_proj", {E, 2 * Im, H}, 1.0 / std::sqrt(double(H)), 0.0));
        f.push_back(tensor(p + "down_proj", {E, H, Im}, 1.0 / std::sqrt(double(Im)), 0.0));
      } else {
        for (int64_t e = 0; e < E; ++e) {
          const std::string p = fmt::format("mlp.experts.{}.", e);
          f.push_back(linear(n((p + "gate_proj").c_str()), Im, H));
          f.push_back(linear(n((p + "up_proj").c_str()), Im, H));
          f.push_back(linear(n((p + "down_proj").c_str()), H, Im));
        }
      }
      continue;
    }
    f.push_back(linear(n("mlp.gate_proj"), I, H));
    f.push_back(linear(n("mlp.up_proj"), I, H));
    f.push_back(linear(n("mlp.down_proj"), H, I));
  }
  files.back().push_back(norm("model.norm.weight", H));
  if (!c.tie_word_embeddings) files.back().push_back(tensor("lm_head.weight", {V, H}, 1.0 / std::sqrt(double(H)), 0.0));

  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (spec.files == 1) {
    io::write_safetensors((fs::path(dir) / "model.safetensors").string(), files[0], meta);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (int i = 0; i < spec.files; ++i) {
      const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, spec.files);
      io::write_safetensors((fs::path(dir) / name).string(), files[size_t(i)], meta);
      for (const auto& t : files[size_t(i)]) weight_map[t.name] = name;
    }
    std::ofstream idx(fs::path(dir) / "model.safetensors.index.json");
    idx << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", weight_map}}.dump(2) << "\n";
    DFLASH_CHECK(idx.good(), "random target: cannot write {}/model.safetensors.index.json", dir);
  }
  std::ofstream cfg(fs::path(dir) / "config.json");
  nlohmann::json j = qwen_config_json(c);
  j["torch_dtype"] = spec.dtype == io::DType::BF16 ? "bfloat16" : spec.dtype == io::DType::F16 ? "float16" : "float32";
  j["dflash_random_seed"] = spec.seed;
  cfg << j.dump(2) << "\n";
  DFLASH_CHECK(cfg.good(), "random target: cannot write {}/config.json", dir);
}

}  // namespace dflash::model
