#include "lib/core/subcommands.h"

#include <cstdio>
#include <string>

#include "lib/core/cli_app.h"

namespace dflash {

namespace {

void usage(const char* program, std::span<const Subcommand> subcommands, const char* footer) {
  std::fprintf(stderr, "usage: %s SUBCOMMAND [--help] [options]\n\nsubcommands:\n", program);
  for (const auto& s : subcommands) std::fprintf(stderr, "  %-14s %s\n", s.name, s.help);
  if (footer) std::fprintf(stderr, "\n%s\n", footer);
}

}  // namespace

int run_subcommand(const char* program, std::span<const Subcommand> subcommands, int argc, char** argv,
                   const char* footer) {
  const std::string first = argc >= 2 ? argv[1] : "";
  if (argc < 2 || first == "--help" || first == "-h") {
    usage(program, subcommands, footer);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& s : subcommands) {
    if (first != s.name) continue;
    return run_program(std::string(program) + " " + s.name, [&] { return s.run(argc - 1, argv + 1); });
  }
  std::fprintf(stderr, "%s: unknown subcommand '%s'\n", program, first.c_str());
  usage(program, subcommands, footer);
  return 2;
}

}  // namespace dflash
