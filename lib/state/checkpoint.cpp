#include "lib/state/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/core/json_field.h"
#include "lib/core/rng.h"
#include "lib/io/safetensors.h"

namespace dflash::state {

using io::DType;
using io::dtype_name;
using io::SafetensorsFile;
using io::tensor_from;
using io::TensorInfo;
using io::TensorToWrite;
using io::write_safetensors;

namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kDoneFile = "DONE";
constexpr const char* kDoneMagic = "dflash_mpi checkpoint DONE";
constexpr const char* kTmpSuffix = ".tmp";
constexpr const char* kExpAvg = "exp_avg.";      // AdamW first moment, PyTorch's state name
constexpr const char* kExpAvgSq = "exp_avg_sq.";  // AdamW second moment

std::string hex64(uint64_t v) { return fmt::format("0x{:016x}", v); }

// ---- durable file operations -------------------------------------------------------------------------------

void rename_file(const fs::path& from, const fs::path& to) {
  DFLASH_USER_CHECK(::rename(from.c_str(), to.c_str()) == 0, "checkpoint: cannot rename {} to {}: {}", from.string(),
             to.string(), std::strerror(errno));
}

// Hash and size of a file's bytes, read in 4 MiB pieces (a multiple of 8, so words never straddle pieces).
struct FileDigest {
  uint64_t bytes = 0;
  uint64_t hash = 0;
};

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;

uint64_t fnv_words(uint64_t h, const uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);  // little-endian host (x86-64, aarch64)
    h = (h ^ w) * kFnvPrime;
  }
  if (i < n) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, n - i);
    h = (h ^ w) * kFnvPrime;
  }
  return h;
}

FileDigest digest_file(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  DFLASH_USER_CHECK(fd >= 0, "checkpoint: cannot open {}: {}", p.string(), std::strerror(errno));
  std::vector<uint8_t> buf(size_t(4) << 20);
  FileDigest d;
  d.hash = kFnvOffset;
  for (;;) {
    size_t filled = 0;  // fill the whole piece so that only the file's last piece can end mid-word
    while (filled < buf.size()) {
      ssize_t n = ::read(fd, buf.data() + filled, buf.size() - filled);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        DFLASH_USER_CHECK(false, "checkpoint: read of {} failed: {}", p.string(), std::strerror(err));
      }
      if (n == 0) break;
      filled += size_t(n);
    }
    d.hash = fnv_words(d.hash, buf.data(), filled);
    d.bytes += filled;
    if (filled < buf.size()) break;
  }
  ::close(fd);
  d.hash = mix64(d.hash ^ d.bytes);
  return d;
}

