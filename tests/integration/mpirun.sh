#!/usr/bin/env bash
# mpirun with the flags a single small machine needs: more ranks than cores (--oversubscribe), root in CI and
# containers (--allow-run-as-root), one BLAS/OpenMP thread per rank. Usage: mpirun.sh -np N program args...
set -euo pipefail
flags=(--oversubscribe --bind-to none)
if [[ $(id -u) -eq 0 ]]; then flags+=(--allow-run-as-root); fi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
exec mpirun "${flags[@]}" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$@"
