// Command lines on CLI11: dflash::Args (every tool) and dflash_mpi's options. Usage errors are user errors (no
// source location) naming the option; --help is answered, not an error.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "lib/core/args.h"
#include "lib/core/error.h"
#include "lib/job/cli.h"

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

TEST_CASE("cli: Args parses --key value, --key=value, flags and positionals, the last repeat wins") {
  Argv a({"/usr/bin/tool", "in.h5", "--vocab", "512", "--seq=3", "--tie", "out.h5", "--vocab", "600"});
  Args args(a.argc(), a.argv(), {"vocab", "seq", "rtol"}, {"tie"});
  CHECK(args.integer("vocab", 0) == 600);
  CHECK(args.integer("seq", 0) == 3);
  CHECK(args.has("tie"));
  CHECK(!args.has("rtol"));
  CHECK(args.real("rtol", 0.5) == 0.5);
  REQUIRE(args.positional().size() == 2);
  CHECK(args.positional()[1] == "out.h5");
}

TEST_CASE("cli: Args usage errors name the option and carry no source location") {
  Argv unknown({"tool", "--bogus", "1"});
  const std::string e = error_of([&] { Args(unknown.argc(), unknown.argv(), {"vocab"}, {"tie"}); });
  CHECK(e.find("--bogus") != std::string::npos);
  CHECK(e.find("known options: --vocab, --tie") != std::string::npos);
  CHECK(e.find(".cpp:") == std::string::npos);
  Argv missing({"tool", "--vocab"});
  CHECK(error_of([&] { Args(missing.argc(), missing.argv(), {"vocab"}); }).find("--vocab") != std::string::npos);
  Argv bad({"tool", "--vocab", "5x"});
  const Args args(bad.argc(), bad.argv(), {"vocab"});
  const std::string b = error_of([&] { (void)args.integer("vocab", 0); });
  CHECK(b == "--vocab expects an integer, got '5x'");
}

TEST_CASE("cli: --help is answered (HelpShown) with the program's usage and every option") {
  Argv a({"tool", "--help"});
  bool shown = false;
  try {
    Args(a.argc(), a.argv(), {"out", "vocab"}, {"tie", "help"}, "usage: tool --out DIR\n");
  } catch (const HelpShown&) {
    shown = true;
  }
  CHECK(shown);
}

TEST_CASE("cli: dflash_mpi options: config, repeated --set, --stop-after-steps, --check, errors without location") {
  Argv a({"dflash_mpi", "run.yaml", "--set", "optim.lr=3e-4", "--set=run.steps=5", "--stop-after-steps", "7",
          "--check"});
  const auto o = train::parse_program_options(a.argc(), a.argv());
  REQUIRE(o);
  CHECK(o->config == "run.yaml");
  CHECK(o->sets == std::vector<std::string>{"optim.lr=3e-4", "run.steps=5"});
  CHECK(o->stop_after == 7);
  CHECK(o->check);
  CHECK(o->dump_dir.empty());

  Argv help({"dflash_mpi", "--help"});
  CHECK(!train::parse_program_options(help.argc(), help.argv(), /*print_help=*/false));
  Argv none({"dflash_mpi"});
  CHECK(error_of([&] { train::parse_program_options(none.argc(), none.argv()); }).find("CONFIG is required") !=
        std::string::npos);
  Argv zero({"dflash_mpi", "run.yaml", "--stop-after-steps", "0"});
  const std::string z = error_of([&] { train::parse_program_options(zero.argc(), zero.argv()); });
  CHECK(z.find("--stop-after-steps") != std::string::npos);
  CHECK(z.find(".cpp:") == std::string::npos);
  Argv set({"dflash_mpi", "run.yaml", "--set", "optim.lr"});
  CHECK(error_of([&] { train::parse_program_options(set.argc(), set.argv()); })
            .find("--set optim.lr: expected key=value") != std::string::npos);

  Argv ex({"dflash_mpi", "--export", "ckpt/step_00000002", "out", "--dtype", "f32"});
  const auto e = train::parse_export_options(ex.argc(), ex.argv());
  REQUIRE(e);
  CHECK(e->step_dir == "ckpt/step_00000002");
  CHECK(e->dtype == "f32");
  Argv bad_dtype({"dflash_mpi", "--export", "a", "b", "--dtype", "f16"});
  CHECK(error_of([&] { train::parse_export_options(bad_dtype.argc(), bad_dtype.argv()); }).find("--dtype") !=
        std::string::npos);
}

TEST_CASE("cli: the launcher's rank is read from the environment before MPI starts") {
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("PMIX_RANK");
  ::unsetenv("PMI_RANK");
  ::unsetenv("SLURM_PROCID");
  CHECK(train::launcher_rank() == 0);
  ::setenv("SLURM_PROCID", "3", 1);
  CHECK(train::launcher_rank() == 3);
  ::setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  CHECK(train::launcher_rank() == 5);
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  ::unsetenv("SLURM_PROCID");
}