std::string read_text_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  DFLASH_USER_CHECK(f, "checkpoint: cannot read {}", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---- directory names ---------------------------------------------------------------------------------------

// step of a "step_<8 or more digits>" name, or -1 for any other name
int64_t parse_step_name(const std::string& name) {
  if (name.size() < 13 || name.compare(0, 5, "step_") != 0 || name.size() > 5 + 18) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

struct StepDir {
  int64_t step;
  fs::path path;
  bool complete;  // has DONE
};

// every step_* directory under out_dir/ckpt, oldest first
std::vector<StepDir> list_step_dirs(const std::string& out_dir) {
  std::vector<StepDir> out;
  const fs::path root = fs::path(out_dir) / "ckpt";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t step = parse_step_name(e.path().filename().string());
    if (step < 0 || !e.is_directory(ec)) continue;
    out.push_back({step, e.path(), fs::is_regular_file(e.path() / kDoneFile, ec)});
  }
  std::sort(out.begin(), out.end(), [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return out;
}

// ---- state.json --------------------------------------------------------------------------------------------

// Reads key `key` of object `j` as T, naming the file and key when it is missing or of the wrong type.
template <typename T>
T get(const nlohmann::json& j, const char* key, const std::string& file) {
  return json_field<T>(j, key, "checkpoint " + file);
}

std::string state_json_text(const model::DrafterConfig& drafter, const model::AdamWState& opt, const TrainingState& s) {
  nlohmann::ordered_json j;
  j["format"] = kCheckpointMagic;
  j["version"] = kCheckpointVersion;
  j["step"] = s.step;
  j["adamw_step"] = opt.step;
  j["data"] = {{"epoch", s.data.epoch}, {"step_in_epoch", s.data.step_in_epoch}, {"shuffle_seed", s.data.shuffle_seed}};
  j["layout"] = {{"target_tp", s.layout.target_tp},
                 {"target_groups", s.layout.target_groups},
                 {"drafter_dp", s.layout.drafter_dp},
                 {"micro_batches", s.layout.micro_batches}};
  j["drafter"] = model::drafter_config_to_json(drafter);
  j["config_hash"] = s.config_hash;
  if (!s.dataset.empty()) j["dataset"] = s.dataset;
  if (!s.target.empty()) j["target"] = s.target;
  nlohmann::ordered_json rngs = nlohmann::ordered_json::array();
  for (const auto& r : s.rng)
    rngs.push_back({{"rank", r.rank}, {"seed", r.seed}, {"stream", r.stream}, {"counter", r.counter}});
  j["rng"] = rngs;
  j["extra"] = s.extra.is_null() ? nlohmann::json::object() : s.extra;
  return j.dump(2) + "\n";
}

// Parses state.json (already hash-verified): magic, version, then every field.
TrainingState parse_state(const std::string& text, const std::string& file, model::DrafterConfig* drafter,
                          int64_t* adamw_step) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    DFLASH_USER_CHECK(false, "checkpoint {}: not valid JSON ({})", file, e.what());
  }
  DFLASH_USER_CHECK(j.is_object() && j.value("format", "") == kCheckpointMagic,
             "checkpoint {}: not a dflash_mpi checkpoint state (\"format\" must be \"{}\")", file, kCheckpointMagic);
  const int version = get<int>(j, "version", file);
  DFLASH_USER_CHECK(version == kCheckpointVersion,
             "checkpoint {}: format version {}, this build reads version {} (use the dflash_mpi that wrote it)", file,
             version, kCheckpointVersion);
  TrainingState s;
  s.step = get<int64_t>(j, "step", file);
  if (adamw_step) *adamw_step = get<int64_t>(j, "adamw_step", file);
  DFLASH_USER_CHECK(j.contains("data"), "checkpoint {}: missing key 'data'", file);
  const auto& d = j.at("data");
  s.data.epoch = get<int64_t>(d, "epoch", file);
  s.data.step_in_epoch = get<int64_t>(d, "step_in_epoch", file);
  s.data.shuffle_seed = get<uint64_t>(d, "shuffle_seed", file);
  DFLASH_USER_CHECK(j.contains("layout"), "checkpoint {}: missing key 'layout'", file);
  const auto& l = j.at("layout");
  s.layout.target_tp = get<int>(l, "target_tp", file);
  s.layout.target_groups = get<int>(l, "target_groups", file);
  s.layout.drafter_dp = get<int>(l, "drafter_dp", file);
  s.layout.micro_batches = get<int>(l, "micro_batches", file);
  DFLASH_USER_CHECK(j.contains("drafter"), "checkpoint {}: missing key 'drafter'", file);
  model::DrafterConfig c = model::drafter_config_from_json(j.at("drafter"), "checkpoint " + file);
  if (drafter) *drafter = c;
  s.config_hash = get<std::string>(j, "config_hash", file);
  if (j.contains("dataset")) s.dataset = get<std::string>(j, "dataset", file);
  if (j.contains("target")) s.target = get<std::string>(j, "target", file);
  DFLASH_USER_CHECK(j.contains("rng") && j.at("rng").is_array(), "checkpoint {}: 'rng' must be a list", file);
  for (const auto& r : j.at("rng"))
    s.rng.push_back({get<int>(r, "rank", file), get<uint64_t>(r, "seed", file), get<uint64_t>(r, "stream", file),
                     get<uint64_t>(r, "counter", file)});
  s.extra = j.contains("extra") ? j.at("extra") : nlohmann::json::object();
  return s;
}

// ---- DONE --------------------------------------------------------------------------------------------------

struct DoneEntry {
  std::string name;
  FileDigest digest;
};

std::string done_text(int64_t step, const std::vector<DoneEntry>& files) {
  nlohmann::ordered_json j;
  j["format"] = kDoneMagic;
  j["step"] = step;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& f : files) list.push_back({{"name", f.name}, {"bytes", f.digest.bytes}, {"hash", hex64(f.digest.hash)}});
  j["files"] = list;
  return j.dump(2) + "\n";
}

