#!/usr/bin/env bash
# Every twin family's ctest filter selects at least one test case of dflash_cuda_tests (listing needs no GPU), so a
# renamed test can never turn a cuda_twin_<family> test into a vacuous pass on a GPU machine.
# Usage: check_filters.sh DFLASH_CUDA_TESTS FAMILY...
set -euo pipefail
bin="$1"
shift
for family in "$@"; do
  n=$("$bin" --list-test-cases "--test-case=cuda twin $family:*" | grep -c "^cuda twin $family:" || true)
  echo "$family: $n test cases"
  if [[ "$n" -lt 1 ]]; then
    echo "no test case of dflash_cuda_tests is named 'cuda twin $family: ...'; rename it or fix tests/cuda/CMakeLists.txt" >&2
    exit 1
  fi
done
