#pragma once
// The drafter's trainable parameters: one flat allocation with named views (llm.c style), in the export naming
// of docs/export.md. Gradients use the same type and layout.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/model/drafter_config.h"

namespace dflash::model {

struct ParamInfo {
  std::string name;            // export name, e.g. "layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // PyTorch layout: linear weights are [out, in]
  size_t offset = 0;           // elements from the start of the flat buffer
  size_t numel = 0;
  bool is_norm = false;        // RMSNorm weight (initialised to 1)
};

// The parameter list in a fixed order: layers.{i}.*, then fc, hidden_norm, norm.
std::vector<ParamInfo> drafter_param_layout(const DrafterConfig& cfg);
// Elements of a layout's flat buffer; of the drafter's (counted, nothing allocated).
inline size_t param_count(const std::vector<ParamInfo>& layout) {
  return layout.empty() ? 0 : layout.back().offset + layout.back().numel;
}
inline size_t drafter_param_count(const DrafterConfig& cfg) { return param_count(drafter_param_layout(cfg)); }

template <typename T>
struct DrafterLayerWeights {  // the Hugging Face names, as the target's TargetLayer
  T* input_layernorm;           // [H]
  T* q_proj;                    // [NH*D, H]
  T* k_proj;                    // [KVH*D, H]  shared by context and block keys
  T* v_proj;                    // [KVH*D, H]
  T* o_proj;                    // [H, NH*D]
  T* q_norm;                    // [D]         per-head RMSNorm before RoPE
  T* k_norm;                    // [D]
  T* post_attention_layernorm;  // [H]
  T* gate_proj;                 // [I, H]
  T* up_proj;                   // [I, H]
  T* down_proj;                 // [H, I]
};

// Named views of every drafter tensor over one flat buffer in the layout of drafter_param_layout (host or device
// memory: the views never dereference). Forward and backward take weights and gradients as views.
template <typename T>
struct DrafterWeights {
  std::vector<DrafterLayerWeights<T>> layers;  // [L]
  T* fc = nullptr;           // [H, n_taps*H]  projects the concatenated taps
  T* hidden_norm = nullptr;  // [H]            RMSNorm of the context after fc
  T* norm = nullptr;         // [H]            final RMSNorm

  static DrafterWeights bind(const DrafterConfig& cfg, T* flat);
};

// Host parameters (fp32 master weights, or double in tests): the flat buffer and its views.
template <typename T>
class DrafterParams : public DrafterWeights<T> {
 public:
  explicit DrafterParams(const DrafterConfig& cfg);  // zero-filled
  DrafterParams(const DrafterParams& other);
  DrafterParams& operator=(const DrafterParams& other);

  std::vector<T> flat;  // every parameter, contiguous (all-reduce and AdamW see one buffer)
  std::vector<ParamInfo> layout;

  // Linear weights ~ N(0, init_std²), norm weights = 1; deterministic in seed.
  void init_random(uint64_t seed, double init_std);
  void zero();
  T* data(const ParamInfo& p) { return flat.data() + p.offset; }
  const T* data(const ParamInfo& p) const { return flat.data() + p.offset; }

 private:
  DrafterConfig cfg_;
  void bind();
};

}  // namespace dflash::model
