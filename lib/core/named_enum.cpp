#include "lib/core/named_enum.h"

#include <algorithm>
#include <cctype>

namespace dflash {

size_t edit_distance(const std::string& a, const std::string& b) {
  // rows i - 2, i - 1 and i of the table (optimal string alignment: a swap of neighbours is one edit)
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], before[j - 2] + 1);
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_choice(const std::string& text, const std::vector<std::string>& choices) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  // a typo keeps the first letter ("gpu" is not a typo of "cpu") and changes at most a third of the word
  std::string best;
  size_t best_d = std::max<size_t>(1, lower.size() / 3) + 1;
  for (const std::string& c : choices) {
    const size_t d = edit_distance(lower, c);
    if (d < best_d && !c.empty() && !lower.empty() && c[0] == lower[0]) best_d = d, best = c;
  }
  return best;
}

}  // namespace dflash
