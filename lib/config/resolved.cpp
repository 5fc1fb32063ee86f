// The resolved config as users and checkpoints see it: a printed table, YAML for out_dir, and a stable hash.
#include <filesystem>
#include <fstream>

#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "lib/config/config.h"
#include "lib/config/schema.h"
#include "lib/core/atomic_file.h"
#include "lib/core/error.h"

namespace dflash {

namespace {

// One canonical text per value: fmt's shortest round-trip form for floats, so the hash is platform-stable.
std::string format_field(const FieldRef& f) {
  return std::visit(
      [](auto* p) -> std::string {
        using V = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<V, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (is_named_enum_v<V>) {
          return name_of(*p);  // the text the file uses, so the hash does not depend on the enum
        } else if constexpr (std::is_same_v<V, std::vector<int>> || std::is_same_v<V, std::vector<std::string>>) {
          return fmt::format("[{}]", fmt::join(*p, ", "));
        } else {
          return fmt::format("{}", *p);
        }
      },
      f);
}

const char* source_name(ConfigSource s) {
  switch (s) {
    case ConfigSource::kDefault: return "default";
    case ConfigSource::kFile: return "file";
    case ConfigSource::kSet: return "--set";
  }
  return "?";
}

}  // namespace

std::string config_value(const TrainConfig& cfg, const std::string& key) {
  const ConfigKey* k = find_config_key(key);
  DFLASH_CHECK(k, "unknown config key '{}'", key);
  return format_field(k->field(const_cast<TrainConfig&>(cfg)));
}

std::string format_config_table(const TrainConfig& cfg) {
  size_t wk = 3, wv = 5;
  std::vector<std::string> values;
  for (const auto& k : config_schema()) {
    values.push_back(format_field(k.field(const_cast<TrainConfig&>(cfg))));
    wk = std::max(wk, k.path.size());
    wv = std::max(wv, values.back().size());
  }
  std::string out = fmt::format("{:<{}}  {:<{}}  {}\n", "key", wk, "value", wv, "source");
  for (size_t i = 0; i < config_schema().size(); ++i) {
    const auto& k = config_schema()[i];
    auto it = cfg.source.find(k.path);
    auto src = it == cfg.source.end() ? ConfigSource::kDefault : it->second;
    out += fmt::format("{:<{}}  {:<{}}  {}\n", k.path, wk, values[i], wv, source_name(src));
  }
  out += fmt::format("config hash {} (keys that change the training math; docs/config.md)\n", config_hash_hex(cfg));
  return out;
}

std::string config_to_yaml(const TrainConfig& cfg) {
  YAML::Emitter out;
  out << YAML::Comment(fmt::format("resolved config{}; hash {}", cfg.file.empty() ? "" : " of " + cfg.file,
                                   config_hash_hex(cfg)));
  out << YAML::BeginMap;
  for (const auto& section : config_sections()) {
    out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    for (const auto& k : config_schema()) {
      if (k.section() != section) continue;
      out << YAML::Key << k.leaf() << YAML::Value;
      FieldRef f = k.field(const_cast<TrainConfig&>(cfg));
      if (auto* v = std::get_if<std::vector<int>*>(&f)) {
        out << YAML::Flow << **v;
      } else if (auto* s = std::get_if<std::vector<std::string>*>(&f)) {
        out << YAML::Flow << **s;
      } else if (auto* str = std::get_if<std::string*>(&f); str && k.type == KeyType::kString) {
        out << YAML::DoubleQuoted << **str;  // names and paths: quoted, so any text loads back as itself
      } else {
        out << format_field(f);
      }
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string write_resolved_config(const TrainConfig& cfg, const std::string& trailer) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(cfg.run.out_dir, ec);
  DFLASH_CHECK(!ec, "cannot create run.out_dir '{}': {}; set run.out_dir to a writable folder", cfg.run.out_dir,
               ec.message());
  std::string path = (fs::path(cfg.run.out_dir) / "config.resolved.yaml").string();
  std::string text = config_to_yaml(cfg);
  if (!trailer.empty()) text += trailer;
  write_file_atomic(path, text);  // the old file or the new one, never a torn one
  return path;
}

uint64_t config_hash(const TrainConfig& cfg) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64 over "path=value\n" of every hashed key, in table order
  for (const auto& k : config_schema()) {
    if (!k.hashed) continue;
    for (unsigned char c : k.path + "=" + format_field(k.field(const_cast<TrainConfig&>(cfg))) + "\n") {
      h ^= c;
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}

std::string config_hash_hex(const TrainConfig& cfg) { return fmt::format("0x{:016x}", config_hash(cfg)); }

}  // namespace dflash
