#pragma once
// Command-line options of the form `--key value` or `--key=value` (and bare `--flag`), parsed by CLI11 and
// checked against the keys a program declares: an unknown or malformed option is a user error (no source
// location) that names it and lists the known ones. Every program built on it answers -h / --help: the help
// (the program's usage text, then the options) goes to stdout and HelpShown is thrown, which run_subcommand
// (and each main) turns into exit code 0.
#include <map>
#include <string>
#include <vector>

namespace dflash {

// Thrown after --help was printed. Deliberately not a std::exception: error handlers must not report it.
struct HelpShown {};

class Args {
 public:
  // `known`: option names without the leading dashes. `flags`: the subset that takes no value ("help" is always
  // understood and may be listed or not). `usage`: printed first by --help (what the program does, its
  // positional arguments, what each option means).
  Args(int argc, char** argv, std::vector<std::string> known, std::vector<std::string> flags = {},
       const std::string& usage = "");

  bool has(const std::string& key) const { return values_.count(key) > 0; }
  std::string str(const std::string& key, const std::string& fallback) const;
  long long integer(const std::string& key, long long fallback) const;
  double real(const std::string& key, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::string program_;
  std::map<std::string, std::string> values_;  // the options given (flags as "1"); a repeated option: the last
  std::vector<std::string> positional_;
};

}  // namespace dflash
