#pragma once
// One item of `dflash_mpi CONFIG --check`'s report (lib/preflight/run_check.h): the code that owns what it checks
// builds it (the memory plan, an eval, the tokenizer check, ...), run_check prints the list in its order. An item's
// verdict other than ok says why the job cannot run as configured; the worst one decides the report's first line
// and --check's exit code.
#include <string>
#include <utility>
#include <vector>

namespace dflash::report {

enum class Verdict {
  ok,
  incomplete,    // the job needs something not there yet (the target's weights): exit 2
  does_not_fit,  // the job would not fit in memory as configured (the memory plan says where): exit 3
};

struct CheckItem {
  std::string name;                // the report's first column: "eval data", "per-GPU memory"
  std::vector<std::string> lines;  // the first beside the name (none: the name alone), the rest below as they are
  Verdict verdict = Verdict::ok;
  std::string why;                 // verdict not ok: the reason (the report's first line, stderr)

  CheckItem(std::string name_, std::vector<std::string> lines_, Verdict verdict_ = Verdict::ok, std::string why_ = "")
      : name(std::move(name_)), lines(std::move(lines_)), verdict(verdict_), why(std::move(why_)) {}
};

// The items as the report prints them: "  " + the name in 15 columns + its first line, then its other lines.
std::string format_check_items(const std::vector<CheckItem>& items);
// The lines of a text (a table that ends in a newline gives no empty last line).
std::vector<std::string> lines_of(const std::string& text);

}  // namespace dflash::report