std::vector<DoneEntry> parse_done(const fs::path& dir) {
  const fs::path p = dir / kDoneFile;
  std::error_code ec;
  DFLASH_USER_CHECK(fs::is_regular_file(p, ec),
             "checkpoint {}: no DONE marker, so it is incomplete (a save was interrupted); resume from an older "
             "checkpoint (ckpt.resume: auto skips it) or delete the directory",
             dir.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(p));
  } catch (const nlohmann::json::exception& e) {
    DFLASH_USER_CHECK(false, "checkpoint {}: not valid JSON ({})", p.string(), e.what());
  }
  DFLASH_USER_CHECK(j.is_object() && j.value("format", "") == kDoneMagic, "checkpoint {}: not a dflash_mpi DONE marker",
             p.string());
  DFLASH_USER_CHECK(j.contains("files") && j.at("files").is_array(), "checkpoint {}: 'files' must be a list", p.string());
  std::vector<DoneEntry> out;
  for (const auto& f : j.at("files")) {
    DoneEntry e;
    e.name = get<std::string>(f, "name", p.string());
    e.digest.bytes = get<uint64_t>(f, "bytes", p.string());
    const std::string h = get<std::string>(f, "hash", p.string());
    DFLASH_USER_CHECK(h.size() == 18 && h.compare(0, 2, "0x") == 0, "checkpoint {}: hash of {} is not 0x + 16 hex digits",
               p.string(), e.name);
    DFLASH_USER_CHECK(h.find_first_not_of("0123456789abcdefABCDEF", 2) == std::string::npos,
               "checkpoint {}: hash of {} is not 0x + 16 hex digits", p.string(), e.name);
    e.digest.hash = std::stoull(h.substr(2), nullptr, 16);
    out.push_back(e);
  }
  for (const char* need : {kModelFile, kOptimizerFile, kStateFile})
    DFLASH_USER_CHECK(std::any_of(out.begin(), out.end(), [&](const DoneEntry& e) { return e.name == need; }),
               "checkpoint {}: DONE does not list {}", p.string(), need);
  return out;
}

const DoneEntry& done_entry(const std::vector<DoneEntry>& done, const char* name) {
  for (const auto& e : done)
    if (e.name == name) return e;
  throw Error(fmt::format("DONE entry {} missing", name));  // parse_done guarantees it is there
}

const char* kCorruptHint = "delete this directory to resume from the previous checkpoint";

void verify_size(const fs::path& dir, const DoneEntry& e) {
  const fs::path p = dir / e.name;
  std::error_code ec;
  DFLASH_USER_CHECK(fs::is_regular_file(p, ec), "checkpoint {}: {} is missing but DONE lists it; {}", dir.string(), e.name,
             kCorruptHint);
  const uint64_t size = fs::file_size(p, ec);
  DFLASH_USER_CHECK(!ec && size == e.digest.bytes,
             "checkpoint {}: {} has {} bytes, DONE recorded {} (truncated or overwritten); {}", dir.string(), e.name,
             size, e.digest.bytes, kCorruptHint);
}

