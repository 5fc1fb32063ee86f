// dflash_data import-prompts IN.jsonl... --tokenizer DIR --out OUT.h5 [...]
// Text prompt sets (MT-Bench `turns`, GSM8K `question`, HumanEval `prompt`, chat `messages`) need the target's
// tokenizer and chat template, which live in Python (transformers): this subcommand runs `dflash-prep prompts`
// with the same arguments (data/prep/dflash_prep/prompts_cmd.py, docs/eval.md). The first found of
//   1. $DFLASH_PREP: the console script or the data/prep/dflash-prep wrapper;
//   2. `dflash-prep` on PATH: the console script of the installed package (pip install data/prep, or the
//      environment of mpi_launch/install_prep.sh with its bin/ on PATH);
//   3. data/prep/dflash-prep in the first folder above this program that has one (a build folder inside the
//      source tree), run with bash.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "apps/dflash_data/commands.h"
#include "lib/core/error.h"

namespace dflash::data {

namespace {

namespace fs = std::filesystem;

struct Prep {
  std::string path;
  bool with_bash;  // the wrapper script, run as 'bash WRAPPER' (so it works without its exec bit too)
};

bool is_executable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
}

// The console script in a folder of PATH, or "" when none has one.
std::string find_on_path() {
  const char* path = std::getenv("PATH");
  if (!path) return {};
  std::string_view rest = path;
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string_view dir = rest.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    if (dir.empty()) continue;  // an empty entry means the current folder: never a place for an installed tool
    const fs::path candidate = fs::path(dir) / "dflash-prep";
    if (is_executable(candidate)) return candidate.string();
  }
  return {};
}

Prep find_prep() {
  if (const char* env = std::getenv("DFLASH_PREP"); env && *env) {
    DFLASH_USER_CHECK(fs::is_regular_file(env), "DFLASH_PREP={}: no such file (the dflash-prep console script, "
                      "or the data/prep/dflash-prep wrapper of the dflash_mpi source tree)", env);
    return {env, !is_executable(env)};
  }
  if (std::string on_path = find_on_path(); !on_path.empty()) return {on_path, false};
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path dir = ec ? fs::current_path() : self.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    const fs::path candidate = dir / "data" / "prep" / "dflash-prep";
    if (fs::is_regular_file(candidate)) return {candidate.string(), true};
    if (dir == dir.root_path()) break;
  }
  DFLASH_USER_FAIL("import-prompts runs dflash-prep (Python: the target's tokenizer and chat template) and found "
                   "none: DFLASH_PREP is not set, no dflash-prep on PATH, no data/prep/dflash-prep above {}; install "
                   "it (bash mpi_launch/install_prep.sh, then put data/prep/.venv/bin on PATH, or pip install "
                   "SOURCE/data/prep), set DFLASH_PREP=SOURCE/data/prep/dflash-prep, or run it directly: "
                   "dflash-prep prompts IN.jsonl --tokenizer DIR --out OUT.h5 (docs/eval.md)",
                   ec ? fs::current_path().string() : self.parent_path().string());
  return {};
}

}  // namespace

int run_import_prompts(int argc, char** argv) {
  const Prep prep = find_prep();
  std::vector<std::string> args;
  if (prep.with_bash) args.emplace_back("bash");
  args.push_back(prep.path);
  args.emplace_back("prompts");
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargs;
  for (std::string& s : args) cargs.push_back(s.data());
  cargs.push_back(nullptr);
  if (prep.with_bash)
    execvp("bash", cargs.data());
  else
    execv(prep.path.c_str(), cargs.data());
  DFLASH_USER_FAIL("import-prompts: cannot run {}{}: {}", prep.with_bash ? "bash " : "", prep.path,
                   std::strerror(errno));
  return 1;
}

}  // namespace dflash::data
