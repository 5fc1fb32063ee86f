#pragma once
// The command line of every program, on CLI11: an app with the project's settings and help layout, one parse that
// turns CLI11's errors into the project's (a UsageError naming the option, exit code 2), and the main() wrapper that
// prints an error as "PROGRAM: error: ..." with the project's exit codes (2 usage, 1 anything else).
//   CliApp app("what the program does", "dflash_data inspect");
//   app.add_option("FILE", path, "the dataset")->required()->type_name("FILE.h5");
//   app.add_option("--vocab", vocab, "also check every token id < V")->check(positive_number());
//   if (!parse_command_line(app, argc, argv)) return 0;  // --help was printed
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

#include "lib/core/error.h"
#include "lib/core/named_enum.h"

namespace dflash {

// A mistake on the command line (an unknown option, a value of the wrong type or out of range, a missing argument):
// the program prints it without a source location and exits 2.
struct UsageError : Error {
  using Error::Error;
};

// Bounds for numeric options with messages that read well ("--limit: must be >= 0, got -5"); CLI11's own
// PositiveNumber / NonNegativeNumber print the range up to DBL_MAX.
CLI::Validator positive_number();
CLI::Validator non_negative_number();

// -h / --help, a repeated option's last value wins, defaults shown in the help as "(default 128)" and a bound as
// "INT in [1 - 1048576]" (CLIFormatter), no Windows-style /options.
class CliApp : public CLI::App {
 public:
  CliApp(const std::string& description, const std::string& name);
};

// An option whose value is one of an enum's names (lib/core/named_enum.h: --device cpu|cuda), stored as the enum;
// `allowed` (empty: every name) is what this program takes. Another value is a usage error listing them.
CLI::Option* add_named_option(CLI::App& app, const std::string& name, const std::string& help,
                              const std::vector<std::string>& choices,
                              const std::function<void(const std::string&)>& store);
template <typename E>
std::vector<std::string> named_choices(const std::vector<E>& allowed) {
  if (allowed.empty()) return choices_of<E>();
  std::vector<std::string> out;
  for (E e : allowed) out.push_back(name_of(e));
  return out;
}
template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>>
CLI::Option* add_named_option(CLI::App& app, const std::string& name, E& value, const std::string& help,
                              const std::vector<E>& allowed = {}) {
  return add_named_option(app, name, help, named_choices(allowed), [&value](const std::string& s) {
           value = *parse_name<E>(s);
         })->default_str(name_of(value));
}
// The same for an option with no default (its absence means something: nullopt).
template <typename E>
CLI::Option* add_named_option(CLI::App& app, const std::string& name, std::optional<E>& value,
                              const std::string& help, const std::vector<E>& allowed = {}) {
  return add_named_option(app, name, help, named_choices(allowed),
                          [&value](const std::string& s) { value = *parse_name<E>(s); });
}

// Parses argv (argv[0] = the program or subcommand name, skipped) into app. --help: prints the help to stdout when
// print_help and returns false. A usage error throws UsageError "MESSAGE; `NAME --help` lists the options"; an
// unknown option is named as such ("unknown option --x") even when something else is missing too.
bool parse_command_line(CLI::App& app, int argc, char** argv, bool print_help = true);

// For a main() that parses before anything else runs: std::nullopt when argv parsed; else the exit code to return:
// 0 after --help, 2 after printing the usage error as "NAME: error: ..." (NAME: the app's name).
std::optional<int> parse_or_exit_code(CLI::App& app, int argc, char** argv);

// main()'s error handling: body's exit code; a UsageError is printed as "NAME: error: ..." and gives 2, any other
// exception the same and 1.
int run_program(const std::string& name, const std::function<int()>& body);

}  // namespace dflash
