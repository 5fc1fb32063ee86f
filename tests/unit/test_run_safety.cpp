// What a run never does to a user's files and what it refuses before it starts (docs/checkpoints.md "What is never
// deleted", docs/running.md "Bounds"): a fresh start over an earlier run is refused or moves it aside, nothing is
// deleted; the best checkpoint survives a requeue; non-finite weights are not exported or evaluated; τ without a
// verify is null; absurd sizes are refused by name; a memory plan above the machine is refused with its numbers; a
// generation past the target's positions is refused; the target's identity tells two same-shape targets apart.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/eval/spec_decode.h"
#include "lib/io/dataset.h"
#include "lib/model/drafter_export.h"
#include "lib/model/generate.h"
#include "lib/model/random_target.h"
#include "lib/model/target_identity.h"
#include "lib/preflight/memory_plan.h"
#include "lib/state/best_checkpoint.h"
#include "lib/state/checkpoint.h"
#include "lib/state/drafter_source.h"
#include "lib/state/out_dir_guard.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace dflash;
using namespace dflash::state;
using namespace dflash::eval;
using namespace dflash::preflight;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A complete step checkpoint of the small drafter at `step` under out_dir.
void save_step(const std::string& out_dir, int64_t step) {
  const model::DrafterConfig cfg = test::small_drafter_config();
  model::DrafterParams<float> params(cfg);
  params.init_random(7, 0.1);
  state::TrainingState s;
  s.step = step;
  s.config_hash = "0x0000000000000000";
  state::save_checkpoint(out_dir, cfg, params, model::AdamWState{}, s);
}

TrainConfig config_for(const std::string& out_dir, const std::string& resume, bool start_over = false) {
  TrainConfig c;
  c.run.out_dir = out_dir;
  c.ckpt.resume = resume;
  c.run.start_over = start_over;
  return c;
}

}  // namespace

TEST_CASE("out_dir guard: a fresh start over an earlier run is refused, naming its files, and touches nothing") {
  const std::string out = test::scratch_dir("guard_refuse").string();
  save_step(out, 4);
  write_text(fs::path(out) / "drafter_final.safetensors", "final weights");
  write_text(fs::path(out) / "metrics.jsonl", "{\"step\":1}\n");
  fs::copy(fs::path(out) / "ckpt" / "step_00000004", fs::path(out) / "ckpt" / "best", fs::copy_options::recursive);

  const std::string e = error_of([&] { state::guard_out_dir(config_for(out, "none")); });
  CHECK(e.find("holds an earlier run (ckpt/step_00000004, ckpt/best, drafter_final.safetensors, metrics.jsonl)") !=
        std::string::npos);
  CHECK(e.find("ckpt.resume: auto") != std::string::npos);
  CHECK(e.find("run.start_over: true") != std::string::npos);
  CHECK(read_text(fs::path(out) / "drafter_final.safetensors") == "final weights");
  CHECK(fs::exists(fs::path(out) / "ckpt" / "best" / "DONE"));
  CHECK(fs::exists(fs::path(out) / "ckpt" / "step_00000004" / "DONE"));
}

TEST_CASE("out_dir guard: run.start_over moves the earlier run to superseded/ and deletes nothing") {
  const std::string out = test::scratch_dir("guard_start_over").string();
  save_step(out, 4);
  write_text(fs::path(out) / "drafter_final.safetensors", "final weights");
  write_text(fs::path(out) / "metrics.jsonl", "{\"step\":1}\n");
  const std::string notice = state::guard_out_dir(config_for(out, "none", /*start_over=*/true));
  CHECK(notice.find("moved to") != std::string::npos);
  CHECK(!fs::exists(fs::path(out) / "ckpt"));
  CHECK(!fs::exists(fs::path(out) / "drafter_final.safetensors"));
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(fs::path(out) / "superseded")) aside.push_back(e.path());
  REQUIRE(aside.size() == 1);
  CHECK(fs::exists(aside[0] / "ckpt" / "step_00000004" / "DONE"));
  CHECK(read_text(aside[0] / "drafter_final.safetensors") == "final weights");
  CHECK(read_text(aside[0] / "metrics.jsonl") == "{\"step\":1}\n");
  CHECK(state::earlier_run_files(config_for(out, "none")).empty());  // now a clean start
}

