#!/usr/bin/env bash
# Installs dependencies (when missing), builds in Release and runs every test through ctest.
# Usage: bash mpi_launch/test.sh [ctest args...]     (build folder: $DFLASH_BUILD_DIR, default ./build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DFLASH_BUILD_DIR:-$root/build}"
bash "$root/mpi_launch/install_deps.sh"
bash "$root/mpi_launch/install_prep.sh" --serve  # Python environments of data/prep (DFLASH_PREP_SERVE=0: no torch)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure --timeout 600 "$@"
