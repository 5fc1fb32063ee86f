#pragma once
// Settings that take one of a few names (run.device, run.precision, layout.transport, loss.mode, ...): an enum class
// whose names, in enum order, are written once beside it as `names_of(E)` (found by argument-dependent lookup):
//   enum class Device { cpu, cuda };
//   constexpr std::array<const char*, 2> names_of(Device) { return {"cpu", "cuda"}; }
// Text becomes the enum in one place (the config's parser, a program's option) and is compared nowhere else;
// name_of(e) is what the file and the logs write.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace dflash {

template <typename E>
const char* name_of(E e) {
  return names_of(e)[size_t(e)];
}

template <typename E>
std::optional<E> parse_name(const std::string& text) {
  const auto names = names_of(E{});
  for (size_t i = 0; i < names.size(); ++i)
    if (text == names[i]) return E(i);
  return std::nullopt;
}

template <typename E>
std::vector<std::string> choices_of() {
  const auto names = names_of(E{});
  return {names.begin(), names.end()};
}

// The edits (insert, delete or replace a character, swap two neighbours) that turn a into b.
size_t edit_distance(const std::string& a, const std::string& b);
// The choice closest to `text` when it is a typo of one ("cdua" -> "cuda", "NCCL" -> "nccl"); "" when none is close.
std::string closest_choice(const std::string& text, const std::vector<std::string>& choices);

}  // namespace dflash
