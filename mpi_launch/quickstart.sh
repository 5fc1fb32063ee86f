#!/usr/bin/env bash
# Fresh machine to a trained tiny drafter: installs dependencies (when missing), builds in Release, makes the tiny
# random Qwen3 target and its target-regenerated data (data/make_tiny.sh), then trains with 8 MPI ranks on this
# machine (5 target TP + 3 drafter DP; mpi_launch/configs/tiny.yaml). Outputs: runs/tiny_data/, runs/tiny/
# (logs/rank_XX.log, metrics.jsonl, config.resolved.yaml, ckpt/, drafter_final.safetensors).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DFLASH_BUILD_DIR:-$root/build}"
bash "$root/mpi_launch/install_deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)"
cd "$root"
if [[ ! -f runs/tiny_data/train.h5 ]]; then
  bash data/make_tiny.sh "$build" runs/tiny_data
fi
# a checkpoint every 200 steps (and at the end), so the result can be exported: dflash_mpi --export. Run again, it
# trains again: run.start_over moves the previous run to runs/tiny/superseded/<time>/ (nothing is deleted)
DFLASH_BIN="$build/apps/dflash_mpi" bash mpi_launch/run_local.sh -np 8 mpi_launch/configs/tiny.yaml \
  --set ckpt.every=200 --set run.start_over=true "$@"
