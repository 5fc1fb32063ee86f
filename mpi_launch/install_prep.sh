#!/usr/bin/env bash
# Installs the dflash-prep package (data/prep: pyproject.toml, its pinned dependencies in data/prep/requirements*.txt)
# into virtual environments, editable: the environment runs this checkout's code, so editing it needs no
# reinstall; $VENV/bin/dflash-prep is its console script. Idempotent: an environment whose stamp matches the
# package's files (pyproject.toml, the requirements files, this checkout's path, the extras) is left alone.
# Usage: bash mpi_launch/install_prep.sh [--serve] [--report]
#          (always)  data/prep -> $DFLASH_PREP_VENV (default data/prep/.venv; no torch: ~45 s, 320 MB)
#          --report  the [report] extra too, in the same environment (tensorboard, wandb: ~30 s, 275 MB)
#          --serve   data/prep[serve] -> $DFLASH_PREP_SERVE_VENV (default data/prep/.venv-serve): torch +
#                    transformers[serving], a real OpenAI-compatible server on CPU for the test
#                    data_prep_regenerate_serve (~2-4 min, 5.7 GB: PyPI's torch is the CUDA build).
#                    DFLASH_PREP_SERVE=0 skips this part.
# Then: data/prep/.venv/bin/dflash-prep tokenize ...   (or data/prep/dflash-prep, the wrapper, or put
#       data/prep/.venv/bin on PATH; dflash_data import-prompts finds it there)
set -euo pipefail
# the physical path: the environment is stamped with this checkout's path, whatever symlink leads to it
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
pkg="$root/data/prep"
serve=0 report=0
for a in "$@"; do
  case "$a" in
    --serve) serve=1 ;;
    --report) report=1 ;;
    *) echo "usage: $0 [--serve] [--report]" >&2; exit 2 ;;
  esac
done

# install VENV EXTRA: makes VENV when missing, installs the package (with the extra EXTRA, e.g. "report", when
# given) unless the stamps say it is there: .requirements.sha256 for the package, .extra-EXTRA.sha256 for an extra,
# so that callers with and without an extra never undo each other's install. One installer per environment at a
# time (flock on VENV.lock): ctest may run several callers at once.
install() {
  local venv="$1" extra="$2"
  local stamp="$venv/.requirements.sha256" want
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  want="$( (cd "$pkg" && cat pyproject.toml requirements*.txt; echo "$pkg") | sha256sum | cut -d' ' -f1)"
  local extra_stamp="$venv/.extra-$extra.sha256"
  if [[ -x "$venv/bin/python" && -x "$venv/bin/dflash-prep" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] &&
     [[ -z "$extra" || ( -f "$extra_stamp" && "$(cat "$extra_stamp")" == "$want" ) ]]; then
    echo "install_prep: $venv is up to date${extra:+ (with [$extra])}"
    return
  fi
  local start=$SECONDS
  if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv" || {
      echo "install_prep: 'python3 -m venv $venv' failed; on Debian/Ubuntu install python3-venv" >&2
      exit 1
    }
  fi
  # pip >= 21.3 installs a pyproject.toml package editable (PEP 660); Debian's python3 venv may bring an older one
  "$venv/bin/python" -m pip install --disable-pip-version-check -q "pip>=23" >/dev/null
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -e "$pkg${extra:+[$extra]}"
  "$venv/bin/dflash-prep" --help >/dev/null   # the console script runs: the install is usable
  echo "$want" >"$stamp"
  [[ -z "$extra" ]] || echo "$want" >"$extra_stamp"
  echo "install_prep: installed $pkg${extra:+[$extra]} into $venv in $((SECONDS - start)) s"
}

install "${DFLASH_PREP_VENV:-$pkg/.venv}" "$([[ $report == 1 ]] && echo report || true)"
if [[ $serve == 1 ]]; then
  if [[ "${DFLASH_PREP_SERVE:-1}" == 0 ]]; then
    echo "install_prep: DFLASH_PREP_SERVE=0: no serving environment (data_prep_regenerate_serve will be skipped)"
  else
    install "${DFLASH_PREP_SERVE_VENV:-$pkg/.venv-serve}" serve
  fi
fi
