#!/usr/bin/env bash
# Runs dflash_mpi on this machine: mpirun with the flags one machine needs and BLAS/OpenMP threads set so that
# ranks × threads does not exceed the cores.
#   usage: mpi_launch/run_local.sh [-np N] CONFIG.yaml [--set key=value ...]
#   env:   DFLASH_BIN (default: build/apps/dflash_mpi next to this script's repo), DFLASH_THREADS (per rank)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DFLASH_BIN:-$root/build/apps/dflash_mpi}"
np=8
if [[ "${1:-}" == "-np" ]]; then np="$2"; shift 2; fi
if [[ $# -lt 1 ]]; then
  echo "usage: $0 [-np N] CONFIG.yaml [--set key=value ...]" >&2
  exit 2
fi
if [[ ! -x "$bin" ]]; then
  echo "run_local.sh: $bin not found; build first (bash mpi_launch/test.sh, or cmake --build build)" >&2
  exit 2
fi
cores="$(nproc)"
threads="${DFLASH_THREADS:-$(( cores / np > 0 ? cores / np : 1 ))}"
flags=(--bind-to none)
(( np > cores )) && flags+=(--oversubscribe)   # more ranks than cores: let them share
[[ $(id -u) -eq 0 ]] && flags+=(--allow-run-as-root)
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
# CUDA loads every kernel at start (lazy loading would load one while an NCCL kernel spins for its peer, and
# serialise the device behind it: docs/cuda.md, "Two NCCL communicators per rank"); the user's value wins
export CUDA_MODULE_LOADING="${CUDA_MODULE_LOADING:-EAGER}"
exec mpirun "${flags[@]}" -np "$np" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x CUDA_MODULE_LOADING "$bin" "$@"
