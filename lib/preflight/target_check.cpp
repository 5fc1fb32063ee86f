#include "lib/preflight/target_check.h"

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lib/core/error.h"
#include "lib/io/safetensors.h"
#include "lib/model/target.h"
#include "lib/model/target_shard.h"

namespace dflash::preflight {

namespace {

struct Expected {
  std::string name;
  std::vector<int64_t> shape;
};

// What lib/model/target.cpp (TargetModel, load_target_vocab) reads, by name and full shape: dense Qwen3 layers, or
// for the Qwen3.5/3.6 hybrids Gated DeltaNet layers (linear_attn.*) and gated attention (q_proj holds query and
// output gate, 2·head_dim rows per head), and the routed experts of MoE layers, under the config's weight prefix.
// MoE layers: `has` tells which of the two expert layouts the checkpoint holds.
template <typename Has>
std::vector<Expected> expected_tensors(const model::QwenConfig& c, Has has) {
  const int64_t H = c.hidden, hd = c.head_dim, V = c.vocab, I = c.intermediate;
  const std::string& pre = c.weight_prefix;
  std::vector<Expected> e = {{pre + "embed_tokens.weight", {V, H}}, {pre + "norm.weight", {H}}};
  if (!c.tie_word_embeddings) e.push_back({"lm_head.weight", {V, H}});
  for (int l = 0; l < c.layers; ++l) {
    auto layer = [&](const char* what, std::vector<int64_t> shape, const char* suffix = ".weight") {
      e.push_back({fmt::format("{}layers.{}.{}{}", pre, l, what, suffix), std::move(shape)});
    };
    layer("input_layernorm", {H});
    layer("post_attention_layernorm", {H});
    if (c.hybrid && c.is_linear(l)) {
      const int64_t conv = c.linear_conv_dim(), value_dim = int64_t(c.linear_v_heads) * c.linear_v_dim;
      layer("linear_attn.in_proj_qkv", {conv, H});
      layer("linear_attn.conv1d", {conv, 1, c.conv_kernel});
      layer("linear_attn.in_proj_z", {value_dim, H});
      layer("linear_attn.in_proj_b", {c.linear_v_heads, H});
      layer("linear_attn.in_proj_a", {c.linear_v_heads, H});
      layer("linear_attn.A_log", {c.linear_v_heads}, "");
      layer("linear_attn.dt_bias", {c.linear_v_heads}, "");
      layer("linear_attn.norm", {c.linear_v_dim});
      layer("linear_attn.out_proj", {H, value_dim});
    } else {
      const int64_t qf = c.hybrid ? 2 : 1;
      layer("self_attn.q_norm", {hd});
      layer("self_attn.k_norm", {hd});
      layer("self_attn.q_proj", {qf * c.heads * hd, H});
      layer("self_attn.k_proj", {c.kv_heads * hd, H});
      layer("self_attn.v_proj", {c.kv_heads * hd, H});
      layer("self_attn.o_proj", {H, c.heads * hd});
    }
    if (!c.is_moe(l)) {
      layer("mlp.gate_proj", {I, H});
      layer("mlp.up_proj", {I, H});
      layer("mlp.down_proj", {H, I});
      continue;
    }
    // routed experts (docs/target.md, "Mixture of experts"): the router, then the experts fused and 3-D without
    // a .weight suffix (released Qwen3.5/3.6 MoE BF16) or one tensor per expert (Qwen3-MoE, FP8 and re-saved copies)
    const int64_t E = c.experts, MI = c.moe_intermediate;
    layer("mlp.gate", {E, H});
    if (has(fmt::format("{}layers.{}.mlp.experts.gate_up_proj", pre, l))) {
      layer("mlp.experts.gate_up_proj", {E, 2 * MI, H}, "");
      layer("mlp.experts.down_proj", {E, H, MI}, "");
    } else {
      for (int x = 0; x < c.experts; ++x) {
        layer(fmt::format("mlp.experts.{}.gate_proj", x).c_str(), {MI, H});
        layer(fmt::format("mlp.experts.{}.up_proj", x).c_str(), {MI, H});
        layer(fmt::format("mlp.experts.{}.down_proj", x).c_str(), {H, MI});
      }
    }
    if (c.shared_expert_intermediate > 0) {
      const int64_t SI = c.shared_expert_intermediate;
      layer("mlp.shared_expert.gate_proj", {SI, H});
      layer("mlp.shared_expert.up_proj", {SI, H});
      layer("mlp.shared_expert.down_proj", {H, SI});
      layer("mlp.shared_expert_gate", {1, H});
    }
  }
  return e;
}

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The decoder layer a tensor name belongs to ("model.layers.12.mlp..." -> 12), or -1.
int layer_of(const std::string& name, const std::string& prefix) {
  const std::string head = prefix + "layers.";
  if (name.rfind(head, 0) != 0) return -1;
  size_t i = head.size();
  int l = 0;
  bool digits = false;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && l < 1000000; ++i, digits = true) l = l * 10 + (name[i] - '0');
  return digits && i < name.size() && name[i] == '.' ? l : -1;
}

}  // namespace

