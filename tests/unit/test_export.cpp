// export: f32 export → load → bit-identical drafter_forward; bf16 export → load → weights rounded to nearest even
// and forward within a stated tolerance; config.json keys and values; export from a checkpoint (extra.export,
// overrides, the error when the target facts are missing).
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fd_check.h"
#include "test_util.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/state/checkpoint.h"
#include "lib/model/drafter_export.h"
#include "lib/model/drafter.h"

namespace fs = std::filesystem;
using namespace dflash;
using namespace dflash::io;
using namespace dflash::model;
using namespace dflash::state;

namespace {

std::string temp_dir(const std::string& name) { return dflash::test::scratch_dir(name).string(); }

DrafterExportInfo tiny_info() { return {{1, 4, 6}, 8, 4096}; }

constexpr int kSeqLen = 14;
const std::vector<int> kAnchors = {0, 4, 5, 12};

// One sequence's inputs for drafter_forward (as tests/unit/test_drafter.cpp builds them).
struct Inputs {
  std::vector<float> taps, embed;
  std::vector<int32_t> tokens;
  explicit Inputs(const model::DrafterConfig& cfg) {
    auto t = test::random_vector(size_t(kSeqLen) * cfg.n_taps * cfg.hidden, 9);
    auto e = test::random_vector(size_t(cfg.vocab) * cfg.hidden, 10);
    taps.assign(t.begin(), t.end());
    embed.assign(e.begin(), e.end());
    Rng rng(11);
    for (int i = 0; i < kSeqLen; ++i) tokens.push_back(int32_t(rng.below(cfg.vocab - 1)));
  }
  std::vector<float> forward(const model::DrafterConfig& cfg, const model::DrafterParams<float>& w) const {
    model::DrafterInputs<float> in;
    in.taps = taps.data();
    in.tokens = tokens.data();
    in.seq_len = kSeqLen;
    in.anchors = kAnchors.data();
    in.n_anchors = int(kAnchors.size());
    in.embed = embed.data();
    model::DrafterActivations<float> acts;
    model::drafter_forward(cfg, w, in, acts);
    return std::vector<float>(acts.out, acts.out + size_t(acts.n_blocks) * cfg.block_size * cfg.hidden);
  }
};

model::DrafterParams<float> trained_like(const model::DrafterConfig& cfg) {
  model::DrafterParams<float> w(cfg);
  w.init_random(7, 0.3);
  auto noise = test::random_vector(w.flat.size(), 8, 0.1);
  for (const auto& p : w.layout)  // norm weights away from exactly 1, so that bf16 rounding touches them too
    if (p.is_norm)
      for (size_t k = 0; k < p.numel; ++k) w.flat[p.offset + k] += float(noise[p.offset + k]);
  return w;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_same_config(const model::DrafterConfig& a, const model::DrafterConfig& b) {
  CHECK(a.hidden == b.hidden);
  CHECK(a.layers == b.layers);
  CHECK(a.heads == b.heads);
  CHECK(a.kv_heads == b.kv_heads);
  CHECK(a.head_dim == b.head_dim);
  CHECK(a.intermediate == b.intermediate);
  CHECK(a.block_size == b.block_size);
  CHECK(a.n_taps == b.n_taps);
  CHECK(a.vocab == b.vocab);
  CHECK(a.mask_token_id == b.mask_token_id);
  CHECK(a.rope_theta == b.rope_theta);
  CHECK(a.rms_norm_eps == b.rms_norm_eps);
  CHECK(a.window == b.window);
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

}  // namespace

TEST_CASE("export: f32 export loads back bit-exact and drafter_forward is bit-identical") {
  const model::DrafterConfig cfg = dflash::test::small_drafter_config();
  const model::DrafterParams<float> w = trained_like(cfg);
  const std::string dir = temp_dir("f32");
  export_drafter(cfg, w, tiny_info(), dir, DType::F32);
  CHECK_FALSE(fs::exists(fs::path(dir) / "model.safetensors.tmp"));
  CHECK_FALSE(fs::exists(fs::path(dir) / "config.json.tmp"));

  ExportedDrafter back = load_exported_drafter(dir);
  check_same_config(back.config, cfg);
  CHECK(back.dtype == DType::F32);
  CHECK(back.info.target_layer_ids == tiny_info().target_layer_ids);
  CHECK(back.info.num_target_layers == 8);
  CHECK(back.info.max_position_embeddings == 4096);
  CHECK(same_bits(back.params.flat, w.flat));

  Inputs in(cfg);
  const auto ref = in.forward(cfg, w);
  const auto got = in.forward(back.config, back.params);
  CHECK(same_bits(got, ref));
}

TEST_CASE("export: bf16 export rounds to nearest even and drafter_forward stays within bf16 tolerance") {
  const model::DrafterConfig cfg = dflash::test::small_drafter_config();
  const model::DrafterParams<float> w = trained_like(cfg);
  const std::string dir = temp_dir("bf16");
  export_drafter(cfg, w, tiny_info(), dir, DType::BF16);

  SafetensorsFile st((fs::path(dir) / "model.safetensors").string());
  CHECK(st.info("layers.0.self_attn.q_proj.weight").dtype == DType::BF16);
  CHECK(st.metadata().at("format") == "pt");
  // 2 bytes per parameter plus the header
  CHECK(fs::file_size(fs::path(dir) / "model.safetensors") < 2 * w.flat.size() + 8192);

  ExportedDrafter back = load_exported_drafter(dir);
  CHECK(back.dtype == DType::BF16);
  check_same_config(back.config, cfg);
  size_t changed = 0;
  for (size_t i = 0; i < w.flat.size(); ++i) {
    const float rounded = bf16_to_float(float_to_bf16(w.flat[i]));
    REQUIRE(back.params.flat[i] == rounded);  // exactly the round-to-nearest-even value
    changed += rounded != w.flat[i];
  }
  CHECK(changed > w.flat.size() / 2);  // the export really is bf16

  // Tolerance: bf16 keeps 8 significant bits (relative rounding <= 2^-9 per weight); through two layers and the
  // final RMSNorm the output moves by about 1% of its largest magnitude (measured 0.030 of 3.15); bound: 2%.
  Inputs in(cfg);
  const auto ref = in.forward(cfg, w);
  const auto got = in.forward(back.config, back.params);
  REQUIRE(got.size() == ref.size());
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(got[i] - ref[i])));
    max_ref = std::max(max_ref, double(std::fabs(ref[i])));
  }
  INFO("bf16 forward: max |diff| = " << max_diff << ", max |out| = " << max_ref);
  CHECK(max_diff > 0);
  CHECK(max_diff <= 0.02 * max_ref);
}

