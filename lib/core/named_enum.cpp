#include "lib/core/named_enum.h"

#include <algorithm>
#include <cctype>

namespace dflash {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_choice(const std::string& text, const std::vector<std::string>& choices) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  std::string best;
  size_t best_d = std::max<size_t>(1, lower.size() / 3) + 1;  // farther than this is not a typo
  for (const std::string& c : choices) {
    const size_t d = edit_distance(lower, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

}  // namespace dflash
