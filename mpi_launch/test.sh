#!/usr/bin/env bash
# Installs dependencies (when missing), builds in Release and runs every test through ctest.
# Usage: bash mpi_launch/test.sh [ctest args...]     (build folder: $DFLASH_BUILD_DIR, default ./build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DFLASH_BUILD_DIR:-$root/build}"
bash "$root/mpi_launch/install_deps.sh"
# Python environments of data/prep; the serving one (torch, ~5.7 GB; DFLASH_PREP_SERVE=0 leaves it out) only feeds
# the real-server test, which reports itself skipped, with the reason, when it could not be made
bash "$root/mpi_launch/install_prep.sh" --serve ||
  echo "test.sh: warning: install_prep.sh --serve failed (see above); data_prep tests that need it will be skipped"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure --timeout 600 "$@"
