// Loading the training config: YAML file, then --set overrides, then cross-key validation. Every value goes
// through one typed parser driven by the key table (schema.cpp), so the file and --set behave identically.
#include "lib/config/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include <yaml-cpp/yaml.h>

#include "lib/config/schema.h"
#include "lib/core/error.h"
#include "lib/core/named_enum.h"

namespace dflash {

namespace {

// `where` prefixes every message: "config.yaml:12" or "--set optim.lr=abc".
[[noreturn]] void fail(const std::string& where, const std::string& msg) {
  throw Error(fmt::format("{}: {}", where, msg));
}

std::string node_text(const YAML::Node& n) {
  if (n.IsNull()) return "nothing (null)";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "'" + n.Scalar() + "'";
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string keys_of_section(const std::string& section) {
  std::vector<std::string> names;
  for (const auto& k : config_schema())
    if (k.section() == section) names.push_back(k.leaf());
  return join(names);
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& path) {
  std::string hint = suggest_config_key(path);
  if (!hint.empty()) fail(where, fmt::format("unknown key '{}' (did you mean '{}'?)", path, hint));
  std::string section = path.substr(0, path.find('.'));
  const auto& sections = config_sections();
  if (path.find('.') != std::string::npos &&
      std::find(sections.begin(), sections.end(), section) != sections.end())
    fail(where, fmt::format("unknown key '{}'; keys of '{}': {}", path, section, keys_of_section(section)));
  fail(where, fmt::format("unknown key '{}'; sections: {} (docs/config.md lists every key)", path, join(sections)));
}

[[noreturn]] void wrong_type(const std::string& where, const ConfigKey& k, const std::string& expected,
                             const YAML::Node& n) {
  fail(where, fmt::format("key '{}' expects {}, found {}", k.path, expected, node_text(n)));
}

int64_t parse_int(const std::string& where, const ConfigKey& k, const YAML::Node& n) {
  if (!n.IsScalar()) wrong_type(where, k, "an int", n);
  const std::string& s = n.Scalar();
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) wrong_type(where, k, "an int", n);
  if (!k.range.contains(double(v))) fail(where, fmt::format("key '{}' must be {}, got {}", k.path, k.range.describe(), v));
  return v;
}

double parse_float(const std::string& where, const ConfigKey& k, const YAML::Node& n) {
  if (!n.IsScalar()) wrong_type(where, k, "a float", n);
  const std::string& s = n.Scalar();
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v)) wrong_type(where, k, "a finite float", n);
  if (!k.range.contains(v)) fail(where, fmt::format("key '{}' must be {}, got {}", k.path, k.range.describe(), v));
  return v;
}

bool parse_bool(const std::string& where, const ConfigKey& k, const YAML::Node& n) {
  if (n.IsScalar()) {
    std::string s = n.Scalar();
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    if (s == "true" || s == "yes" || s == "on" || s == "1") return true;
    if (s == "false" || s == "no" || s == "off" || s == "0") return false;
  }
  wrong_type(where, k, "a bool (true or false)", n);
}

std::string parse_enum(const std::string& where, const ConfigKey& k, const YAML::Node& n, const std::string& what) {
  if (!n.IsScalar()) wrong_type(where, k, "one of: " + join(k.choices), n);
  const std::string& s = n.Scalar();
  if (std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end()) {
    const std::string hint = closest_choice(s, k.choices);
    fail(where, fmt::format("{} '{}' is '{}'{}; allowed: {}", what, k.path, s,
                            hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint), join(k.choices)));
  }
  return s;
}

