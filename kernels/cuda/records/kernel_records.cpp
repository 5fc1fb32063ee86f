// Lookup of the generated kernel table (kernels/cuda/records/kernel_records.h); the table itself is
// <build>/kernel_records/kernel_records_table.cpp (cmake/kernel_records.cmake).
#include "kernels/cuda/records/kernel_records.h"

#include <cxxabi.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace dflash::kernels::cuda {

extern const KernelRecord kKernelRecords[];  // generated
extern const int kKernelRecordCount;
extern const char* const kKernelRecordsMissing;  // null when the table was generated

namespace {

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(mangled);
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

using Index = std::map<std::pair<std::string, int>, const KernelRecord*>;
const Index& index() {
  static const Index idx = [] {
    Index m;
    for (int i = 0; i < kKernelRecordCount; ++i)
      m.emplace(std::make_pair(canonical_kernel_name(demangle(kKernelRecords[i].mangled)), kKernelRecords[i].sm),
                &kKernelRecords[i]);
    return m;
  }();
  return idx;
}

}  // namespace

bool kernel_records_available() { return kKernelRecordsMissing == nullptr; }
const char* kernel_records_missing_reason() { return kKernelRecordsMissing ? kKernelRecordsMissing : ""; }

const KernelRecord* find_kernel_record(std::string_view canonical, int sm) {
  const auto it = index().find({std::string(canonical), sm});
  return it == index().end() ? nullptr : it->second;
}

std::string canonical_kernel_name(std::string_view name) {
  std::string s(name);
  // nvcc's anonymous namespaces demangle as "(anonymous namespace)" (or keep their _GLOBAL__N_ source name), the
  // host compiler's pretty names say "{anonymous}"
  replace_all(s, "(anonymous namespace)", "{anon}");
  replace_all(s, "{anonymous}", "{anon}");
  for (size_t at = s.find("_GLOBAL__N_"); at != std::string::npos; at = s.find("_GLOBAL__N_", at)) {
    size_t end = at;
    while (end < s.size() && (std::isalnum(static_cast<unsigned char>(s[end])) || s[end] == '_')) ++end;
    s.replace(at, end - at, "{anon}");
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);  // a template function's demangled name starts with its return type
  // the parameter list: the first '(' outside the template arguments
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (s[i] == '(' && depth == 0) {
      s.erase(i);
      break;
    }
  }
  // Inside the template arguments, qualifiers go: the host compiler spells a type argument relative to where it
  // prints it (CausalTiles), nvcc in full (dflash::kernels::cuda::(anonymous namespace)::CausalTiles).
  const size_t args = s.find('<');
  if (args != std::string::npos) {
    std::string t;
    size_t i = args;
    while (i < s.size()) {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_' || s[j] == '{' ||
                              s[j] == '}'))
        ++j;
      if (j > i && s.compare(j, 2, "::") == 0) {  // a qualifier: drop it with its "::"
        i = j + 2;
        continue;
      }
      if (j == i) ++j;
      t.append(s, i, j - i);
      i = j;
    }
    s = s.substr(0, args) + t;
  }
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == ' ') continue;
    // an integer literal's suffix (u, l, ul, ll, ull) after a digit that ends a number
    if ((c == 'u' || c == 'l') && i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]))) {
      size_t j = i;
      while (j < s.size() && (s[j] == 'u' || s[j] == 'l')) ++j;
      if (j == s.size() || s[j] == ',' || s[j] == '>' || s[j] == ' ' || s[j] == ')') {
        i = j - 1;
        continue;
      }
    }
    out += c;
  }
  return out;
}

}  // namespace dflash::kernels::cuda