TEST_CASE("out_dir guard: a requeue with ckpt.resume auto and no step checkpoint keeps ckpt/best") {
  const std::string out = test::scratch_dir("guard_requeue").string();
  save_step(out, 3);
  fs::rename(fs::path(out) / "ckpt" / "step_00000003", fs::path(out) / "ckpt" / "best");  // only best is left
  write_text(fs::path(out) / "metrics.jsonl", "{\"step\":1}\n");  // this job's earlier attempt
  CHECK(state::earlier_run_files(config_for(out, "auto")).empty());
  CHECK(state::guard_out_dir(config_for(out, "auto")).empty());
  // the best checkpoint object reads it as the value to beat and never deletes it
  const BestCheckpoint best(out, TauMetric::spec_tau);
  CHECK(fs::exists(fs::path(out) / "ckpt" / "best" / "DONE"));
  CHECK(best.notice().find("another metric") != std::string::npos);
  // with ckpt.resume none it is an earlier run's best: refused
  CHECK(error_of([&] { state::guard_out_dir(config_for(out, "none")); }).find("ckpt/best") != std::string::npos);
}

TEST_CASE("out_dir guard: final weights without a checkpoint cannot be resumed and are not replaced") {
  const std::string out = test::scratch_dir("guard_final").string();
  write_text(fs::path(out) / "drafter_final.safetensors", "final weights");
  CHECK(error_of([&] { state::guard_out_dir(config_for(out, "auto")); }).find("drafter_final.safetensors") !=
        std::string::npos);
  save_step(out, 8);  // with a checkpoint to resume, the files are the run's own
  CHECK(state::earlier_run_files(config_for(out, "auto")).empty());
  CHECK(state::earlier_run_files(config_for(test::scratch_dir("guard_empty").string(), "none")).empty());
}

TEST_CASE("export and eval refuse non-finite weights, naming the tensor and the first index") {
  const model::DrafterConfig cfg = test::small_drafter_config();
  model::DrafterParams<float> params(cfg);
  params.init_random(3, 0.1);
  const model::ParamInfo& p = params.layout[1];
  params.flat[p.offset + 5] = std::numeric_limits<float>::quiet_NaN();
  const std::string e = error_of([&] { model::require_finite_weights(cfg, params, "weights.safetensors"); });
  CHECK(e.find("weights.safetensors: tensor " + p.name + " has nan at flat index 5") != std::string::npos);
  const std::string dir = test::scratch_dir("export_nan").string();
  const model::DrafterExportInfo info{{1, 2, 3}, 6, 128};
  CHECK(error_of([&] { model::export_drafter(cfg, params, info, dir, io::DType::F32); }).find("has nan") !=
        std::string::npos);
  CHECK(!fs::exists(fs::path(dir) / "config.json"));
  params.flat[p.offset + 5] = std::numeric_limits<float>::infinity();
  CHECK(error_of([&] { model::require_finite_weights(cfg, params, "x"); }).find("has inf") != std::string::npos);
  params.flat[p.offset + 5] = 0.5f;
  model::export_drafter(cfg, params, info, dir, io::DType::F32);
  CHECK(state::load_drafter_source(dir).kind == "export");
}

TEST_CASE("tau is null, with the reason, when no verify ran") {
  eval::SpecSummary none(4);
  none.prompts = 2;
  const nlohmann::ordered_json j = none.to_json();
  CHECK(j["tau"].is_null());
  CHECK(j["tau_undefined"].get<std::string>().find("no verify forward ran") != std::string::npos);
  eval::SpecSummary some(4);
  some.verifies = 2, some.kept_in_verifies = 5;
  CHECK(some.to_json()["tau"].get<double>() == doctest::Approx(2.5));
}

TEST_CASE("config: absurd model sizes are refused by name with the allowed range") {
  for (const char* set : {"drafter.layers=100000", "drafter.intermediate=1000000000", "drafter.heads=100000",
                          "drafter.head_dim=100000", "layout.packets_in_flight=1000000", "eval.max_new_tokens=1000000000"}) {
    CAPTURE(set);
    TrainConfig c;
    const std::string key = std::string(set).substr(0, std::string(set).find('='));
    CHECK(error_of([&] { apply_override(c, set); }).find("key '" + key + "' must be in [") != std::string::npos);
  }
}

