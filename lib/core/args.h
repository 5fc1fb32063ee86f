#pragma once
// Command-line options of the form `--key value` or `--key=value` (and bare `--flag`), checked against the
// keys a program declares: an unknown or malformed option is an error that names it and lists the known ones.
#include <map>
#include <string>
#include <vector>

namespace dflash {

class Args {
 public:
  // `known`: option names without the leading dashes. `flags`: the subset that takes no value.
  Args(int argc, char** argv, std::vector<std::string> known, std::vector<std::string> flags = {});

  bool has(const std::string& key) const { return values_.count(key) > 0; }
  std::string str(const std::string& key, const std::string& fallback) const;
  long long integer(const std::string& key, long long fallback) const;
  double real(const std::string& key, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::string program_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace dflash