void verify_hash(const fs::path& dir, const DoneEntry& e) {
  const FileDigest d = digest_file(dir / e.name);
  DFLASH_USER_CHECK(d.bytes == e.digest.bytes,
             "checkpoint {}: {} has {} bytes, DONE recorded {} (truncated or overwritten); {}", dir.string(), e.name,
             d.bytes, e.digest.bytes, kCorruptHint);
  DFLASH_USER_CHECK(d.hash == e.digest.hash, "checkpoint {}: {} has hash {}, DONE recorded {} (the file is corrupted); {}",
             dir.string(), e.name, hex64(d.hash), hex64(e.digest.hash), kCorruptHint);
}

// ---- comparison with this run ------------------------------------------------------------------------------

void expect_same(const std::string& dir, const char* what, const char* field, const std::string& ckpt,
                 const std::string& run) {
  DFLASH_USER_CHECK(ckpt == run,
             "checkpoint {}: checkpoint {} {}={}, this run has {}={} (resume with the same {} or start a new "
             "run.out_dir)",
             dir, what, field, ckpt, field, run, what);
}

void compare(const std::string& dir, const TrainingState& s, const model::DrafterConfig& d, const CheckpointExpectation& x) {
  auto num = [](auto v) { return fmt::format("{}", v); };
  expect_same(dir, "layout", "target_tp", num(s.layout.target_tp), num(x.layout.target_tp));
  expect_same(dir, "layout", "target_groups", num(s.layout.target_groups), num(x.layout.target_groups));
  expect_same(dir, "layout", "drafter_dp", num(s.layout.drafter_dp), num(x.layout.drafter_dp));
  expect_same(dir, "layout", "micro_batches", num(s.layout.micro_batches), num(x.layout.micro_batches));
  const model::DrafterConfigDifference diff = model::first_difference(d, x.drafter);
  if (!diff.field.empty()) expect_same(dir, "drafter", diff.field.c_str(), diff.a, diff.b);
  DFLASH_USER_CHECK(s.config_hash == x.config_hash,
             "checkpoint {}: checkpoint config_hash={}, this run has config_hash={} (a key that changes the training "
             "math differs: compare config.resolved.yaml of both runs; see docs/config.md)",
             dir, s.config_hash, x.config_hash);
  DFLASH_USER_CHECK(s.dataset.empty() || x.dataset.empty() || s.dataset == x.dataset,
                    "checkpoint {}: trained on the dataset '{}', this run's data.path is '{}': resuming on other data "
                    "silently changes what the data cursor points at; resume with the original data, or start a new "
                    "run (ckpt.resume: none, another run.out_dir)",
                    dir, s.dataset, x.dataset);
  if (x.steps_per_epoch > 0) {
    const DataCursor want{s.step / x.steps_per_epoch, s.step % x.steps_per_epoch, x.seed};
    DFLASH_USER_CHECK(s.data.epoch == want.epoch && s.data.step_in_epoch == want.step_in_epoch &&
                          s.data.shuffle_seed == want.shuffle_seed,
                      "checkpoint {}: its data cursor (epoch {}, step_in_epoch {}, shuffle_seed {}) is not where step "
                      "{} lands in this run (epoch {}, step_in_epoch {}, seed {}: {} steps per epoch): the data or "
                      "the seed differ; resume with the original data and run.seed, or start a new run",
                      dir, s.data.epoch, s.data.step_in_epoch, s.data.shuffle_seed, s.step, want.epoch,
                      want.step_in_epoch, want.shuffle_seed, x.steps_per_epoch);
    DFLASH_USER_CHECK(int(s.rng.size()) == x.layout.drafter_dp,
                      "checkpoint {}: records the RNG of {} drafter ranks, this run has drafter_dp={}", dir,
                      s.rng.size(), x.layout.drafter_dp);
    for (size_t r = 0; r < s.rng.size(); ++r) {
      const RankRng& g = s.rng[r];
      DFLASH_USER_CHECK(g.rank == int(r) && g.seed == x.seed && g.stream == r && g.counter == uint64_t(s.step),
                        "checkpoint {}: drafter rank {}'s RNG (rank {}, seed {}, stream {}, counter {}) is not the "
                        "one step {} of this run uses (seed {}, stream {}, counter {}): written by another seed or "
                        "version; start a new run",
                        dir, r, g.rank, g.seed, g.stream, g.counter, s.step, x.seed, r, s.step);
    }
  }
  DFLASH_USER_CHECK(s.target.empty() || x.target.empty() || s.target == x.target,
                    "checkpoint {}: trained against the target '{}', this run's target.path is '{}': a different "
                    "target (another fine-tune or revision of the same shape) gives other features; resume with the "
                    "original target, or start a new run (ckpt.resume: none, another run.out_dir)",
                    dir, s.target, x.target);
}