TEST_CASE("export: config.json has every DFlash key with the right values") {
  const model::DrafterConfig cfg = dflash::test::small_drafter_config();
  const std::string dir = temp_dir("config");
  export_drafter(cfg, trained_like(cfg), tiny_info(), dir, DType::BF16);
  const nlohmann::json j = read_json(fs::path(dir) / "config.json");
  CHECK(j["architectures"] == nlohmann::json::array({"DFlashDraftModel"}));
  CHECK(j["model_type"] == "qwen3");
  CHECK(j["hidden_size"] == 16);
  CHECK(j["intermediate_size"] == 20);
  CHECK(j["num_attention_heads"] == 4);
  CHECK(j["num_key_value_heads"] == 2);
  CHECK(j["head_dim"] == 6);
  CHECK(j["num_hidden_layers"] == 2);
  CHECK(j["rms_norm_eps"] == 1e-6);
  CHECK(j["rope_theta"] == 10000.0);
  CHECK(j["vocab_size"] == 40);
  CHECK(j["max_position_embeddings"] == 4096);
  CHECK(j["tie_word_embeddings"] == false);
  CHECK(j["layer_types"] == nlohmann::json::array({"full_attention", "sliding_attention"}));
  CHECK(j["sliding_window"] == 5);
  CHECK(j["use_sliding_window"] == true);
  CHECK(j["block_size"] == 4);
  CHECK(j["num_target_layers"] == 8);
  CHECK(j["dflash_config"]["mask_token_id"] == 39);
  CHECK(j["dflash_config"]["target_layer_ids"] == nlohmann::json::array({1, 4, 6}));
  CHECK(j["dtype"] == "bfloat16");
  CHECK(!j.contains("torch_dtype"));
  CHECK(j["auto_map"] == nlohmann::json({{"AutoModel", "modeling_dflash.DFlashDraftModel"}}));

  // tensor names are the DFlash ones, [out, in]
  SafetensorsFile st((fs::path(dir) / "model.safetensors").string());
  CHECK(st.names().size() == 2 * 11 + 3);
  CHECK(st.info("fc.weight").shape == std::vector<int64_t>{16, 48});
  CHECK(st.info("hidden_norm.weight").shape == std::vector<int64_t>{16});
  CHECK(st.info("norm.weight").shape == std::vector<int64_t>{16});
  CHECK(st.info("layers.1.self_attn.k_norm.weight").shape == std::vector<int64_t>{6});
  CHECK(st.info("layers.1.mlp.down_proj.weight").shape == std::vector<int64_t>{16, 20});
  CHECK(st.info("layers.0.post_attention_layernorm.weight").shape == std::vector<int64_t>{16});

  // all-full drafters write no window
  model::DrafterConfig full = cfg;
  full.window = {};
  const std::string dir2 = temp_dir("config_full");
  export_drafter(full, trained_like(full), tiny_info(), dir2, DType::F32);
  const nlohmann::json j2 = read_json(fs::path(dir2) / "config.json");
  CHECK(j2["layer_types"] == nlohmann::json::array({"full_attention", "full_attention"}));
  CHECK(j2["sliding_window"].is_null());
  CHECK(j2["use_sliding_window"] == false);
  CHECK(j2["dtype"] == "float32");
  CHECK(load_exported_drafter(dir2).config.window == std::vector<int>{0, 0});
}