TEST_CASE("memory plan: the CPU backend's items, and a refusal that names every rank and the machine") {
  preflight::MemoryPlanInputs in;
  in.target.hidden = 64, in.target.vocab = 1000, in.target.heads = 4, in.target.kv_heads = 2, in.target.head_dim = 16;
  in.target.intermediate = 128, in.target.tie_word_embeddings = true;
  in.target_rank_params = 1000;
  in.drafter = test::small_drafter_config();
  in.drafter.hidden = 64, in.drafter.vocab = 1000;
  in.max_seq_len = 32, in.anchors_per_seq = 4, in.chunk_size = 16;
  in.cuda = false, in.bf16 = false;
  const GpuMemoryPlan cpu = gpu_memory_plan(in);
  CHECK(cpu.drafter.items[0].what == "target embedding + lm_head (frozen, fp32)");
  CHECK(cpu.drafter.items[0].bytes == 1000.0 * 64 * 4);  // tied: one matrix
  in.cuda = true;
  CHECK(preflight::gpu_memory_plan(in).drafter.items[0].bytes == 2.0 * 1000 * 64 * 2);
  CHECK(preflight::memory_does_not_fit({{"world rank 0 (target)", 4e9}, {"world rank 1 (drafter)", 5e9}}, 10e9, "node1")
            .empty());
  const std::string e =
      preflight::memory_does_not_fit({{"world rank 0 (target)", 4e9}, {"world rank 1 (drafter)", 7e9}}, 10e9, "node1");
  CHECK(e.find("does not fit node1: its ranks need 11.00 GB, it has 10.00 GB") != std::string::npos);
  CHECK(e.find("world rank 1 (drafter)") != std::string::npos);
  CHECK(preflight::machine_memory_bytes() > 0);
}

TEST_CASE("generation: a prompt plus max_new_tokens past max_position_embeddings is refused with what fits") {
  const std::string file = (test::scratch_dir("gen_fits") / "prompts.h5").string();
  // two prompts of 10 and 40 tokens (loss_mask 0), each followed by one answer token
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  for (int len : {10, 40}) {
    for (int i = 0; i < len; ++i) tokens.push_back(1 + i % 7), mask.push_back(0);
    tokens.push_back(3), mask.push_back(1);
  }
  io::write_dataset(file, tokens, {0, 11, 52}, mask);
  const io::Dataset prompts(file, 64);
  model::QwenConfig c;
  c.max_position_embeddings = 64;
  model::check_generation_fits(c, "tgt", prompts, 2, 20, 4, "--max-new-tokens");  // 40 + 20 + 4 = 64
  const std::string e = error_of([&] { model::check_generation_fits(c, "tgt", prompts, 2, 21, 4, "--max-new-tokens"); });
  CHECK(e.find("--max-new-tokens = 21: prompt 1 of") != std::string::npos);
  CHECK(e.find("max_position_embeddings 64 (tgt/config.json); give at most 20 new tokens") != std::string::npos);
  c.max_position_embeddings = 0;  // unknown: no bound from the target
  model::check_generation_fits(c, "tgt", prompts, 2, 1 << 20, 4, "--max-new-tokens");
}

TEST_CASE("target identity: equal for a copy, different when one weight changes, stable across calls") {
  const fs::path a = test::scratch_dir("ident_a"), b = test::scratch_dir("ident_b");
  model::write_random_target(a.string(), test::small_random_target(false, 2, 11));
  fs::copy(a, b, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  const std::string ia = model::target_identity(a.string());
  CHECK(ia.find("sampled content 0x") != std::string::npos);
  CHECK(model::target_identity(b.string()) == ia);
  // one byte of the first tensor's data: the safetensors data section starts after the 8-byte length + header
  {
    std::fstream f(b / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    f.read(reinterpret_cast<char*>(&header), 8);
    f.seekp(std::streamoff(8 + header + 1));
    const char flipped = 0x5a;
    f.write(&flipped, 1);
  }
  CHECK(model::target_identity(b.string()) != ia);
  CHECK(model::target_identity(a.string()) == ia);
}
