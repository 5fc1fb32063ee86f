// checkpoint: save → load bit-exact round trip, DONE-less and junk directories ignored, truncated / corrupted files
// refused naming the file, layout / shape / config-hash mismatches refused naming the field and both values,
// version check, retention.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fd_check.h"
#include "test_util.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/state/checkpoint.h"
#include "lib/io/safetensors.h"

namespace fs = std::filesystem;
using namespace dflash;
using namespace dflash::io;
using namespace dflash::state;

namespace {

std::string temp_dir(const std::string& name) { return dflash::test::scratch_dir(name).string(); }

struct Run {
  model::DrafterConfig cfg = dflash::test::small_drafter_config();
  model::DrafterParams<float> params{cfg};
  model::AdamWState opt;
  TrainingState state;

  explicit Run(int64_t step, uint64_t seed = 1) {
    params.init_random(seed, 0.3);
    auto m = test::random_vector(params.flat.size(), seed + 100, 1e-3);
    auto v = test::random_vector(params.flat.size(), seed + 200, 1e-6);
    opt.m.assign(m.begin(), m.end());
    opt.v.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) opt.v[i] = float(v[i] * v[i]);  // second moments are >= 0
    opt.step = step + 3;  // differs from the trainer step: both must come back
    state.step = step;
    state.data = {2, 17, 0xfedcba9876543210ULL};
    state.layout = {5, 1, 3, 2};
    state.config_hash = "0x0123456789abcdef";
    state.rng = {{5, 42, 5, 123456789012345ULL}, {6, 42, 6, 0xffffffffffffffffULL}, {7, 42, 7, 0}};
    state.extra = {{"lr", 5.5e-4}, {"export", {{"num_target_layers", 36}}}};
  }

  CheckpointExpectation expected() const { return {state.layout, cfg, state.config_hash}; }
};