TargetWeightsSummary check_target_weights(const std::string& dir, const model::QwenConfig& c) {
  const io::Checkpoint ckpt(dir);  // reads model.safetensors(.index.json) and the headers it needs
  std::vector<std::string> problems;
  TargetWeightsSummary summary;
  for (const Expected& e : expected_tensors(c, [&](const std::string& name) { return ckpt.has(name); })) {
    if (!ckpt.has(e.name)) {
      problems.push_back(fmt::format("missing tensor {} (expected shape {})", e.name, shape_text(e.shape)));
      continue;
    }
    const io::TensorInfo& t = ckpt.info(e.name);  // the header parse already refused dtypes other than BF16/F16/F32
    if (t.shape != e.shape) {
      problems.push_back(
          fmt::format("tensor {} has shape {}, config.json implies {}", e.name, shape_text(t.shape), shape_text(e.shape)));
      continue;
    }
    ++summary.tensors;
    summary.parameters += t.numel();
    ++summary.dtypes[io::dtype_name(t.dtype)];
  }
  int top_layer = -1;
  for (const std::string& name : ckpt.names()) top_layer = std::max(top_layer, layer_of(name, c.weight_prefix));
  if (top_layer >= c.layers)
    problems.push_back(fmt::format("config.json says num_hidden_layers = {} but the weights hold decoder layers up to "
                                   "{} (model.layers.{}.*): config.json belongs to another model",
                                   c.layers, top_layer, top_layer));
  if (c.tie_word_embeddings && ckpt.has("lm_head.weight"))
    problems.push_back("config.json says tie_word_embeddings: true but the weights hold a separate lm_head.weight: "
                       "the output projection would silently be the embedding; set tie_word_embeddings to false if "
                       "the model is untied");
  if (!problems.empty()) {
    std::string list;
    const size_t shown = std::min<size_t>(problems.size(), 12);
    for (size_t i = 0; i < shown; ++i) list += "\n  " + problems[i];
    if (shown < problems.size()) list += fmt::format("\n  ... and {} more", problems.size() - shown);
    DFLASH_USER_FAIL("target.path {}: the weights do not match config.json ({} problem(s)):{}", dir, problems.size(),
                     list);
  }
  return summary;
}

std::vector<report::CheckItem> target_items(const std::string& model_dir, const model::QwenConfig& target,
                                            const std::vector<int>& tap_ids, int target_tp, bool has_weights,
                                            const TargetWeightsSummary& weights) {
  std::vector<report::CheckItem> items;
  items.push_back({"target", {fmt::format("{}: {} layers, H {}, {} Q / {} KV heads, vocab {}; taps {}", model_dir,
                                          target.layers, target.hidden, target.heads, target.kv_heads, target.vocab,
                                          fmt::join(tap_ids, ","))}});
  if (target.experts > 0) {  // how the routed experts split over the TP ranks (each holds its share, uneven allowed)
    std::vector<int> held;
    for (int r = 0; r < target_tp; ++r)
      held.push_back(model::plan_target_shard(target, target_tp, r, model::TargetOptions{}.mlp_grain).expert_count);
    int moe = 0;
    for (int l = 0; l < target.layers; ++l) moe += target.is_moe(l) ? 1 : 0;
    items.push_back(
        {"experts", {fmt::format("{} routed (top {}, width {}{}) in {} of {} layers; TP ranks hold {}", target.experts,
                                 target.experts_per_token, target.moe_intermediate,
                                 target.shared_expert_intermediate > 0
                                     ? fmt::format(", shared expert {}", target.shared_expert_intermediate)
                                     : "",
                                 moe, target.layers, fmt::join(held, ","))}});
  }
  if (!has_weights) {
    items.push_back({"target weights", {"NOT CHECKED (none present)"}, report::Verdict::incomplete,
                     fmt::format("{} holds config.json but no model.safetensors(.index.json): the plan below comes "
                                 "from config.json; the job needs the weights", model_dir)});
    return items;
  }
  std::string dtypes;
  for (const auto& [dtype, count] : weights.dtypes)
    dtypes += fmt::format("{}{} x {}", dtypes.empty() ? "" : ", ", count, dtype);
  items.push_back({"target weights", {fmt::format("{} tensors with the shapes config.json implies ({}), {:.3g} "
                                                  "parameters", weights.tensors, dtypes, double(weights.parameters))}});
  return items;
}
}  // namespace dflash::preflight