// Parses `n` as the value of key `k` and stores it in `cfg`.
void set_value(TrainConfig& cfg, const ConfigKey& k, const YAML::Node& n, const std::string& where) {
  FieldRef field = k.field(cfg);
  switch (k.type) {
    case KeyType::kInt: {
      int64_t v = parse_int(where, k, n);
      if (auto p = std::get_if<int*>(&field)) {
        if (v < INT32_MIN || v > INT32_MAX) fail(where, fmt::format("key '{}' value {} does not fit in 32 bits", k.path, v));
        **p = int(v);
      } else {
        *std::get<int64_t*>(field) = v;
      }
      break;
    }
    case KeyType::kFloat: *std::get<double*>(field) = parse_float(where, k, n); break;
    case KeyType::kBool: *std::get<bool*>(field) = parse_bool(where, k, n); break;
    case KeyType::kString:
      if (n.IsNull()) {
        *std::get<std::string*>(field) = "";
      } else {
        if (!n.IsScalar()) wrong_type(where, k, "a string", n);
        *std::get<std::string*>(field) = n.Scalar();
      }
      break;
    case KeyType::kEnum: {
      const std::string choice = parse_enum(where, k, n, "key");  // one of k.choices = the enum's names
      std::visit(
          [&](auto* p) {
            using V = std::remove_pointer_t<decltype(p)>;
            if constexpr (is_named_enum_v<V>) *p = *parse_name<V>(choice);
            else if constexpr (std::is_same_v<V, std::string>) *p = choice;
            else DFLASH_FAIL("key {}: kEnum on a field that is neither text nor an enum", k.path);
          },
          field);
      break;
    }
    case KeyType::kIntList:
    case KeyType::kEnumList: {
      const bool ints = k.type == KeyType::kIntList;
      std::string expected = ints ? "a list of ints, e.g. [1, 9, 17]" : "a list of (" + join(k.choices, " | ") + ")";
      if (!n.IsNull() && !n.IsSequence()) wrong_type(where, k, expected, n);
      std::vector<int> iv;
      std::vector<std::string> sv;
      for (size_t i = 0; n.IsSequence() && i < n.size(); ++i) {
        ConfigKey elem = k;
        elem.path = fmt::format("{}[{}]", k.path, i);
        if (ints) {
          int64_t v = parse_int(where, elem, n[i]);
          if (v < INT32_MIN || v > INT32_MAX) fail(where, fmt::format("key '{}' value {} does not fit in 32 bits", elem.path, v));
          iv.push_back(int(v));
        } else {
          sv.push_back(parse_enum(where, elem, n[i], "element"));
        }
      }
      if (ints) *std::get<std::vector<int>*>(field) = iv;
      else *std::get<std::vector<std::string>*>(field) = sv;
      break;
    }
  }
}

std::string mark(const std::string& name, const YAML::Node& n) {
  YAML::Mark m = n.Mark();
  return m.is_null() ? name : fmt::format("{}:{}", name, m.line + 1);
}

void apply_yaml(TrainConfig& cfg, const YAML::Node& root, const std::string& name) {
  if (root.IsNull()) return;  // empty file: defaults only
  if (!root.IsMap())
    fail(name, fmt::format("the config must be a map of sections ({}), found {}", join(config_sections()), node_text(root)));
  std::set<std::string> seen;
  for (const auto& sec : root) {
    std::string section = sec.first.as<std::string>();
    std::string where = mark(name, sec.first);
    const auto& sections = config_sections();
    if (std::find(sections.begin(), sections.end(), section) == sections.end()) unknown_key(where, section);
    if (sec.second.IsNull()) continue;
    if (!sec.second.IsMap())
      fail(where, fmt::format("'{}' is a section: expected a map of its keys ({}), found {}", section,
                              keys_of_section(section), node_text(sec.second)));
    for (const auto& kv : sec.second) {
      std::string path = section + "." + kv.first.as<std::string>();
      std::string kwhere = mark(name, kv.first);
      const ConfigKey* k = find_config_key(path);
      if (!k) unknown_key(kwhere, path);
      if (!seen.insert(path).second) fail(kwhere, fmt::format("key '{}' is given twice", path));
      set_value(cfg, *k, kv.second, kwhere);
      cfg.source[path] = ConfigSource::kFile;
    }
  }
}

TrainConfig load_from(const YAML::Node& root, const std::string& name, const std::vector<std::string>& sets) {
  TrainConfig cfg;
  cfg.file = name;
  try {
    apply_yaml(cfg, root, name);
  } catch (const YAML::Exception& e) {  // e.g. a list used as a key
    fail(fmt::format("{}:{}", name, e.mark.line + 1), "malformed config: " + e.msg);
  }
  for (const auto& s : sets) apply_override(cfg, s);
  validate_config(cfg);
  return cfg;
}

}  // namespace

