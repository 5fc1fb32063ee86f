#pragma once
// `program SUBCOMMAND [options]` dispatch shared by the multi-tool programs (dflash_data, dflash_bench): usage
// listing, unknown-subcommand message, and one place that turns an exception into "program sub: error: ..." + 2
// (a UsageError: lib/core/cli_app.h) or 1. Each subcommand parses its own options with a CliApp named "program sub".
#include <span>

namespace dflash {

struct Subcommand {
  const char* name;
  int (*run)(int argc, char** argv);  // argv[0] = the subcommand name
  const char* help;
};

// Runs the subcommand argv[1] names; returns its exit code (2 for usage errors, 1 for another exception).
// `footer`, when given, is printed after the list of subcommands.
int run_subcommand(const char* program, std::span<const Subcommand> subcommands, int argc, char** argv,
                   const char* footer = nullptr);

}  // namespace dflash
