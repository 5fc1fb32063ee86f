#!/usr/bin/env bash
# dflash_prep (data/prep/) end to end, one case per ctest test: runs tests/integration/data_prep/test_data_prep.py
# in the Python environment of mpi_launch/install_prep.sh (made here when missing; exit 77 = ctest SKIP only when
# it cannot be made, e.g. no network or no python3-venv).
#   data_prep.sh SOURCE_DIR BUILD_DIR WORK_DIR CASE
set -euo pipefail
src="$1" build="$2" work="$3" case="$4"
venv="${DFLASH_PREP_VENV:-$src/data/prep/.venv}"
mkdir -p "$work"
# one installer at a time when ctest runs the cases in parallel; a no-op when the environment is up to date
if ! flock "$work/.install.lock" bash "$src/mpi_launch/install_prep.sh" >"$work/install_$case.log" 2>&1; then
  cat "$work/install_$case.log"
  echo "SKIP ($case): the Python environment $venv for dflash_prep cannot be created (see above); run" \
       "bash mpi_launch/install_prep.sh"
  exit 77
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
exec "$venv/bin/python" "$src/tests/integration/data_prep/test_data_prep.py" "$case" --src "$src" --build "$build" \
  --work "$work"