void apply_override(TrainConfig& cfg, const std::string& set) {
  std::string where = "--set " + set;
  auto eq = set.find('=');
  if (eq == std::string::npos || eq == 0)
    fail(where, "expected key=value with a dotted key, e.g. --set optim.lr=3e-4");
  std::string path = set.substr(0, eq), text = set.substr(eq + 1);
  const ConfigKey* k = find_config_key(path);
  if (!k) unknown_key(where, path);
  YAML::Node n;
  if (k->type == KeyType::kString || k->type == KeyType::kEnum) {
    n = YAML::Node(text);  // taken verbatim: paths may hold YAML syntax (':', '#')
  } else {
    try {
      n = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      fail(where, fmt::format("key '{}' expects {}, found '{}' ({})", path, key_type_name(k->type), text, e.msg));
    }
  }
  set_value(cfg, *k, n, where);
  cfg.source[path] = ConfigSource::kSet;
}

TrainConfig load_config_text(const std::string& yaml_text, const std::vector<std::string>& sets,
                             const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    fail(fmt::format("{}:{}:{}", name, e.mark.line + 1, e.mark.column + 1), "YAML syntax error: " + e.msg);
  }
  return load_from(root, name, sets);
}

TrainConfig load_config(const std::string& file, const std::vector<std::string>& sets) {
  if (file.empty()) return load_from(YAML::Node(), "", sets);
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    fail(file, "is a directory, not a config file (give the path of a YAML file in it, e.g. " + file +
               "/config.yaml; mpi_launch/configs/ has examples)");
  if (!std::filesystem::exists(file, ec))
    fail(file, "config file not found (give the path of a YAML file; mpi_launch/configs/ has examples)");
  if (!std::filesystem::is_regular_file(file, ec))
    fail(file, "not a regular file (a FIFO, socket or device): give the path of a YAML file");
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    fail(fmt::format("{}:{}:{}", file, e.mark.line + 1, e.mark.column + 1), "YAML syntax error: " + e.msg);
  }
  TrainConfig cfg = load_from(root, file, sets);
  resolve_paths_against(cfg, std::filesystem::path(file).parent_path());
  return cfg;
}

void resolve_paths_against(TrainConfig& cfg, const std::filesystem::path& config_dir) {
  namespace fs = std::filesystem;
  auto resolve = [&](const char* key, std::string& value) {
    const auto it = cfg.source.find(key);
    if (it == cfg.source.end() || it->second != ConfigSource::kFile || value.empty() || fs::path(value).is_absolute())
      return;
    value = fs::absolute(config_dir / value).lexically_normal().string();
  };
  resolve("run.out_dir", cfg.run.out_dir);
  resolve("target.path", cfg.target.path);
  resolve("data.path", cfg.data.path);
  resolve("eval.data", cfg.eval.data);
  resolve("eval.prompts", cfg.eval.prompts);
  resolve("report.tensorboard", cfg.report.tensorboard);
  resolve("drafter.init", cfg.drafter.init);
  if (cfg.ckpt.resume != "none" && cfg.ckpt.resume != "auto") resolve("ckpt.resume", cfg.ckpt.resume);
}

