#!/usr/bin/env bash
# dflash-prep report (data/prep/dflash_prep/report.py, docs/reporting.md), one case per ctest test: runs
# tests/integration/report/test_report.py CASE in the data tool's Python environment with its [report] extra
# (tensorboard, wandb), made by mpi_launch/install_prep.sh --report (a no-op when up to date; it locks the
# environment itself). Exit 77 = ctest SKIP, only when that environment cannot be made (no network, no
# python3-venv).
#   report.sh SOURCE_DIR BUILD_DIR WORK_DIR CASE
set -euo pipefail
src="$1" build="$2" work="$3" case="$4"
venv="${DFLASH_PREP_VENV:-$src/data/prep/.venv}"
mkdir -p "$work"
log="$work/install_$case.log"
if ! bash "$src/mpi_launch/install_prep.sh" --report >"$log" 2>&1; then
  cat "$log"
  echo "SKIP ($case): the Python environment $venv for dflash-prep report cannot be created (see above); make it" \
       "with: bash mpi_launch/install_prep.sh --report"
  exit 77
fi
cat "$log"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" WANDB_SILENT=true
exec "$venv/bin/python" "$src/tests/integration/report/test_report.py" "$case" --src "$src" --build "$build" \
  --work "$work/$case" --python "$venv/bin/python"