TEST_CASE("export: bad target facts are refused naming the field") {
  const model::DrafterConfig cfg = dflash::test::small_drafter_config();
  const model::DrafterParams<float> w = trained_like(cfg);
  const std::string dir = temp_dir("bad_info");
  auto err = [&](DrafterExportInfo info) {
    try {
      export_drafter(cfg, w, info, dir, DType::F32);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  DrafterExportInfo i = tiny_info();
  i.target_layer_ids = {1, 4};
  CHECK(err(i).find("2 target_layer_ids [1, 4] for a drafter with n_taps=3") != std::string::npos);
  i = tiny_info();
  i.target_layer_ids = {1, 4, 8};
  CHECK(err(i).find("target_layer_ids [1, 4, 8] has 8, outside the target's layers [0, 8)") != std::string::npos);
  i = tiny_info();
  i.max_position_embeddings = 0;
  CHECK(err(i).find("max_position_embeddings must be positive") != std::string::npos);
  model::DrafterConfig two_windows = cfg;
  two_windows.window = {3, 5};
  CHECK_THROWS_WITH_AS(export_drafter(two_windows, model::DrafterParams<float>(two_windows), tiny_info(), dir, DType::F32),
                       doctest::Contains("sliding layers have windows 3 and 5"), Error);
}

TEST_CASE("export: from a checkpoint directory, target facts from extra.export or explicit overrides") {
  const model::DrafterConfig cfg = dflash::test::small_drafter_config();
  const model::DrafterParams<float> w = trained_like(cfg);
  const std::string out = temp_dir("from_ckpt");
  model::AdamWState opt;
  state::TrainingState state;
  state.step = 40;
  state.layout = {5, 1, 3, 1};
  state.config_hash = "0x0000000000000001";
  state.extra["export"] = export_info_json(tiny_info());
  const std::string step_dir = state::save_checkpoint(out, cfg, w, opt, state);

  const std::string exp = (fs::path(out) / "export").string();
  state::export_checkpoint(step_dir, exp, DType::F32);
  ExportedDrafter back = load_exported_drafter(exp);
  CHECK(same_bits(back.params.flat, w.flat));
  CHECK(back.info.target_layer_ids == tiny_info().target_layer_ids);
  CHECK(back.info.max_position_embeddings == 4096);

  DrafterExportInfo over;
  over.max_position_embeddings = 8192;
  export_checkpoint(step_dir, exp, DType::F32, over);
  back = load_exported_drafter(exp);
  CHECK(back.info.max_position_embeddings == 8192);
  CHECK(back.info.num_target_layers == 8);

  // a checkpoint without extra.export needs the values explicitly
  state.step = 41;
  state.extra = nlohmann::json::object();
  const std::string bare = save_checkpoint(out, cfg, w, opt, state);
  CHECK_THROWS_WITH_AS(export_checkpoint(bare, exp, DType::F32), doctest::Contains("num_target_layers must be positive"),
                       Error);
  export_checkpoint(bare, exp, DType::BF16, tiny_info());
  CHECK(load_exported_drafter(exp).dtype == DType::BF16);
}
