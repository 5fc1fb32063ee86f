#include "lib/core/args.h"

#include <algorithm>
#include <cstdlib>

#include "lib/core/error.h"

namespace dflash {

static std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& k : v) s += (s.empty() ? "--" : ", --") + k;
  return s;
}

Args::Args(int argc, char** argv, std::vector<std::string> known, std::vector<std::string> flags)
    : program_(argc > 0 ? argv[0] : "") {
  auto is = [](const std::vector<std::string>& v, const std::string& k) {
    return std::find(v.begin(), v.end(), k) != v.end();
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    bool has_value = false;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
      has_value = true;
    }
    DFLASH_CHECK(is(known, key) || is(flags, key), "{}: unknown option --{}; known options: {}", program_, key,
                 join(known) + (flags.empty() ? "" : ", " + join(flags)));
    if (is(flags, key)) {
      DFLASH_CHECK(!has_value, "{}: option --{} takes no value", program_, key);
      values_.insert_or_assign(key, std::string(1, '1'));  // not = "1": GCC 12 -Wrestrict false positive
      continue;
    }
    if (!has_value) {
      DFLASH_CHECK(i + 1 < argc, "{}: option --{} needs a value", program_, key);
      value = argv[++i];
    }
    values_[key] = value;
  }
}

std::string Args::str(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

long long Args::integer(const std::string& key, long long fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  DFLASH_CHECK(end && *end == '\0' && !it->second.empty(), "{}: --{} expects an integer, got '{}'", program_, key,
               it->second);
  return v;
}

double Args::real(const std::string& key, double fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  DFLASH_CHECK(end && *end == '\0' && !it->second.empty(), "{}: --{} expects a number, got '{}'", program_, key,
               it->second);
  return v;
}

}  // namespace dflash
