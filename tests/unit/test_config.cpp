// The training config: defaults, file values, --set overrides, every kind of user error with its message,
// the resolved YAML round trip and the hash.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include <unistd.h>
#include <fstream>
#include <sstream>

#include "lib/config/config.h"
#include "lib/config/schema.h"
#include "lib/core/error.h"

using namespace dflash;

// CHECK that `text` contains `part`, printing both on failure.
#define CHECK_HAS(text, part)                                                                              \
  do {                                                                                                     \
    std::string text_ = (text);                                                                            \
    CHECK_MESSAGE(text_.find(part) != std::string::npos, "'" << text_ << "'\n  should contain '" << (part) << "'"); \
  } while (0)

namespace {

// The keys without defaults, so that a config loads.
const std::string kRequired =
    "target:\n  path: /models/qwen3-8b\n"
    "drafter:\n  mask_token_id: 151669\n"
    "data:\n  path: data/train.h5\n";

std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    load_config_text(yaml, sets, "config.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("config: defaults come from the struct and the required keys must be given") {
  TrainConfig c = load_config_text(kRequired, {}, "config.yaml");
  CHECK(c.run.name == "dflash");
  CHECK(c.run.device == kernels::Device::cpu);
  CHECK(c.layout.target_tp == 5);
  CHECK(c.layout.target_groups == 1);
  CHECK(c.layout.drafter_dp == 3);
  CHECK(c.layout.transport == comm::TransportChoice::automatic);
  CHECK(c.layout.packets_in_flight == 2);
  CHECK(c.target.n_taps == 5);
  CHECK(c.target.target_layer_ids.empty());
  CHECK(c.drafter.layers == 5);
  CHECK(c.drafter.block_size == 16);
  CHECK(c.drafter.init_std == 0.02);
  CHECK(c.loss.chunk_size == 1024);
  CHECK(c.loss.mode == model::VocabLossMode::recompute);
  CHECK(config_value(c, "loss.mode") == "recompute");  // the enum prints as the file spells it
  CHECK(c.loss.anchors_per_seq == 512);
  CHECK(c.optim.lr == 6e-4);
  CHECK(c.optim.beta2 == 0.95);
  CHECK(c.optim.warmup_ratio == 0.04);
  CHECK(c.optim.grad_clip == 1.0);
  CHECK(c.data.shuffle == true);
  CHECK(c.ckpt.keep == 2);
  CHECK(c.ckpt.resume == "none");
  CHECK(c.log.every == 10);
  CHECK(c.log.level == "info");
  // required values as given
  CHECK(c.target.path == "/models/qwen3-8b");
  CHECK(c.drafter.mask_token_id == 151669);
  CHECK(c.data.path == "data/train.h5");
  CHECK(c.source.at("target.path") == ConfigSource::kFile);
  CHECK(c.source.count("optim.lr") == 0);  // default

  CHECK_HAS(error_of("data:\n  path: d.h5\ndrafter:\n  mask_token_id: 7\n"), "required key 'target.path' is missing");
  CHECK_HAS(error_of("target:\n  path: m\ndata:\n  path: d.h5\n"), "required key 'drafter.mask_token_id' is missing");
  CHECK_HAS(error_of("target:\n  path: m\ndata:\n  path: d.h5\n"), "--set drafter.mask_token_id=");
}

TEST_CASE("config: file values of every type are parsed") {
  TrainConfig c = load_config_text(
      "run: {name: tiny, seed: 1234, device: cuda, steps: 300}\n"
      "layout: {target_tp: 2, drafter_dp: 2, transport: nccl}\n"
      "target:\n  path: /m\n  n_taps: 3\n  target_layer_ids: [1, 17, 33]\n"
      "drafter:\n  mask_token_id: 151669\n  layers: 2\n  sliding_window: 2048\n"
      "  layer_types: [sliding, full]\n  rope_theta: 1.0e+7\n"
      "optim:\n  lr: 3e-4\n  beta2: 0.999\n  micro_batches: 4\n"
      "data:\n  path: d.h5\n  shuffle: false\n",
      {}, "config.yaml");
  CHECK(c.run.name == "tiny");
  CHECK(c.run.seed == 1234);
  CHECK(c.run.device == kernels::Device::cuda);
  CHECK(c.run.steps == 300);
  CHECK(c.layout.target_tp == 2);
  CHECK(c.layout.transport == comm::TransportChoice::nccl);
  CHECK(c.target.target_layer_ids == std::vector<int>{1, 17, 33});
  CHECK(c.drafter.layer_types == std::vector<std::string>{"sliding", "full"});
  CHECK(c.drafter.rope_theta == 1e7);
  CHECK(c.optim.lr == 3e-4);
  CHECK(c.optim.beta2 == 0.999);
  CHECK(c.optim.micro_batches == 4);
  CHECK(c.data.shuffle == false);
  CHECK(c.source.at("optim.lr") == ConfigSource::kFile);
}

TEST_CASE("config: --set overrides apply after the file, with the same validation") {
  TrainConfig c = load_config_text(kRequired + "optim:\n  lr: 3e-4\n",
                                   {"optim.lr=1e-3", "data.shuffle=false", "target.target_layer_ids=[2,9,16,23,30]",
                                    "run.out_dir=/tmp/x: y", "loss.mode=fused"},
                                   "config.yaml");
  CHECK(c.optim.lr == 1e-3);
  CHECK(c.data.shuffle == false);
  CHECK(c.target.target_layer_ids == std::vector<int>{2, 9, 16, 23, 30});
  CHECK(c.run.out_dir == "/tmp/x: y");  // strings are taken verbatim
  CHECK(c.loss.mode == model::VocabLossMode::fused);
  CHECK(config_value(c, "loss.mode") == "fused");
  CHECK(c.source.at("optim.lr") == ConfigSource::kSet);
  // a --set can supply a required key
  TrainConfig d = load_config_text("target: {path: m}\ndata: {path: d.h5}\n", {"drafter.mask_token_id=7"}, "c.yaml");
  CHECK(d.drafter.mask_token_id == 7);

  CHECK_HAS(error_of(kRequired, {"optim.lr=abc"}), "--set optim.lr=abc: key 'optim.lr' expects a");
  CHECK_HAS(error_of(kRequired, {"optim.lr"}), "expected key=value");
  CHECK_HAS(error_of(kRequired, {"optim.lrr=1"}), "--set optim.lrr=1: unknown key 'optim.lrr' (did you mean 'optim.lr'?)");
  CHECK_HAS(error_of(kRequired, {"optim.beta1=1"}), "key 'optim.beta1' must be in [0, 1), got 1");
}

TEST_CASE("config: unknown keys name the path and suggest the closest key") {
  CHECK_HAS(error_of(kRequired + "optim:\n  lrr: 1e-3\n"), "config.yaml:8: unknown key 'optim.lrr' (did you mean 'optim.lr'?)");
  // the right key in the wrong section
  CHECK_HAS(error_of(kRequired + "optim:\n  block_size: 8\n"), "unknown key 'optim.block_size' (did you mean 'drafter.block_size'?)");
  // unknown section
  CHECK_HAS(error_of(kRequired + "optimizer:\n  lr: 1\n"), "unknown key 'optimizer' (did you mean 'optim'?)");
  // nothing close: the keys of the section are listed
  CHECK_HAS(error_of(kRequired + "optim:\n  learning_rate_peak: 1\n"), "unknown key 'optim.learning_rate_peak'; keys of 'optim': lr, weight_decay");
  CHECK(suggest_config_key("drafter.kv_head") == "drafter.kv_heads");
  CHECK(edit_distance("optim.lrr", "optim.lr") == 1);
}

TEST_CASE("config: wrong types, enum values, ranges and cross-key rules are errors naming the key") {
  CHECK_HAS(error_of(kRequired + "optim:\n  lr: fast\n"), "config.yaml:8: key 'optim.lr' expects a finite float, found 'fast'");
  CHECK_HAS(error_of(kRequired + "drafter:\n  layers: 2.5\n"), "key 'drafter.layers' expects an int, found '2.5'");
  CHECK_HAS(error_of(kRequired + "data:\n  shuffle: maybe\n"), "key 'data.shuffle' expects a bool (true or false), found 'maybe'");
  CHECK_HAS(error_of(kRequired + "target:\n  target_layer_ids: 5\n"), "key 'target.target_layer_ids' expects a list of ints");
  CHECK_HAS(error_of(kRequired + "optim: 3\n"), "'optim' is a section: expected a map");
  CHECK_HAS(error_of(kRequired + "run:\n  device: gpu\n"), "key 'run.device' is 'gpu'; allowed: cpu, cuda");
  CHECK_HAS(error_of(kRequired + "loss:\n  mode: fast\n"), "key 'loss.mode' is 'fast'; allowed: recompute, fused");
  // a typo of a name is named back (a word that only looks like one is not: 'gpu' above)
  CHECK_HAS(error_of(kRequired + "run:\n  device: cdua\n"), "key 'run.device' is 'cdua' (did you mean 'cuda'?); allowed: cpu, cuda");
  CHECK_HAS(error_of(kRequired + "layout:\n  transport: NCCL\n"), "is 'NCCL' (did you mean 'nccl'?); allowed: auto, mpi, nccl");
  // which device computes in which precision is the backend factory's answer (kernels/device.h)
  CHECK_HAS(error_of(kRequired + "run:\n  precision: bf16\n"), "run.precision is bf16 but run.device is cpu: precision bf16 needs the CUDA backend");
  CHECK_HAS(error_of(kRequired + "drafter:\n  layers: 2\n  layer_types: [full, local]\n"), "element 'drafter.layer_types[1]' is 'local'; allowed: full, sliding");
  CHECK_HAS(error_of(kRequired + "drafter:\n  block_size: 0\n"), "key 'drafter.block_size' must be in [2, 1024], got 0");
  CHECK_HAS(error_of(kRequired + "optim:\n  lr: 0\n"), "key 'optim.lr' must be > 0, got 0");
  CHECK_HAS(error_of(kRequired + "optim:\n  beta2: 1.0\n"), "key 'optim.beta2' must be in [0, 1)");
  CHECK_HAS(error_of(kRequired + "target:\n  target_layer_ids: [1, 2]\n"), "target.target_layer_ids has 2 entries but target.n_taps is 5");
  CHECK_HAS(error_of(kRequired + "drafter:\n  layers: 2\n  layer_types: [sliding, full]\n"), "drafter.sliding_window is 0");
  CHECK_HAS(error_of(kRequired + "drafter:\n  heads: 12\n  kv_heads: 5\n"), "drafter.heads (12) must be a multiple of drafter.kv_heads (5)");
  CHECK_HAS(error_of(kRequired + "loss:\n  ce_weight: 0\n"), "nothing to train");
  CHECK_HAS(error_of(kRequired + "layout:\n  transport: nccl\n"), "nccl needs cuda");
  // the acceptance-aware loss keys
  // loss.position_weight is a named key (model::PositionWeight): a typo is named back, another word is not ('pace'
  // does not keep the first letter of 'dpace', lib/core/named_enum.cpp)
  CHECK_HAS(error_of(kRequired + "loss:\n  position_weight: dpcae\n"),
            "key 'loss.position_weight' is 'dpcae' (did you mean 'dpace'?); allowed: decay, dpace, "
            "dpace_cumulative_confidence, dpace_continuation_value");
  CHECK_HAS(error_of(kRequired + "loss:\n  position_weight: pace\n"),
            "key 'loss.position_weight' is 'pace'; allowed: decay, dpace, dpace_cumulative_confidence, "
            "dpace_continuation_value");
  CHECK_HAS(error_of(kRequired + "loss:\n  dpace_alpha: 0\n"), "key 'loss.dpace_alpha' must be in (0, 1], got 0");
  CHECK_HAS(error_of(kRequired + "loss:\n  dpace_alpha: 1.5\n"), "key 'loss.dpace_alpha' must be in (0, 1], got 1.5");
  CHECK_HAS(error_of(kRequired + "loss:\n  tv_weight: -1\n"), "key 'loss.tv_weight' must be >= 0, got -1");
  CHECK_HAS(error_of(kRequired + "loss:\n  lk_eta: -0.5\n"), "key 'loss.lk_eta' must be >= 0, got -0.5");
  CHECK_HAS(error_of(kRequired + "loss:\n  position_weight: dpace\n  decay_gamma: 7\n"),
            "loss.decay_gamma is 7 but loss.position_weight is dpace: D-PACE replaces the decay");
  CHECK_HAS(error_of(kRequired + "loss:\n  lk_weight: 1\n  kl_temperature: 2\n"),
            "loss.kl_temperature is 2: set it to 1");
  CHECK_HAS(error_of(kRequired + "loss:\n  ce_weight: 0\n  nla_weight: 0\n"), "nothing to train");
  CHECK(error_of(kRequired + "loss:\n  ce_weight: 0\n  tv_weight: 1\n") == "(no error)");  // TV alone trains
  CHECK(error_of(kRequired + "loss:\n  position_weight: dpace_continuation_value\n  dpace_alpha: 1\n") == "(no error)");
  CHECK_HAS(error_of(kRequired + "optim:\n  lr: 1\n  lr: 2\n"), "key 'optim.lr' is given twice");
  CHECK_HAS(error_of("run: [1, 2\n"), "config.yaml:2:1: YAML syntax error");
  CHECK_HAS(error_of(kRequired + "optim:\n  [a, b]: 1\n"), "config.yaml:");
  CHECK_THROWS_WITH_AS(load_config("/nonexistent/config.yaml"), doctest::Contains("config file not found"), Error);
}

TEST_CASE("config: resolved table and YAML round trip, hash stable and sensitive to math keys only") {
  TrainConfig c = load_config_text(kRequired + "optim:\n  lr: 3e-4\n", {"run.seed=5"}, "config.yaml");
  std::string table = format_config_table(c);
  CHECK_HAS(table, "optim.lr");
  auto row = [&](const std::string& key) {  // the table line of `key`, spaces collapsed
    std::istringstream in(table);
    std::string line, word, out;
    while (std::getline(in, line)) {
      std::istringstream w(line);
      w >> word;
      if (word != key) continue;
      out = word;
      while (w >> word) out += " " + word;
    }
    return out;
  };
  CHECK(row("optim.lr") == "optim.lr 0.0003 file");
  CHECK(row("run.seed") == "run.seed 5 --set");
  CHECK(row("optim.beta2") == "optim.beta2 0.95 default");
  CHECK(row("key") == "key value source");
  // aligned: every value starts in the same column
  CHECK(table.find("0.0003") - table.rfind('\n', table.find("0.0003")) ==
        table.find("0.95") - table.rfind('\n', table.find("0.95")));
  CHECK(config_value(c, "optim.lr") == "0.0003");
  CHECK(config_value(c, "target.target_layer_ids") == "[]");

  // the resolved YAML loads back to the same values and hash
  TrainConfig back = load_config_text(config_to_yaml(c), {}, "config.resolved.yaml");
  for (const auto& k : config_schema()) CHECK_MESSAGE(config_value(back, k.path) == config_value(c, k.path), k.path);
  CHECK(config_hash(back) == config_hash(c));

  // stable: a known value for the defaults (changes only when the schema or a default changes: update it then).
  // Last change: the acceptance-aware loss keys (loss.tv_weight, lk_weight, lk_eta, nla_weight, position_weight,
  // dpace_alpha: hashed, they change the loss) joined the schema.
  TrainConfig d = load_config_text(kRequired, {}, "config.yaml");
  CHECK(config_hash(d) == config_hash(load_config_text(kRequired, {}, "other.yaml")));
  CHECK(config_hash_hex(d) == "0x40d1d400d0c42c45");

  // math keys change it; names, paths, logging and checkpoint cadence do not
  CHECK(config_hash(load_config_text(kRequired, {"optim.lr=1e-3"})) != config_hash(d));
  CHECK(config_hash(load_config_text(kRequired, {"drafter.block_size=8"})) != config_hash(d));
  CHECK(config_hash(load_config_text(kRequired, {"layout.drafter_dp=4"})) != config_hash(d));
  CHECK(config_hash(load_config_text(kRequired, {"run.name=other", "run.out_dir=/elsewhere", "log.every=1",
                                                 "ckpt.every=100", "ckpt.resume=auto", "data.path=/moved/d.h5",
                                                 "target.path=/moved/model", "layout.packets_in_flight=4"})) ==
        config_hash(d));

  // written to out_dir
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("dflash_test_config_resolved_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainConfig w = load_config_text(kRequired, {"run.out_dir=" + dir.string()});
  std::string path = write_resolved_config(w);
  CHECK(path == (dir / "config.resolved.yaml").string());
  TrainConfig r = load_config(path);
  CHECK(config_hash(r) == config_hash(w));
  CHECK(r.run.out_dir == dir.string());
  fs::remove_all(dir);
}

TEST_CASE("config: relative paths in a file resolve against its folder, --set paths against the working dir") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dflash_cfg_paths_" + std::to_string(::getpid())) / "configs";
  fs::create_directories(dir);
  std::ofstream(dir / "run.yaml") << "run:\n  out_dir: ../runs/a\n"
                                     "target:\n  path: models/t\n"
                                     "data:\n  path: /abs/train.h5\n"
                                     "drafter:\n  mask_token_id: 5\n"
                                     "ckpt:\n  resume: ../runs/a/ckpt/step_00000010\n";
  const TrainConfig c = load_config((dir / "run.yaml").string(), {"target.path=rel/t"});
  CHECK(c.run.out_dir == (fs::absolute(dir).parent_path() / "runs" / "a").string());
  CHECK(c.target.path == "rel/t");              // --set: as typed, relative to the working directory
  CHECK(c.data.path == "/abs/train.h5");        // absolute: unchanged
  CHECK(c.ckpt.resume == (fs::absolute(dir).parent_path() / "runs/a/ckpt/step_00000010").string());
  const TrainConfig auto_resume = load_config((dir / "run.yaml").string(), {"ckpt.resume=auto", "target.path=t"});
  CHECK(auto_resume.ckpt.resume == "auto");
  // the resolved config (absolute paths) loads back to the same paths from anywhere
  const TrainConfig again = load_config_text(config_to_yaml(c), {}, "resolved");
  CHECK(again.run.out_dir == c.run.out_dir);
  fs::remove_all(dir.parent_path());
}

TEST_CASE("config: default tap layers") {
  CHECK(default_target_layer_ids(64, 5) == std::vector<int>{1, 16, 31, 46, 61});
  CHECK(default_target_layer_ids(36, 5) == std::vector<int>{1, 9, 17, 25, 33});
  CHECK(default_target_layer_ids(30, 5) == std::vector<int>{1, 8, 14, 20, 27});  // halves round to even (Python)
  CHECK(default_target_layer_ids(28, 1) == std::vector<int>{14});
}  // the command line (CONFIG, --set, ...): tests/unit/test_cli.cpp

TEST_CASE("config: docs/config.md documents every key") {
  namespace fs = std::filesystem;
  fs::path doc = fs::path(__FILE__).parent_path().parent_path().parent_path() / "docs" / "config.md";
  std::ifstream f(doc);
  REQUIRE_MESSAGE(f.good(), "cannot read " << doc);
  std::stringstream ss;
  ss << f.rdbuf();
  for (const auto& k : config_schema()) CHECK_MESSAGE(ss.str().find("`" + k.path + "`") != std::string::npos, k.path);
}

TEST_CASE("config: the default column of docs/config.md is the struct's default, key by key") {
  // The loss and optim sections inherit their defaults from the model's settings structs
  // (lib/model/vocab_loss_settings.h, adamw_settings.h): the defaults users read must be the ones the code has.
  namespace fs = std::filesystem;
  fs::path doc = fs::path(__FILE__).parent_path().parent_path().parent_path() / "docs" / "config.md";
  std::ifstream f(doc);
  REQUIRE_MESSAGE(f.good(), "cannot read " << doc);
  const TrainConfig defaults;
  auto cells_of = [](const std::string& line) {  // split on '|' but not on the escaped "\|" inside a cell
    std::vector<std::string> cells(1);
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') cells.back() += line[++i];
      else if (line[i] == '|') cells.emplace_back();
      else cells.back() += line[i];
    }
    return cells;
  };
  auto bare = [](std::string s) {  // " `\"x\"` " -> x
    auto strip = [&](const char* chars) {
      s.erase(0, s.find_first_not_of(chars));
      s.erase(s.find_last_not_of(chars) + 1);
    };
    strip(" `");
    strip("\"");
    return s;
  };
  auto same = [](const std::string& doc_value, const std::string& value) {
    char *e1 = nullptr, *e2 = nullptr;
    double a = std::strtod(doc_value.c_str(), &e1), b = std::strtod(value.c_str(), &e2);
    if (!doc_value.empty() && !value.empty() && *e1 == '\0' && *e2 == '\0') return a == b;  // 6e-4 == 0.0006
    return doc_value == value;
  };
  int compared = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    const auto cells = cells_of(line);
    if (cells.size() < 4) continue;
    const std::string key = bare(cells[1]);
    if (!find_config_key(key)) continue;
    const std::string doc_default = bare(cells[3]);
    if (doc_default == "required") continue;
    CHECK_MESSAGE(same(doc_default, config_value(defaults, key)), key << ": docs say " << doc_default
                                                                      << ", the struct has "
                                                                      << config_value(defaults, key));
    ++compared;
  }
  CHECK(compared >= int(config_schema().size()) - 3);  // every key but the three required ones
}