std::string load_error(const std::string& dir, const CheckpointExpectation& x) {
  try {
    state::load_checkpoint(dir, x);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("checkpoint: save then load is bit-exact for weights, moments and state") {
  const std::string out = temp_dir("roundtrip");
  Run run(1234);
  const std::string dir = state::save_checkpoint(out, run.cfg, run.params, run.opt, run.state);
  CHECK(dir == (fs::path(out) / "ckpt" / "step_00001234").string());
  CHECK(dir == state::checkpoint_dir(out, 1234));
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json", "DONE"})
    CHECK_MESSAGE(fs::is_regular_file(fs::path(dir) / f), f);
  for (const auto& e : fs::directory_iterator(dir))  // no temporary left behind
    CHECK_MESSAGE(e.path().extension() != ".tmp", e.path().string());
  CHECK(state::find_latest_checkpoint(out) == dir);

  state::LoadedCheckpoint ck = load_checkpoint(dir, run.expected());
  CHECK(ck.dir == dir);
  CHECK(same_bits(ck.params.flat, run.params.flat));
  CHECK(same_bits(ck.optimizer.m, run.opt.m));
  CHECK(same_bits(ck.optimizer.v, run.opt.v));
  CHECK(ck.optimizer.step == 1237);
  CHECK(ck.state.step == 1234);
  CHECK(ck.state.data.epoch == 2);
  CHECK(ck.state.data.step_in_epoch == 17);
  CHECK(ck.state.data.shuffle_seed == 0xfedcba9876543210ULL);
  CHECK(ck.state.layout.target_tp == 5);
  CHECK(ck.state.layout.target_groups == 1);
  CHECK(ck.state.layout.drafter_dp == 3);
  CHECK(ck.state.layout.micro_batches == 2);
  CHECK(ck.state.config_hash == "0x0123456789abcdef");
  REQUIRE(ck.state.rng.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(ck.state.rng[i].rank == run.state.rng[i].rank);
    CHECK(ck.state.rng[i].seed == run.state.rng[i].seed);
    CHECK(ck.state.rng[i].stream == run.state.rng[i].stream);
    CHECK(ck.state.rng[i].counter == run.state.rng[i].counter);
  }
  CHECK(ck.state.extra == run.state.extra);
  CHECK(ck.drafter.hidden == 16);
  CHECK(ck.drafter.window == std::vector<int>{0, 5});
  CHECK(ck.drafter.rope_theta == 10000.0);
  CHECK(ck.drafter.rms_norm_eps == 1e-6);

  // the weights file is a plain fp32 safetensors in the export names
  SafetensorsFile model((fs::path(dir) / "model.safetensors").string());
  CHECK(model.info("layers.1.self_attn.q_proj.weight").shape == std::vector<int64_t>{24, 16});
  CHECK(model.info("fc.weight").dtype == DType::F32);
  SafetensorsFile moments((fs::path(dir) / "optimizer.safetensors").string());
  CHECK(moments.has("exp_avg.norm.weight"));
  CHECK(moments.has("exp_avg_sq.layers.0.mlp.down_proj.weight"));
}

TEST_CASE("checkpoint: an optimizer that has not stepped round-trips as empty moments") {
  const std::string out = temp_dir("empty_opt");
  Run run(0);
  run.opt = model::AdamWState{};
  const std::string dir = state::save_checkpoint(out, run.cfg, run.params, run.opt, run.state);
  state::LoadedCheckpoint ck = load_checkpoint(dir, run.expected());
  CHECK(ck.optimizer.m.empty());
  CHECK(ck.optimizer.v.empty());
  CHECK(ck.optimizer.step == 0);
  CHECK(same_bits(ck.params.flat, run.params.flat));
}

TEST_CASE("checkpoint: re-saving a step replaces it") {
  const std::string out = temp_dir("resave");
  Run first(50, 1), second(50, 2);
  state::save_checkpoint(out, first.cfg, first.params, first.opt, first.state);
  const std::string dir = save_checkpoint(out, second.cfg, second.params, second.opt, second.state);
  state::LoadedCheckpoint ck = load_checkpoint(dir, second.expected());
  CHECK(same_bits(ck.params.flat, second.params.flat));
  CHECK_FALSE(same_bits(ck.params.flat, first.params.flat));
}

TEST_CASE("checkpoint: find_latest skips directories without DONE and junk names") {
  const std::string out = temp_dir("latest");
  CHECK(state::find_latest_checkpoint(out) == "");  // no ckpt/ at all
  CHECK(state::find_latest_checkpoint(out + "/does_not_exist") == "");
  Run a(10), b(20);
  const std::string d10 = state::save_checkpoint(out, a.cfg, a.params, a.opt, a.state);
  const std::string d20 = save_checkpoint(out, b.cfg, b.params, b.opt, b.state);
  CHECK(state::find_latest_checkpoint(out) == d20);
  fs::remove(fs::path(d20) / "DONE");  // a save of step 20 that crashed before DONE
  CHECK(state::find_latest_checkpoint(out) == d10);
  // junk: bad names, too few digits, a plain file, a newer directory without DONE but with the other files
  const fs::path root = fs::path(out) / "ckpt";
  fs::create_directories(root / "step_abcdefgh");
  std::ofstream(root / "step_abcdefgh" / "DONE") << "{}";
  fs::create_directories(root / "step_99");
  std::ofstream(root / "step_99" / "DONE") << "{}";
  std::ofstream(root / "step_00000999") << "not a directory";
  fs::create_directories(root / "step_00000500");
  fs::copy_file(fs::path(d10) / "model.safetensors", root / "step_00000500" / "model.safetensors");
  CHECK(state::find_latest_checkpoint(out) == d10);
  // the step is parsed, not compared as text: 9 digits sort after 8
  Run c(100000000);
  const std::string big = save_checkpoint(out, c.cfg, c.params, c.opt, c.state);
  CHECK(fs::path(big).filename() == "step_100000000");
  CHECK(state::find_latest_checkpoint(out) == big);
  // loading a directory without DONE is refused, saying why
  const std::string err = load_error(d20, b.expected());
  CHECK(err.find("no DONE marker") != std::string::npos);
  CHECK(err.find(d20) != std::string::npos);
}

TEST_CASE("checkpoint: a truncated or corrupted file in a DONE-marked directory is refused naming the file") {
  const std::string out = temp_dir("corrupt");
  Run run(7);
  const std::string dir = state::save_checkpoint(out, run.cfg, run.params, run.opt, run.state);
  const fs::path model = fs::path(dir) / "model.safetensors";
  const uintmax_t size = fs::file_size(model);

  SUBCASE("truncated") {
    fs::resize_file(model, size - 100);
    const std::string err = load_error(dir, run.expected());
    INFO(err);
    CHECK(err.find("model.safetensors has " + std::to_string(size - 100) + " bytes, DONE recorded " +
                   std::to_string(size) + " (truncated or overwritten)") != std::string::npos);
    CHECK(err.find(dir) != std::string::npos);
    CHECK(err.find("delete this directory to resume from the previous checkpoint") != std::string::npos);
  }
  SUBCASE("one flipped byte, same size") {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(size - 5));
    f.put('\x7f');
    f.close();
    const std::string err = load_error(dir, run.expected());
    INFO(err);
    CHECK(err.find("model.safetensors has hash 0x") != std::string::npos);
    CHECK(err.find("(the file is corrupted)") != std::string::npos);
  }
  SUBCASE("optimizer file missing") {
    fs::remove(fs::path(dir) / "optimizer.safetensors");
    const std::string err = load_error(dir, run.expected());
    INFO(err);
    CHECK(err.find("optimizer.safetensors is missing but DONE lists it") != std::string::npos);
  }
  SUBCASE("state.json edited") {
    std::string text = slurp(fs::path(dir) / "state.json");
    text.replace(text.find("\"step\": 7"), 9, "\"step\": 8");
    std::ofstream(fs::path(dir) / "state.json", std::ios::binary) << text;
    const std::string err = load_error(dir, run.expected());
    INFO(err);
    CHECK(err.find("state.json has hash") != std::string::npos);
  }
}

TEST_CASE("checkpoint: the DONE hash is checkpoint_hash of the file bytes, a newer format version is refused") {
  const std::string out = temp_dir("version");
  Run run(3);
  const std::string dir = state::save_checkpoint(out, run.cfg, run.params, run.opt, run.state);
  const fs::path state = fs::path(dir) / "state.json", done = fs::path(dir) / "DONE";
  std::string text = slurp(state);
  auto done_json = nlohmann::json::parse(slurp(done));
  auto hash_hex = [](const std::string& bytes) {
    return fmt::format("0x{:016x}", state::checkpoint_hash(bytes.data(), bytes.size()));
  };
  bool found = false;
  for (auto& f : done_json["files"]) {
    if (f["name"] == "state.json") {
      CHECK(f["hash"] == hash_hex(text));  // the streamed file hash equals the in-memory definition
      CHECK(f["bytes"] == text.size());
      found = true;
    }
  }
  REQUIRE(found);
  // rewrite state.json with version 2 and a DONE that matches it: the version check must be what refuses it
  text.replace(text.find("\"version\": 1"), 12, "\"version\": 2");
  std::ofstream(state, std::ios::binary) << text;
  for (auto& f : done_json["files"])
    if (f["name"] == "state.json") f["hash"] = hash_hex(text);
  std::ofstream(done, std::ios::binary) << done_json.dump();
  const std::string err = load_error(dir, run.expected());
  INFO(err);
  CHECK(err.find("format version 2, this build reads version 1") != std::string::npos);

  // hash definition: FNV-1a over 64-bit words, tail zero-padded, folded with the length
  const std::string tail = "abc";
  CHECK(state::checkpoint_hash(tail.data(), 3) !=
        state::checkpoint_hash("abc\0", 4));  // the length is part of the hash
  CHECK(state::checkpoint_hash("", 0) == mix64(0xcbf29ce484222325ULL));
}

TEST_CASE("checkpoint: layout, drafter shape and config hash mismatches name the field and both values") {
  const std::string out = temp_dir("mismatch");
  Run run(9);
  const std::string dir = state::save_checkpoint(out, run.cfg, run.params, run.opt, run.state);
  state::CheckpointExpectation x = run.expected();
  std::string err;

  x = run.expected();
  x.layout.drafter_dp = 2;
  err = load_error(dir, x);
  CHECK_MESSAGE(err.find("checkpoint layout drafter_dp=3, this run has drafter_dp=2") != std::string::npos, err);

  x = run.expected();
  x.layout.target_tp = 4;
  err = load_error(dir, x);
  CHECK_MESSAGE(err.find("checkpoint layout target_tp=5, this run has target_tp=4") != std::string::npos, err);

  x = run.expected();
  x.layout.micro_batches = 1;
  err = load_error(dir, x);
  CHECK_MESSAGE(err.find("checkpoint layout micro_batches=2, this run has micro_batches=1") != std::string::npos, err);

  x = run.expected();
  x.drafter.hidden = 32;
  err = load_error(dir, x);
  CHECK_MESSAGE(err.find("checkpoint drafter hidden=16, this run has hidden=32") != std::string::npos, err);

  x = run.expected();
  x.drafter.window = {0, 0};
  err = load_error(dir, x);
  CHECK_MESSAGE(err.find("checkpoint drafter window=[0, 5], this run has window=[0, 0]") != std::string::npos, err);

  x = run.expected();
  x.drafter.rope_theta = 1e6;
  err = load_error(dir, x);
  CHECK_MESSAGE(err.find("checkpoint drafter rope_theta=10000, this run has rope_theta=1000000") != std::string::npos,
                err);

  x = run.expected();
  x.config_hash = "0x00000000000000ff";
  err = load_error(dir, x);
  CHECK_MESSAGE(err.find("checkpoint config_hash=0x0123456789abcdef, this run has config_hash=0x00000000000000ff") !=
                    std::string::npos,
                err);
  CHECK(err.find(dir) != std::string::npos);

  CHECK(load_error(dir, run.expected()) == "");
}

TEST_CASE("checkpoint: prune keeps the newest k complete, deletes older ones and older crash leftovers") {
  const std::string out = temp_dir("prune");
  const fs::path root = fs::path(out) / "ckpt";
  CHECK(state::prune_checkpoints(out, 2).empty());  // nothing there
  for (int64_t s : {1, 2, 3, 4, 5, 6}) {
    Run r(s);
    state::save_checkpoint(out, r.cfg, r.params, r.opt, r.state);
  }
  fs::remove(root / "step_00000002" / "DONE");  // crash leftover older than the newest complete
  fs::remove(root / "step_00000006" / "DONE");  // newer than the newest complete: a save in progress
  fs::create_directories(root / "junk");

  SUBCASE("keep 0 keeps every complete one, drops the old leftover") {
    auto gone = state::prune_checkpoints(out, 0);
    CHECK(gone == std::vector<std::string>{(root / "step_00000002").string()});
    for (int s : {1, 3, 4, 5, 6}) CHECK(fs::exists(root / fmt::format("step_{:08d}", s)));
  }
  SUBCASE("keep 2") {
    auto gone = state::prune_checkpoints(out, 2);
    CHECK(gone == std::vector<std::string>{(root / "step_00000001").string(), (root / "step_00000002").string(),
                                           (root / "step_00000003").string()});
    CHECK_FALSE(fs::exists(root / "step_00000001"));
    CHECK_FALSE(fs::exists(root / "step_00000003"));
    CHECK(fs::exists(root / "step_00000004" / "DONE"));
    CHECK(fs::exists(root / "step_00000005" / "DONE"));
    CHECK(fs::exists(root / "step_00000006"));  // not ours to delete
    CHECK(fs::exists(root / "junk"));
    CHECK(state::find_latest_checkpoint(out) == (root / "step_00000005").string());
    CHECK(prune_checkpoints(out, 2).empty());  // idempotent
  }
  SUBCASE("keep 1 never deletes the newest complete") {
    state::prune_checkpoints(out, 1);
    CHECK(fs::exists(root / "step_00000005" / "DONE"));
    CHECK_FALSE(fs::exists(root / "step_00000004"));
    Run r(5);
    CHECK_NOTHROW(state::load_checkpoint((root / "step_00000005").string(), r.expected()));
  }
}

TEST_CASE("checkpoint: the recorded data cursor and RNG are checked against what the step implies for this run") {
  const std::string out = temp_dir("cursor");
  Run run(9);
  // what training_state() records for step 9 of a run with 4 steps per epoch, seed 42, 3 drafter ranks
  run.state.data = {2, 1, 42};
  run.state.rng = {{0, 42, 0, 9}, {1, 42, 1, 9}, {2, 42, 2, 9}};
  const std::string dir = state::save_checkpoint(out, run.cfg, run.params, run.opt, run.state);
  state::CheckpointExpectation x = run.expected();
  x.steps_per_epoch = 4;
  x.seed = 42;
  CHECK(load_error(dir, x) == "");
  x.steps_per_epoch = 0;  // not compared (hand-made expectations, older callers)
  CHECK(load_error(dir, x) == "");

  x.steps_per_epoch = 5;  // another number of sequences per epoch: step 9 would be epoch 1, step 4 of it
  std::string err = load_error(dir, x);
  CHECK_MESSAGE(err.find("data cursor (epoch 2, step_in_epoch 1, shuffle_seed 42) is not where step 9 lands in this "
                         "run (epoch 1, step_in_epoch 4, seed 42: 5 steps per epoch)") != std::string::npos,
                err);
  x.steps_per_epoch = 4;
  x.seed = 7;
  err = load_error(dir, x);
  CHECK_MESSAGE(err.find("shuffle_seed 42") != std::string::npos, err);

  run.state.rng[1].counter = 8;  // a rank's RNG not at the step
  const std::string dir2 = save_checkpoint(temp_dir("cursor_rng"), run.cfg, run.params, run.opt, run.state);
  x.seed = 42;
  err = load_error(dir2, x);
  CHECK_MESSAGE(err.find("drafter rank 1's RNG (rank 1, seed 42, stream 1, counter 8) is not the one step 9") !=
                    std::string::npos,
                err);
}
