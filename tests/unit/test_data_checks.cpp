// Inputs that used to be accepted silently (issue 12): data that trains nothing or the wrong thing, a resume on
// other data, a target whose config.json disagrees with its weights. Each is an error naming the file and fix.
#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/state/checkpoint.h"
#include "lib/io/dataset.h"
#include "lib/model/random_target.h"
#include "lib/train/data_facts.h"
#include "lib/preflight/target_check.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::state;
using namespace dflash::preflight;
using namespace dflash::train;
namespace fs = std::filesystem;

namespace {

// Two sequences: [1..6] with mask 0 0 1 1 1 1 and [7..10] with mask 0 1 1 0.
struct SmallData {
  std::vector<int32_t> tokens{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<int64_t> offsets{0, 6, 10};
  std::vector<uint8_t> mask{0, 0, 1, 1, 1, 1, 0, 1, 1, 0};
  std::string write(const std::string& name) const {
    const std::string path = (test::scratch_dir("data_checks_" + name) / "d.h5").string();
    io::write_dataset(path, tokens, offsets, mask);
    return path;
  }
};

TrainConfig config_for(const std::string& data_path, int block_size, int mask_token_id, int max_seq_len = 0) {
  TrainConfig c;
  c.data.path = data_path;
  c.drafter.block_size = block_size;
  c.drafter.mask_token_id = mask_token_id;
  c.data.max_seq_len = max_seq_len;
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("data checks: counts of trained tokens and anchor candidates, per sequence and within max_seq_len") {
  SmallData d;
  const std::string path = d.write("counts");
  io::Dataset data(path, 100, false);
  train::DataFacts f = scan_data_facts(data, 99, 0);
  CHECK(f.sequences == 2);
  CHECK(f.tokens == 10);
  CHECK(f.longest == 6);
  CHECK(f.trained_tokens == 6);
  CHECK(f.anchor_candidates == 4);  // (2,3) (3,4) (4,5) in the first; (1,2) in the second; none across sequences
  CHECK(f.mask_token_trained == 0);
  CHECK_NOTHROW(train::check_data_facts(f, config_for(path, 4, 99)));
  // max_seq_len 3: the first sequence streams 1 2 3 (mask 0 0 1), the second 7 8 9 (mask 0 1 1)
  f = train::scan_data_facts(data, 99, 3);
  CHECK(f.longest == 3);
  CHECK(f.trained_tokens == 3);
  CHECK(f.anchor_candidates == 1);
}

TEST_CASE("data checks: an all-zero loss mask is an error (nothing would be trained)") {
  SmallData d;
  d.mask.assign(d.mask.size(), 0);
  const std::string path = d.write("zero_mask");
  io::Dataset data(path, 100, false);
  const DataFacts f = scan_data_facts(data, 99, 0);
  CHECK(f.trained_tokens == 0);
  CHECK(error_of([&] { train::check_data_facts(f, config_for(path, 4, 99)); })
            .find(path + ": 0 of 10 tokens have loss_mask 1 and no trained token follows another: no anchor can be "
                         "drawn, nothing would be trained") != std::string::npos);
  // isolated trained tokens (1 0 1 0 ...) cannot anchor either
  SmallData alt;
  alt.mask = {1, 0, 1, 0, 1, 0, 1, 0, 1, 0};
  const std::string alt_path = alt.write("isolated_mask");
  io::Dataset alt_data(alt_path, 100, false);
  CHECK(error_of([&] {
          train::check_data_facts(train::scan_data_facts(alt_data, 99, 0), config_for(alt_path, 4, 99));
        }).find("5 of 10 tokens have loss_mask 1") != std::string::npos);
}

TEST_CASE("data checks: the mask token id at trained positions is an error naming the first one") {
  SmallData d;
  d.tokens[8] = 99;  // sequence 1, position 2: trained
  d.tokens[0] = 99;  // sequence 0, position 0: context only, allowed
  const std::string path = d.write("mask_token");
  io::Dataset data(path, 100, false);
  const DataFacts f = scan_data_facts(data, 99, 0);
  CHECK(f.mask_token_trained == 1);
  CHECK(f.first_mask_seq == 1);
  CHECK(f.first_mask_pos == 2);
  CHECK(error_of([&] {
          train::check_data_facts(f, config_for(path, 4, 99));
        }).find("1 trained position(s) hold drafter.mask_token_id = 99 (first: sequence 1, position 2)") !=
        std::string::npos);
}

TEST_CASE("data checks: block_size longer than every sequence is an error") {
  SmallData d;
  const std::string path = d.write("block");
  io::Dataset data(path, 100, false);
  const DataFacts f = scan_data_facts(data, 99, 0);
  CHECK_NOTHROW(train::check_data_facts(f, config_for(path, 6, 99)));
  CHECK(error_of([&] {
          train::check_data_facts(f, config_for(path, 7, 99));
        }).find("drafter.block_size = 7 is longer than every sequence of " + path + " (longest: 6 tokens)") !=
        std::string::npos);
  CHECK(error_of([&] {
          train::check_data_facts(train::scan_data_facts(data, 99, 5), config_for(path, 6, 99, 5));
        }).find("(longest after data.max_seq_len: 5 tokens)") != std::string::npos);
}

TEST_CASE("data checks: the identity follows the content, not the path, one token or mask bit changes it") {
  SmallData d;
  io::Dataset a(d.write("id_a"), 100, false), b(d.write("id_b"), 100, false);
  const std::string id = train::scan_data_facts(a, 99, 0).identity();
  CHECK(id.rfind("2 sequences, 10 tokens, content 0x", 0) == 0);
  CHECK(scan_data_facts(b, 99, 0).identity() == id);
  SmallData token = d, mask = d, split = d;
  token.tokens[9] = 11;
  mask.mask[0] = 1;
  split.offsets = {0, 5, 10};  // same tokens, other sequence boundaries
  for (auto* other : {&token, &mask, &split}) {
    io::Dataset c(other->write("id_other"), 100, false);
    CHECK(scan_data_facts(c, 99, 0).identity() != id);
  }
}

TEST_CASE("data checks: a checkpoint records its dataset's identity, a resume on other data is refused") {
  const std::string out = test::scratch_dir("data_checks_ckpt").string();
  const model::DrafterConfig cfg = test::small_drafter_config();
  model::DrafterParams<float> params(cfg);
  params.init_random(1, 0.3);
  state::TrainingState state;
  state.step = 4;
  state.layout = {5, 1, 3, 1};
  state.config_hash = "0x0123456789abcdef";
  state.dataset = "64 sequences, 4980 tokens, content 0x00000000000000aa";
  const std::string dir = state::save_checkpoint(out, cfg, params, model::AdamWState{}, state);
  state::CheckpointExpectation x{state.layout, cfg, state.config_hash, state.dataset};
  CHECK(state::load_checkpoint(dir, x).state.dataset == state.dataset);
  x.dataset = "64 sequences, 4980 tokens, content 0x00000000000000bb";
  CHECK(error_of([&] { state::load_checkpoint(dir, x); })
            .find("trained on the dataset '64 sequences, 4980 tokens, content 0x00000000000000aa', this run's "
                  "data.path is '64 sequences, 4980 tokens, content 0x00000000000000bb'") != std::string::npos);
  x.dataset = "";  // a caller that does not know its data (export, inspection) does not compare
  CHECK_NOTHROW(state::load_checkpoint(dir, x));
}

namespace {

model::RandomTargetSpec small_target(bool tie) {
  model::RandomTargetSpec s;
  s.hidden = 16, s.layers = 2, s.heads = 2, s.kv_heads = 1, s.head_dim = 8, s.intermediate = 24, s.vocab = 32;
  s.tie = tie;
  return s;
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j;
  std::ifstream(dir + "/config.json") >> j;
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(2);
}

}  // namespace

TEST_CASE("target check: every expected tensor is verified from the headers, a bare config.json is refused") {
  const std::string dir = test::scratch_dir("target_check_ok").string();
  model::write_random_target(dir, small_target(false));
  const TargetWeightsSummary s = check_target_weights(dir, model::load_qwen_config(dir));
  CHECK(s.tensors == 3 + 2 * 11);  // embed, norm, lm_head + 11 per layer
  CHECK(s.dtypes.at("F32") == s.tensors);
  CHECK(s.parameters == 2 * 32 * 16 + 16 + 2 * (2 * 16 + 2 * 8 + 16 * 16 + 2 * 8 * 16 + 16 * 16 + 3 * 24 * 16));

  const std::string bare = test::scratch_dir("target_check_bare").string();
  fs::copy_file(dir + "/config.json", bare + "/config.json");
  CHECK_THROWS_AS(preflight::check_target_weights(bare, model::load_qwen_config(bare)), Error);
}

TEST_CASE("target check: wrong shapes, missing tensors, extra layers and a tied config over an untied model") {
  const std::string dir = test::scratch_dir("target_check_bad").string();
  model::write_random_target(dir, small_target(false));
  SUBCASE("config.json with fewer layers than the weights") {
    edit_config(dir, [](nlohmann::json& j) { j["num_hidden_layers"] = 1; });
    CHECK(error_of([&] { preflight::check_target_weights(dir, model::load_qwen_config(dir)); })
              .find("config.json says num_hidden_layers = 1 but the weights hold decoder layers up to 1 "
                    "(model.layers.1.*)") != std::string::npos);
  }
  SUBCASE("config.json with more layers than the weights: the missing tensors are listed") {
    edit_config(dir, [](nlohmann::json& j) { j["num_hidden_layers"] = 3; });
    const std::string e = error_of([&] { preflight::check_target_weights(dir, model::load_qwen_config(dir)); });
    CHECK(e.find("target.path " + dir + ": the weights do not match config.json (11 problem(s))") != std::string::npos);
    CHECK(e.find("missing tensor model.layers.2.input_layernorm.weight (expected shape [16])") != std::string::npos);
  }
  SUBCASE("tie_word_embeddings true while lm_head.weight exists") {
    edit_config(dir, [](nlohmann::json& j) { j["tie_word_embeddings"] = true; });
    CHECK(error_of([&] {
            preflight::check_target_weights(dir, model::load_qwen_config(dir));
          }).find("tie_word_embeddings: true but the weights hold a separate lm_head.weight") != std::string::npos);
  }
  SUBCASE("a shape that disagrees with config.json") {
    edit_config(dir, [](nlohmann::json& j) { j["intermediate_size"] = 20; });
    CHECK(error_of([&] {
            preflight::check_target_weights(dir, model::load_qwen_config(dir));
          }).find("tensor model.layers.0.mlp.gate_proj.weight has shape [24, 16], config.json implies [20, 16]") !=
          std::string::npos);
  }
}

TEST_CASE("target check: MoE targets (per-expert and fused experts, a shared expert) pass, and a missing "
          "expert is named") {
  // the transformers-made fixtures of tests/golden_moe (per-expert Qwen3-MoE, fused Qwen3-MoE, fused Qwen3.5 MoE
  // with a shared expert under model.language_model.)
  for (const char* name : {"per_expert", "fused", "qwen3_5_moe"}) {
    const std::string dir = std::string(DFLASH_GOLDEN_MOE_DIR) + "/" + name;
    INFO(dir);
    const model::QwenConfig c = model::load_qwen_config(dir);
    REQUIRE(c.experts > 0);
    const TargetWeightsSummary s = check_target_weights(dir, c);
    CHECK(s.tensors > 0);
  }
  // a per-expert checkpoint whose config.json asks for one expert more than it holds
  const std::string src = std::string(DFLASH_GOLDEN_MOE_DIR) + "/per_expert";
  const std::string dir = test::scratch_dir("target_check_moe").string();
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(src + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  const int experts = model::load_qwen_config(dir).experts;
  edit_config(dir, [&](nlohmann::json& j) {
    for (const char* k : {"num_experts", "num_local_experts"})
      if (j.contains(k)) j[k] = experts + 1;
  });
  const std::string e = error_of([&] { preflight::check_target_weights(dir, model::load_qwen_config(dir)); });
  CHECK(e.find(fmt::format("mlp.experts.{}.gate_proj.weight", experts)) != std::string::npos);
  CHECK(e.find("has shape") != std::string::npos);  // the router holds E rows, config.json says E + 1
}
