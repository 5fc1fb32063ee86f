#include "lib/model/random_target.h"

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
  auto norm = [&](std::string name, int64_t n) { return tensor(std::move(name), {n}, 0.1, 1.0); };

  // group the tensors by file: file 0 gets the embedding and the first layers, the last file the final norm/head
  std::vector<std::vector<io::TensorToWrite>> files(size_t(spec.files));
  auto file_of_layer = [&](int l) { return size_t(int64_t(l) * spec.files / (c.layers + 1)); };
  files[0].push_back(tensor("model.embed_tokens.weight", {V, H}, 1.0, 0.0));
  for (int l = 0; l < c.layers; ++l) {
    auto& f = files[file_of_layer(l)];
    auto n = [&](const char* what) { return fmt::format("model.layers.{}.{}.weight", l, what); };
    f.push_back(norm(n("input_layernorm"), H));
    f.push_back(linear(n("self_attn.q_proj"), c.heads * hd, H));
    f.push_back(linear(n("self_attn.k_proj"), c.kv_heads * hd, H));
    f.push_back(linear(n("self_attn.v_proj"), c.kv_heads * hd, H));
    f.push_back(norm(n("self_attn.q_norm"), hd));
    f.push_back(norm(n("self_attn.k_norm"), hd));
    f.push_back(linear(n("self_attn.o_proj"), H, c.heads * hd));
    f.push_back(norm(n("post_attention_layernorm"), H));
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

void apply_target_options(const Args& a, RandomTargetSpec& s) {
  s.hidden = int(a.integer("hidden", s.hidden));
  s.layers = int(a.integer("layers", s.layers));
  s.heads = int(a.integer("heads", s.heads));
  s.kv_heads = int(a.integer("kv-heads", s.kv_heads));
  s.head_dim = int(a.integer("head-dim", s.head_dim));
  s.intermediate = int(a.integer("intermediate", s.intermediate));
  s.vocab = int(a.integer("vocab", s.vocab));
  s.seed = uint64_t(a.integer("seed", int64_t(s.seed)));
  s.files = int(a.integer("files", s.files));
  s.rope_theta = a.real("rope-theta", s.rope_theta);
  if (a.has("tie")) s.tie = true;
  if (a.has("dtype")) {
    const std::string dtype = a.str("dtype", "");
    DFLASH_USER_CHECK(dtype == "f32" || dtype == "bf16", "--dtype must be f32 or bf16, got '{}'", dtype);
    s.dtype = dtype == "bf16" ? io::DType::BF16 : io::DType::F32;
  }
}

}  // namespace dflash::model
