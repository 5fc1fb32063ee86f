// Command lines on CLI11: lib/core/cli_app.h (every program) and dflash_mpi's options. Usage errors are UsageErrors
// (no source location, exit code 2) naming the option; --help is answered, not an error.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lib/core/cli_app.h"
#include "lib/core/error.h"
#include "lib/job/cli.h"
#include "lib/state/export_command.h"

using namespace dflash;

namespace {

// argv from words (argv[0] first); the strings live as long as the object.
struct Argv {
  std::vector<std::string> words;
  std::vector<char*> ptrs;
  explicit Argv(std::vector<std::string> w) : words(std::move(w)) {
    for (auto& s : words) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
  }
  int argc() const { return int(words.size()); }
  char** argv() { return ptrs.data(); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("cli: CliApp parses typed options, --key=value, flags and positionals, the last repeat wins") {
  Argv a({"/usr/bin/tool", "in.h5", "--vocab", "512", "--seq=3", "--tie", "out.h5", "--vocab", "600"});
  CliApp app("a tool", "tool");
  std::string in, out;
  int vocab = 0, seq = 0;
  double rtol = 0.5;
  bool tie = false;
  app.add_option("IN", in)->required();
  app.add_option("OUT", out)->required();
  app.add_option("--vocab", vocab);
  app.add_option("--seq", seq);
  app.add_option("--rtol", rtol);
  app.add_flag("--tie", tie);
  REQUIRE(parse_command_line(app, a.argc(), a.argv()));
  CHECK(vocab == 600);
  CHECK(seq == 3);
  CHECK(tie);
  CHECK(rtol == 0.5);
  CHECK(in == "in.h5");
  CHECK(out == "out.h5");
}

namespace {

// A UsageError's message from parsing argv into a tool with a required FILE, --vocab INT >= 1, --limit INT,
// --rate FLOAT and --tie.
std::string usage_error_of(std::vector<std::string> words) {
  Argv a(std::move(words));
  CliApp app("a tool", "tool");
  std::string file;
  int vocab = 0;
  bool tie = false;
  app.add_option("FILE", file)->required();
  int64_t limit = 0;
  double rate = 0;
  app.add_option("--vocab", vocab)->check(positive_number());
  app.add_option("--limit", limit);
  app.add_option("--rate", rate);
  app.add_flag("--tie", tie);
  try {
    parse_command_line(app, a.argc(), a.argv());
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("cli: usage errors are UsageErrors naming the option, without source location") {
  // an unknown option is named as such, even when the required FILE is missing too
  const std::string e = usage_error_of({"tool", "--bogus", "1"});
  CHECK(e.find("unknown option --bogus") != std::string::npos);
  CHECK(e.find("`tool --help` lists the options") != std::string::npos);
  CHECK(e.find(".cpp:") == std::string::npos);
  CHECK(usage_error_of({"tool", "f.h5", "--bogus=2"}).find("unknown option --bogus") != std::string::npos);
  CHECK(usage_error_of({"tool", "f.h5", "--vocab"}).find("--vocab") != std::string::npos);
  const std::string nan = usage_error_of({"tool", "f.h5", "--vocab", "5x"});
  CHECK(nan.find("--vocab") != std::string::npos);
  CHECK(nan.find("5x") != std::string::npos);
  CHECK(usage_error_of({"tool", "f.h5", "--vocab", "0"}).find("--vocab") != std::string::npos);
  CHECK(usage_error_of({"tool"}).find("FILE is required") != std::string::npos);
  // a value of the wrong kind, without a validator: the option, the kind it takes and the value (not CLI11's
  // "Could not convert")
  CHECK(usage_error_of({"tool", "f.h5", "--limit", "abc"}) ==
        "--limit: must be a whole number, got 'abc'; `tool --help` lists the options");
  CHECK(usage_error_of({"tool", "f.h5", "--rate", "1e"}).find("--rate: must be a number, got '1e'") !=
        std::string::npos);
  CHECK(usage_error_of({"tool", "f.h5", "--vocab", "3", "--tie"}).empty());
}

TEST_CASE("cli: --help is answered with the usage once and typed options") {
  Argv a({"tool", "--help"});
  CliApp app("a tool", "tool");
  int max_new = 128;
  std::string out;
  app.add_option("--max-new-tokens", max_new, "tokens per prompt")->check(CLI::Range(1, 1 << 20));
  app.add_option("--out", out, "the file")->type_name("FILE");
  CHECK(!parse_command_line(app, a.argc(), a.argv(), /*print_help=*/false));
  const std::string help = app.help();
  CHECK(help.find("Usage:") == help.rfind("Usage:"));
  CHECK(help.find("--max-new-tokens INT in [1 - 1048576] (default 128)") != std::string::npos);
  CHECK(help.find("--out FILE") != std::string::npos);
  CHECK(help.find("TEXT") == std::string::npos);
}

TEST_CASE("cli: run_program and parse_or_exit_code give the exit codes: 2 usage, 1 other errors, 0 help") {
  CHECK(run_program("tool", [] { return 3; }) == 3);
  CHECK(run_program("tool", []() -> int { throw UsageError("bad option"); }) == 2);
  CHECK(run_program("tool", []() -> int { throw Error("no such file"); }) == 1);
  CliApp app("a tool", "tool");
  int n = 0;
  app.add_option("--n", n);
  Argv bad({"tool", "--n", "abc"});
  CHECK(parse_or_exit_code(app, bad.argc(), bad.argv()) == std::optional<int>(2));
  CliApp ok_app("a tool", "tool");
  ok_app.add_option("--n", n);
  Argv ok({"tool", "--n", "4"});
  CHECK(!parse_or_exit_code(ok_app, ok.argc(), ok.argv()));
  CHECK(n == 4);
}

TEST_CASE("cli: dflash_mpi options: config, repeated --set, --stop-after-steps, --check, errors without location") {
  Argv a({"dflash_mpi", "run.yaml", "--set", "optim.lr=3e-4", "--set=run.steps=5", "--stop-after-steps", "7",
          "--check"});
  const auto o = job::parse_program_options(a.argc(), a.argv());
  REQUIRE(o);
  CHECK(o->config == "run.yaml");
  CHECK(o->sets == std::vector<std::string>{"optim.lr=3e-4", "run.steps=5"});
  CHECK(o->stop_after == 7);
  CHECK(o->check);
  CHECK(o->dump_dir.empty());

  Argv help({"dflash_mpi", "--help"});
  CHECK(!job::parse_program_options(help.argc(), help.argv(), /*print_help=*/false));
  Argv none({"dflash_mpi"});
  CHECK(error_of([&] { job::parse_program_options(none.argc(), none.argv()); }).find("CONFIG is required") !=
        std::string::npos);
  Argv zero({"dflash_mpi", "run.yaml", "--stop-after-steps", "0"});
  const std::string z = error_of([&] { job::parse_program_options(zero.argc(), zero.argv()); });
  CHECK(z.find("--stop-after-steps") != std::string::npos);
  CHECK(z.find(".cpp:") == std::string::npos);
  Argv set({"dflash_mpi", "run.yaml", "--set", "optim.lr"});
  CHECK(error_of([&] {
          job::parse_program_options(set.argc(), set.argv());
        }).find("--set optim.lr: expected key=value") != std::string::npos);

  Argv ex({"dflash_mpi", "--export", "ckpt/step_00000002", "out", "--dtype", "f32"});
  const auto e = state::parse_export_options(ex.argc(), ex.argv());
  REQUIRE(e);
  CHECK(e->source == "ckpt/step_00000002");
  CHECK(e->dtype == "f32");
  Argv bad_dtype({"dflash_mpi", "--export", "a", "b", "--dtype", "f16"});
  CHECK(error_of([&] { state::parse_export_options(bad_dtype.argc(), bad_dtype.argv()); }).find("--dtype") !=
        std::string::npos);
}

TEST_CASE("cli: the launcher's rank is read from the environment before MPI starts") {
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("PMIX_RANK");
  ::unsetenv("PMI_RANK");
  ::unsetenv("SLURM_PROCID");
  CHECK(job::launcher_rank() == 0);
  ::setenv("SLURM_PROCID", "3", 1);
  CHECK(job::launcher_rank() == 3);
  ::setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  CHECK(job::launcher_rank() == 5);
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("SLURM_PROCID");
}