// ---- tensors -----------------------------------------------------------------------------------------------

void read_params(const SafetensorsFile& f, const std::string& prefix, const std::vector<model::ParamInfo>& layout,
                 float* flat) {
  for (const auto& p : layout) {
    const std::string name = prefix + p.name;
    DFLASH_USER_CHECK(f.has(name), "checkpoint {}: missing tensor '{}'", f.path(), name);
    const TensorInfo& t = f.info(name);
    DFLASH_USER_CHECK(t.dtype == DType::F32 && t.shape == p.shape,
               "checkpoint {}: tensor '{}' is {} {}, expected F32 {} (state.json's drafter shape)", f.path(), name,
               dtype_name(t.dtype), t.shape_str(), TensorInfo{"", DType::F32, p.shape}.shape_str());
    f.read_rows(name, 0, t.rows(), flat + p.offset);
  }
}

LoadedCheckpoint read_impl(const std::string& dir_str, const CheckpointExpectation* expected, bool with_optimizer) {
  const fs::path dir(dir_str);
  std::error_code ec;
  DFLASH_USER_CHECK(fs::is_directory(dir, ec), "checkpoint {}: no such directory", dir_str);
  const std::vector<DoneEntry> done = parse_done(dir);
  for (const auto& e : done) verify_size(dir, e);  // cheap: catches truncation before hashing gigabytes
  verify_hash(dir, done_entry(done, kStateFile));
  const std::string state_path = (dir / kStateFile).string();
  model::DrafterConfig drafter;
  int64_t adamw_step = 0;
  TrainingState state = parse_state(read_text_file(dir / kStateFile), state_path, &drafter, &adamw_step);
  if (expected) compare(dir_str, state, drafter, *expected);
  for (const auto& e : done)
    if (e.name != kStateFile) verify_hash(dir, e);

  LoadedCheckpoint out{dir_str, drafter, model::DrafterParams<float>(drafter), model::AdamWState{}, std::move(state)};
  out.optimizer.step = adamw_step;
  {
    SafetensorsFile f((dir / kModelFile).string());
    read_params(f, "", out.params.layout, out.params.flat.data());
    DFLASH_USER_CHECK(f.names().size() == out.params.layout.size(),
               "checkpoint {}: {} tensors, the drafter shape in state.json has {}", f.path(), f.names().size(),
               out.params.layout.size());
  }
  if (with_optimizer) {
    SafetensorsFile f((dir / kOptimizerFile).string());
    const size_t n_names = f.names().size();
    if (n_names > 0) {  // an optimizer that has not stepped yet is stored without tensors
      DFLASH_USER_CHECK(n_names == 2 * out.params.layout.size(),
                 "checkpoint {}: {} tensors, expected {} (exp_avg.* and exp_avg_sq.* of every parameter)", f.path(),
                 n_names, 2 * out.params.layout.size());
      out.optimizer.m.assign(out.params.flat.size(), 0.f);
      out.optimizer.v.assign(out.params.flat.size(), 0.f);
      read_params(f, kExpAvg, out.params.layout, out.optimizer.m.data());
      read_params(f, kExpAvgSq, out.params.layout, out.optimizer.v.data());
    }
  }
  return out;
}

