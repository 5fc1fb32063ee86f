#pragma once
// Reading one key of a JSON object (config.json, state.json) with an error that names the file and the key.
#include <string>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"

namespace dflash {

// j[key] as T; a missing key or a value of another type is a user error "SOURCE: missing key 'KEY'" /
// "SOURCE: key 'KEY' has the wrong type (...)". source names the file (and what it is, e.g. "checkpoint X").
template <typename T>
T json_field(const nlohmann::json& j, const char* key, const std::string& source) {
  DFLASH_USER_CHECK(j.is_object() && j.contains(key), "{}: missing key '{}'", source, key);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    DFLASH_USER_FAIL("{}: key '{}' has the wrong type ({})", source, key, e.what());
  }
}

}  // namespace dflash
