#include "lib/report/check_item.h"

#include <fmt/format.h>

namespace dflash::report {

std::string format_check_items(const std::vector<CheckItem>& items) {
  std::string out;
  for (const CheckItem& item : items) {
    if (item.lines.empty() || item.lines[0].empty())
      out += "  " + item.name + "\n";
    else
      out += fmt::format("  {:<14} {}\n", item.name, item.lines[0]);  // a name of 15 or more: one space
    for (size_t i = 1; i < item.lines.size(); ++i) out += item.lines[i] + "\n";
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at);
    out.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return out;
}

}  // namespace dflash::report
