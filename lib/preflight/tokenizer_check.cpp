#include "lib/preflight/tokenizer_check.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lib/core/error.h"

namespace dflash::preflight {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  DFLASH_USER_CHECK(f, "{}: cannot read", path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    DFLASH_USER_FAIL("{}: not valid JSON ({})", path, e.what());
  }
}

// eos_token_id / bos_token_id of a config object: an integer or a list of them.
void collect_ids(const nlohmann::json& j, const char* key, std::vector<int64_t>& out) {
  if (!j.is_object() || !j.contains(key)) return;
  const auto& v = j.at(key);
  if (v.is_number_integer()) out.push_back(v.get<int64_t>());
  if (v.is_array())
    for (const auto& x : v)
      if (x.is_number_integer()) out.push_back(x.get<int64_t>());
}

}  // namespace

TokenizerFacts read_tokenizer_facts(const std::string& model_dir) {
  TokenizerFacts t;
  const fs::path p = fs::path(model_dir) / "tokenizer.json";
  if (!fs::exists(p)) return t;
  t.path = p.string();
  const nlohmann::json j = read_json(t.path);
  DFLASH_USER_CHECK(j.is_object() && j.contains("model") && j.at("model").is_object() &&
                        j.at("model").contains("vocab") && j.at("model").at("vocab").is_object(),
                    "{}: no model.vocab object: not a Hugging Face tokenizers file", t.path);
  int64_t largest = -1;
  for (const auto& [token, id] : j.at("model").at("vocab").items())
    if (id.is_number_integer()) largest = std::max(largest, id.get<int64_t>());
  if (j.contains("added_tokens") && j.at("added_tokens").is_array())
    for (const auto& a : j.at("added_tokens")) {
      if (!a.is_object() || !a.contains("id") || !a.at("id").is_number_integer()) continue;
      const int64_t id = a.at("id").get<int64_t>();
      largest = std::max(largest, id);
      if (a.value("special", false)) t.special_ids.insert(id);
    }
  t.tokens = largest + 1;
  return t;
}

TokenizerCheck check_tokenizer(const TokenizerFacts& t, const std::string& model_dir, int vocab_size,
                               int32_t data_max_token, int mask_token_id) {
  TokenizerCheck r;
  if (t.path.empty()) return r;
  if (t.tokens > vocab_size)
    r.errors.push_back(fmt::format("{} has {} tokens but config.json's vocab_size is {}: the tokenizer belongs to "
                                   "another model",
                                   t.path, t.tokens, vocab_size));
  std::vector<int64_t> ids;
  for (const char* file : {"config.json", "generation_config.json"}) {
    const fs::path p = fs::path(model_dir) / file;
    if (!fs::exists(p)) continue;
    const nlohmann::json j = read_json(p.string());
    std::vector<int64_t> here;
    collect_ids(j, "eos_token_id", here);
    collect_ids(j, "bos_token_id", here);
    if (j.contains("text_config")) {  // Qwen3.5 ConditionalGeneration keeps the text model's ids there
      collect_ids(j.at("text_config"), "eos_token_id", here);
      collect_ids(j.at("text_config"), "bos_token_id", here);
    }
    for (int64_t id : here)
      if (!t.special_ids.count(id))
        r.errors.push_back(fmt::format("{}: eos/bos id {} is not a special token of {}: the tokenizer and the model "
                                       "disagree",
                                       p.string(), id, t.path));
  }
  if (data_max_token >= t.tokens)
    r.errors.push_back(fmt::format("the data holds token id {} but {} has only {} tokens: the data was tokenized with "
                                   "another tokenizer",
                                   data_max_token, t.path, t.tokens));
  if (mask_token_id < t.tokens)
    r.notes.push_back(fmt::format("drafter.mask_token_id {} is a token {} can produce; a reserved row past the "
                                  "tokenizer (< vocab_size {}) cannot collide with real text",
                                  mask_token_id, t.path, vocab_size));
  return r;
}

std::vector<report::CheckItem> tokenizer_items(const TokenizerFacts& t, const TokenizerCheck& check,
                                               const std::string& model_dir, int vocab_size) {
  std::vector<report::CheckItem> items;
  if (t.path.empty())
    items.push_back({"tokenizer", {fmt::format("none in {} (not checked; data/prep/dflash-prep check compares a "
                                               "tokenizer folder)", model_dir)}});
  else
    items.push_back({"tokenizer", {fmt::format("{}: {} tokens, {} special; fits vocab_size {}, the eos/bos ids and "
                                               "the data", t.path, t.tokens, t.special_ids.size(), vocab_size)}});
  for (const std::string& n : check.notes) items.push_back({"note", {n}});
  return items;
}
}  // namespace dflash::preflight
