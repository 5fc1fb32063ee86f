#!/usr/bin/env bash
# Fresh machine to first run: installs dependencies (when missing), builds in Release, and runs the main job on
# the small embedded default. Until the trainer lands (issue: dflash_mpi end to end) the main job is the drafter
# forward+backward benchmark at a small size; this script then switches to `mpirun -np 8 dflash_mpi`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DFLASH_BUILD_DIR:-$root/build}"
bash "$root/mpi_launch/install_deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)"
threads="$(nproc)"
OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" \
  "$build/apps/dflash_bench" drafter --seq 512 --anchors 32 --hidden 256 --heads 4 --kv-heads 2 \
  --head-dim 64 --intermediate 768 --layers 2
