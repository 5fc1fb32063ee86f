#!/usr/bin/env bash
# Every doctest test case must be selectable by the ctest entry doctest_discover_tests makes for it: CMake splits
# a name at ';' into two bogus entries whose filters select nothing, and such an entry passes without running
# anything (a vacuous pass that once hid a failing test). Lists each binary's test cases (no GPU needed) and fails
# on any name with a ';'.
# Usage: check_test_names.sh BINARY...   (a binary that cannot list, e.g. dflash_cuda_tests without CUDA, is skipped)
set -uo pipefail
bad=0
for bin in "$@"; do
  names="$("$bin" --list-test-cases 2>/dev/null)" || { echo "$(basename "$bin"): cannot list its test cases here; not checked"; continue; }
  count=$(grep -c '' <<<"$names")
  semis=$(grep ';' <<<"$names" | grep -v '^\[doctest\]' || true)
  echo "$(basename "$bin"): $count lines listed"
  if [[ -n "$semis" ]]; then
    echo "test case names with ';' (ctest runs nothing for them; use ',' instead):" >&2
    echo "$semis" >&2
    bad=1
  fi
done
exit $bad