void validate_config(const TrainConfig& c) {
  const std::string where = c.file.empty() ? "config" : c.file;
  for (const auto& k : config_schema()) {
    if (!k.required) continue;
    bool given = c.source.count(k.path) > 0;
    if (k.path == "drafter.mask_token_id") given = given && c.drafter.mask_token_id >= 0;
    if (k.path == "target.path") given = given && !c.target.path.empty();
    if (k.path == "data.path") given = given && !c.data.path.empty();
    if (!given)
      fail(where, fmt::format("required key '{}' is missing ({}); set it in the file or with --set {}=...", k.path,
                              k.help, k.path));
  }
  const auto& t = c.target;
  if (!t.target_layer_ids.empty()) {
    if (int(t.target_layer_ids.size()) != t.n_taps)
      fail(where, fmt::format("target.target_layer_ids has {} entries but target.n_taps is {}; give n_taps ids or "
                              "leave the list empty for the default", t.target_layer_ids.size(), t.n_taps));
    for (size_t i = 1; i < t.target_layer_ids.size(); ++i)
      if (t.target_layer_ids[i] <= t.target_layer_ids[i - 1])
        fail(where, fmt::format("target.target_layer_ids must be strictly increasing, got {} after {}",
                                t.target_layer_ids[i], t.target_layer_ids[i - 1]));
  }
  const auto& d = c.drafter;
  if (!d.layer_types.empty()) {
    if (int(d.layer_types.size()) != d.layers)
      fail(where, fmt::format("drafter.layer_types has {} entries but drafter.layers is {}; give one per layer or "
                              "leave it empty (all full)", d.layer_types.size(), d.layers));
    bool sliding = std::find(d.layer_types.begin(), d.layer_types.end(), "sliding") != d.layer_types.end();
    if (sliding && d.sliding_window <= 0)
      fail(where, "drafter.layer_types has 'sliding' layers but drafter.sliding_window is 0; set the window, e.g. 2048");
  }
  if (d.heads > 0 && d.kv_heads > 0 && d.heads % d.kv_heads != 0)
    fail(where, fmt::format("drafter.heads ({}) must be a multiple of drafter.kv_heads ({})", d.heads, d.kv_heads));
  const auto& l = c.loss;
  if (l.ce_weight + l.kl_weight + l.cap_weight + l.tv_weight + l.lk_weight + l.nla_weight <= 0)
    fail(where, "loss.ce_weight, loss.kl_weight, loss.cap_weight, loss.tv_weight, loss.lk_weight and "
                "loss.nla_weight are all 0: nothing to train; set one > 0");
  if (l.uses_overlap() && l.kl_temperature != 1)
    fail(where, fmt::format("loss.tv_weight, loss.lk_weight and loss.nla_weight are defined on the untempered "
                            "distributions, but loss.kl_temperature is {}: set it to 1 or turn those terms off",
                            l.kl_temperature));
  if (l.position_weight != model::PositionWeight::decay && l.decay_gamma > 0)
    fail(where, fmt::format("loss.decay_gamma is {} but loss.position_weight is {}: D-PACE replaces the decay; "
                            "remove loss.decay_gamma (or use position_weight: decay)",
                            l.decay_gamma, name_of(l.position_weight)));
  if (c.layout.drafter_dp < c.layout.target_groups)
    fail(where, fmt::format("layout.drafter_dp ({}) < layout.target_groups ({}): every target group needs at least "
                            "one drafter rank to feed", c.layout.drafter_dp, c.layout.target_groups));
  // which device computes in which precision: the backend factory's rule (kernels/device.h), asked, not restated
  if (const std::string refusal = kernels::backend_refusal(c.run.device, c.run.compute_precision()); !refusal.empty())
    fail(where, fmt::format("run.precision is {} but run.device is {}: {}; set run.precision: auto",
                            name_of(c.run.precision), name_of(c.run.device), refusal));
  if (c.layout.transport == comm::TransportChoice::nccl && c.run.device != kernels::Device::cuda)
    fail(where, "layout.transport is nccl but run.device is cpu; nccl needs cuda (use transport: mpi on cpu)");
  if (c.ckpt.resume.empty())
    fail(where, "ckpt.resume is empty; use none, auto or a checkpoint directory");
  // in-training eval: a key that would do nothing is an error rather than a silent no-op
  if (c.eval.every > 0 && c.eval.data.empty())
    fail(where, fmt::format("eval.every is {} but eval.data is empty: set eval.data to a held-out HDF5 dataset (the "
                            "format of data.path) or eval.every: 0", c.eval.every));
  if (!c.eval.data.empty() && c.eval.every == 0)
    fail(where, fmt::format("eval.data is {} but eval.every is 0: set eval.every (e.g. 200) or remove eval.data",
                            c.eval.data));
  if (c.eval.spec_every > 0 && c.eval.prompts.empty())
    fail(where, fmt::format("eval.spec_every is {} but eval.prompts is empty: set eval.prompts to a prompts HDF5 "
                            "(as dflash_eval --prompts) or eval.spec_every: 0", c.eval.spec_every));
  if (!c.eval.prompts.empty() && c.eval.spec_every == 0)
    fail(where, fmt::format("eval.prompts is {} but eval.spec_every is 0: set eval.spec_every (e.g. 1000) or remove "
                            "eval.prompts", c.eval.prompts));
}

std::vector<int> default_target_layer_ids(int num_target_layers, int n_taps) {
  DFLASH_USER_CHECK(num_target_layers >= 4 && n_taps >= 1,
               "cannot place {} taps in a target of {} layers (need at least 4 layers)", n_taps, num_target_layers);
  if (n_taps == 1) return {num_target_layers / 2};
  std::vector<int> ids;
  const double span = num_target_layers - 4;
  // nearbyint rounds half to even, as Python's round() in the reference implementation
  for (int i = 0; i < n_taps; ++i) ids.push_back(int(std::nearbyint(1.0 + i * span / (n_taps - 1))));
  return ids;
}

}  // namespace dflash
