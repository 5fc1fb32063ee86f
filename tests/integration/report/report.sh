#!/usr/bin/env bash
# dflash-prep report (data/prep/dflash_prep/report.py, docs/reporting.md), one case per ctest test: runs
# tests/integration/report/test_report.py CASE in its own Python environment, data/prep/.venv-report
# (requirements-report.txt: tensorboard, wandb), made here once (a stamp holds the requirements' hash; flock: one
# installer when ctest runs cases in parallel). Exit 77 = ctest SKIP, only when that environment cannot be made
# (no network, no python3-venv).
#   report.sh SOURCE_DIR BUILD_DIR WORK_DIR CASE
set -euo pipefail
src="$1" build="$2" work="$3" case="$4"
venv="${DFLASH_REPORT_VENV:-$src/data/prep/.venv-report}"
req="$src/data/prep/requirements-report.txt"
mkdir -p "$work" "$venv"
# the environment is not part of the repository: a .gitignore of its own keeps it out of git status
[[ -f "$venv/.gitignore" ]] || echo '*' >"$venv/.gitignore"
want="$(sha256sum <"$req" | cut -d' ' -f1)"
log="$work/install_$case.log"
install() {
  if [[ -x "$venv/bin/python" && -f "$venv/.requirements.sha256" && "$(cat "$venv/.requirements.sha256")" == "$want" ]]; then
    return 0
  fi
  local start=$SECONDS
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv" || {
    echo "'python3 -m venv $venv' failed; on Debian/Ubuntu install python3-venv"
    return 1
  }
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req" || return 1
  echo "$want" >"$venv/.requirements.sha256"
  echo "installed $req into $venv in $((SECONDS - start)) s"
}
# the lock lives in the environment's folder: one installer per environment, whichever build tree runs the tests
if ! (flock 9 && install) 9>"$venv/.install.lock" >"$log" 2>&1; then
  cat "$log"
  echo "SKIP ($case): the Python environment $venv for dflash-prep report cannot be created (see above); make it" \
       "with: python3 -m venv $venv && $venv/bin/python -m pip install -r $req"
  exit 77
fi
cat "$log"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" WANDB_SILENT=true
exec "$venv/bin/python" "$src/tests/integration/report/test_report.py" "$case" --src "$src" --build "$build" \
  --work "$work/$case" --python "$venv/bin/python"