void remove_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / kDoneFile, ec)) {
    fs::remove(dir / kDoneFile, ec);
    DFLASH_USER_CHECK(!ec, "checkpoint: cannot delete {}: {}", (dir / kDoneFile).string(), ec.message());
    fsync_path(dir, true);  // DONE is gone for good before any weight file is
  }
  fs::remove_all(dir, ec);
  DFLASH_USER_CHECK(!ec, "checkpoint: cannot delete {}: {}", dir.string(), ec.message());
}

}  // namespace

uint64_t checkpoint_hash(const void* data, size_t bytes) {
  return mix64(fnv_words(kFnvOffset, static_cast<const uint8_t*>(data), bytes) ^ uint64_t(bytes));
}

std::string checkpoint_dir(const std::string& out_dir, int64_t step) {
  return (fs::path(out_dir) / "ckpt" / fmt::format("step_{:08d}", step)).string();
}

std::string save_checkpoint(const std::string& out_dir, const model::DrafterConfig& drafter,
                            const model::DrafterParams<float>& params, const model::AdamWState& opt, const TrainingState& state) {
  return save_checkpoint_in(checkpoint_dir(out_dir, state.step), drafter, params, opt, state);
}

std::string save_checkpoint_in(const std::string& step_dir, const model::DrafterConfig& drafter,
                               const model::DrafterParams<float>& params, const model::AdamWState& opt, const TrainingState& state) {
  DFLASH_CHECK(state.step >= 0, "save_checkpoint: negative step {}", state.step);
  const std::vector<model::ParamInfo> layout = model::drafter_param_layout(drafter);
  const size_t P = model::param_count(layout);
  DFLASH_CHECK(params.flat.size() == P, "save_checkpoint: {} parameters, the drafter shape has {}",
               params.flat.size(), P);
  DFLASH_CHECK((opt.m.empty() && opt.v.empty()) || (opt.m.size() == P && opt.v.size() == P),
               "save_checkpoint: AdamW state holds {} / {} moments for {} parameters", opt.m.size(), opt.v.size(), P);

  const fs::path dir = fs::path(step_dir);
  const fs::path root = dir.parent_path();  // out_dir/ckpt
  const fs::path out_dir = root.parent_path();
  std::error_code ec;
  const bool root_existed = fs::is_directory(root, ec);
  fs::create_directories(dir, ec);
  DFLASH_USER_CHECK(!ec, "checkpoint: cannot create {}: {}", dir.string(), ec.message());
  if (!root_existed) fsync_path(out_dir.empty() ? fs::path(".") : out_dir, true);
  fsync_path(root, true);  // the step directory's entry is durable

  // 1. every file under a temporary name, fsync'd
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", std::to_string(state.step)}};
  std::vector<TensorToWrite> model, moments;
  for (const auto& p : layout) model.push_back(tensor_from(p.name, DType::F32, p.shape, params.flat.data() + p.offset));
  if (!opt.m.empty()) {
    for (const auto& p : layout)
      moments.push_back(tensor_from(kExpAvg + p.name, DType::F32, p.shape, opt.m.data() + p.offset));
    for (const auto& p : layout)
      moments.push_back(tensor_from(kExpAvgSq + p.name, DType::F32, p.shape, opt.v.data() + p.offset));
  }
  auto tmp = [&](const char* name) { return dir / (std::string(name) + kTmpSuffix); };
  write_safetensors(tmp(kModelFile).string(), model, meta);
  fsync_path(tmp(kModelFile), false);
  write_safetensors(tmp(kOptimizerFile).string(), moments, meta);
  fsync_path(tmp(kOptimizerFile), false);
  write_file_durable(tmp(kStateFile), state_json_text(drafter, opt, state));

  std::vector<DoneEntry> done;
  for (const char* name : {kModelFile, kOptimizerFile, kStateFile}) done.push_back({name, digest_file(tmp(name))});

  // 2. an older complete save of this step stops being complete before its files are replaced
  if (fs::exists(dir / kDoneFile, ec)) {
    fs::remove(dir / kDoneFile, ec);
    DFLASH_USER_CHECK(!ec, "checkpoint: cannot delete {}: {}", (dir / kDoneFile).string(), ec.message());
    fsync_path(dir, true);
  }
  // 3. rename into place, make the renames durable
  for (const char* name : {kModelFile, kOptimizerFile, kStateFile}) rename_file(tmp(name), dir / name);
  fsync_path(dir, true);
  // 4. DONE last, the same way
  write_file_durable(tmp(kDoneFile), done_text(state.step, done));
  rename_file(tmp(kDoneFile), dir / kDoneFile);
  fsync_path(dir, true);
  return dir.string();
}

