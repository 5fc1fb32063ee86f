#include "lib/core/args.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "lib/core/error.h"

namespace dflash {

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& k : v) s += (s.empty() ? "--" : ", --") + k;
  return s;
}

}  // namespace

Args::Args(int argc, char** argv, std::vector<std::string> known, std::vector<std::string> flags,
           const std::string& usage)
    : program_(argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "") {
  known.erase(std::remove(known.begin(), known.end(), "help"), known.end());
  flags.erase(std::remove(flags.begin(), flags.end(), "help"), flags.end());
  std::vector<std::string> all = known;
  for (const auto& f : flags)
    if (std::find(all.begin(), all.end(), f) == all.end()) all.push_back(f);
  const std::string listed = all.empty() ? std::string("none") : join(all);
  // an unknown --name is named as such (CLI11 would call it an unexpected argument)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.size() <= 2 || a.rfind("--", 0) != 0) continue;
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    DFLASH_USER_CHECK(name == "help" || std::find(all.begin(), all.end(), name) != all.end(),
                      "unknown option --{}; known options: {} (--help explains them)", name, listed);
  }
  CLI::App app(usage, program_);
  app.set_help_flag("-h,--help", "print this help and exit");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_windows_style_options(false);
  std::map<std::string, std::string> raw;       // bound to every declared option; only given ones are kept
  std::map<std::string, CLI::Option*> options;
  for (const auto& k : known) {
    if (std::find(flags.begin(), flags.end(), k) != flags.end()) continue;
    options[k] = app.add_option("--" + k, raw[k]);
  }
  for (const auto& k : flags) options[k] = app.add_flag("--" + k);
  app.add_option("arguments", positional_, "positional arguments");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    throw HelpShown{};
  } catch (const CLI::ParseError& e) {
    // no program name: the caller's handler prefixes it ("dflash_data inspect: error: ...")
    DFLASH_USER_FAIL("{}; known options: {} (--help explains them)", e.what(), listed);
  }
  for (const auto& [k, opt] : options) {
    if (opt->count() == 0) continue;
    values_[k] = std::find(flags.begin(), flags.end(), k) != flags.end() ? std::string(1, '1') : raw[k];
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
  errno = 0;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  DFLASH_USER_CHECK(end && *end == '\0' && !it->second.empty() && errno == 0, "--{} expects an integer, got '{}'", key,
                    it->second);
  return v;
}

double Args::real(const std::string& key, double fallback) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  DFLASH_USER_CHECK(end && *end == '\0' && !it->second.empty(), "--{} expects a number, got '{}'", key, it->second);
  return v;
}

}  // namespace dflash
