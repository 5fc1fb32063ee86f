// dflash_data import-prompts IN.jsonl... --tokenizer DIR --out OUT.h5 [...]
// Text prompt sets (MT-Bench `turns`, GSM8K `question`, HumanEval `prompt`, chat `messages`) need the target's
// tokenizer and chat template, which live in Python (transformers): this subcommand runs
// `data/prep/dflash-prep prompts` with the same arguments (data/prep/dflash_prep/prompts_cmd.py, docs/eval.md).
// The wrapper is $DFLASH_PREP when set, else data/prep/dflash-prep in the first folder above this program that
// has one (a build folder inside the source tree).
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/dflash_data/commands.h"
#include "lib/core/error.h"

namespace dflash::data {

namespace {

namespace fs = std::filesystem;

std::string find_prep() {
  if (const char* env = std::getenv("DFLASH_PREP"); env && *env) {
    DFLASH_USER_CHECK(fs::is_regular_file(env), "DFLASH_PREP={}: no such file (the data/prep/dflash-prep wrapper "
                      "of the dflash_mpi source tree)", env);
    return env;
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path dir = ec ? fs::current_path() : self.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    const fs::path candidate = dir / "data" / "prep" / "dflash-prep";
    if (fs::is_regular_file(candidate)) return candidate.string();
    if (dir == dir.root_path()) break;
  }
  DFLASH_USER_FAIL("import-prompts runs data/prep/dflash-prep (Python: the target's tokenizer and chat template) and "
                   "found none above {}; set DFLASH_PREP=SOURCE/data/prep/dflash-prep, or run it directly: "
                   "data/prep/dflash-prep prompts IN.jsonl --tokenizer DIR --out OUT.h5 (docs/eval.md)",
                   ec ? fs::current_path().string() : self.parent_path().string());
  return {};
}

}  // namespace

int run_import_prompts(int argc, char** argv) {
  const std::string prep = find_prep();
  std::vector<std::string> args = {"bash", prep, "prompts"};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargs;
  for (std::string& s : args) cargs.push_back(s.data());
  cargs.push_back(nullptr);
  execvp("bash", cargs.data());
  DFLASH_USER_FAIL("import-prompts: cannot run bash {}: {}", prep, std::strerror(errno));
  return 1;
}

}  // namespace dflash::data
