#pragma once
// Errors a user can cause (config, data, files, layout) and internal invariants.
// A user error names the file, key, rank or value and says how to fix it; callers let it propagate to main,
// which prints it and (under MPI) aborts the world so that no rank hangs.
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace dflash {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// DFLASH_CHECK(cond, "fmt {}", args...): throws dflash::Error with the message and the source location.
#define DFLASH_CHECK(cond, ...)                                                                     \
  do {                                                                                              \
    if (!(cond)) {                                                                                  \
      throw ::dflash::Error(fmt::format("{} ({}:{})", fmt::format(__VA_ARGS__), __FILE__, __LINE__)); \
    }                                                                                               \
  } while (0)

// DFLASH_USER_CHECK(cond, "fmt {}", args...): a user error (bad file, value, option) whose message already names
// the file, key or row and the fix: thrown without the source location, which would only distract the user.
#define DFLASH_USER_CHECK(cond, ...)                                  \
  do {                                                                \
    if (!(cond)) throw ::dflash::Error(fmt::format(__VA_ARGS__));     \
  } while (0)

// DFLASH_USER_FAIL("fmt {}", args...): the same, unconditionally.
#define DFLASH_USER_FAIL(...) DFLASH_USER_CHECK(false, __VA_ARGS__)

// DFLASH_FAIL("fmt {}", args...): throws unconditionally.
#define DFLASH_FAIL(...) DFLASH_CHECK(false, __VA_ARGS__)

}  // namespace dflash