std::string find_latest_checkpoint(const std::string& out_dir) {
  const auto dirs = list_step_dirs(out_dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
    if (it->complete) return it->path.string();
  return "";
}

std::vector<std::string> list_complete_checkpoints(const std::string& out_dir) {
  std::vector<std::string> out;
  for (const StepDir& d : list_step_dirs(out_dir))
    if (d.complete) out.push_back(d.path.string());
  return out;
}

LoadedCheckpoint load_checkpoint(const std::string& dir, const CheckpointExpectation& expected) {
  return read_impl(dir, &expected, true);
}

LoadedCheckpoint read_checkpoint(const std::string& dir, bool with_optimizer) {
  return read_impl(dir, nullptr, with_optimizer);
}

TrainingState read_checkpoint_state(const std::string& dir_str, model::DrafterConfig* drafter) {
  const fs::path dir(dir_str);
  const std::vector<DoneEntry> done = parse_done(dir);
  const DoneEntry& e = done_entry(done, kStateFile);
  verify_size(dir, e);
  verify_hash(dir, e);
  return parse_state(read_text_file(dir / kStateFile), (dir / kStateFile).string(), drafter, nullptr);
}

std::vector<std::string> prune_checkpoints(const std::string& out_dir, int keep) {
  DFLASH_CHECK(keep >= 0, "prune_checkpoints: keep must be >= 0, got {}", keep);
  const auto dirs = list_step_dirs(out_dir);
  int64_t newest_complete = -1;
  for (const auto& d : dirs)
    if (d.complete) newest_complete = d.step;
  if (newest_complete < 0) return {};  // nothing is safe to delete before one save completed
  int complete_seen = 0;  // complete checkpoints newer than (or at) the one looked at, counted from the newest
  std::vector<std::string> doomed;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->step > newest_complete) continue;  // a save in progress or a leftover a re-save will overwrite
    if (it->complete) {
      ++complete_seen;
      if (keep == 0 || complete_seen <= keep) continue;
    }
    doomed.push_back(it->path.string());
  }
  std::reverse(doomed.begin(), doomed.end());
  for (const auto& d : doomed) remove_checkpoint_dir(d);
  if (!doomed.empty()) fsync_path(fs::path(out_dir) / "ckpt", true);
  return doomed;
}

void export_checkpoint(const std::string& step_dir, const std::string& out_dir, DType dtype,
                       const model::DrafterExportInfo& overrides) {
  LoadedCheckpoint ck = read_checkpoint(step_dir, /*with_optimizer=*/false);
  model::DrafterExportInfo info;
  const std::string source = (fs::path(step_dir) / "state.json").string() + " extra.export";
  if (ck.state.extra.is_object() && ck.state.extra.contains("export"))
    info = model::parse_export_info(ck.state.extra.at("export"), source);
  if (!overrides.target_layer_ids.empty()) info.target_layer_ids = overrides.target_layer_ids;
  if (overrides.num_target_layers > 0) info.num_target_layers = overrides.num_target_layers;
  if (overrides.max_position_embeddings > 0) info.max_position_embeddings = overrides.max_position_embeddings;
  try {
    model::validate_export_info(info, ck.drafter);
  } catch (const Error& e) {
    DFLASH_USER_CHECK(false, "{} (values from {}, then the explicit ones; give the missing or wrong ones "
                 "explicitly)", e.what(), source);
  }
  model::export_drafter(ck.drafter, ck.params, info, out_dir, dtype);
}

}  // namespace dflash::state
