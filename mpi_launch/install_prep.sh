#!/usr/bin/env bash
# Installs dflash_prep's Python packages (data/prep/requirements.txt, pinned) into a virtual environment.
# Idempotent: nothing is done when the environment already holds this requirements file's packages.
# Usage: bash mpi_launch/install_prep.sh          environment $DFLASH_PREP_VENV, default data/prep/.venv
#        bash mpi_launch/install_prep.sh --serve  (optional) torch + transformers[serving] for the real-server test,
#                                                 environment $DFLASH_PREP_SERVE_VENV, default data/prep/.venv-serve
# Then: data/prep/dflash-prep tokenize ...        (the wrapper runs the tool with the first environment)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${1:-}" == "--serve" ]]; then
  venv="${DFLASH_PREP_SERVE_VENV:-$root/data/prep/.venv-serve}"
  req="$root/data/prep/requirements-serve.txt"
elif [[ $# -eq 0 ]]; then
  venv="${DFLASH_PREP_VENV:-$root/data/prep/.venv}"
  req="$root/data/prep/requirements.txt"
else
  echo "usage: $0 [--serve]" >&2
  exit 2
fi
stamp="$venv/.requirements.sha256"
want="$(cat "$root/data/prep/requirements.txt" "$req" | sha256sum | cut -d' ' -f1)"

if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "install_prep: $venv is up to date"
  exit 0
fi
start=$SECONDS
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv" || {
    echo "install_prep: 'python3 -m venv $venv' failed; on Debian/Ubuntu install python3-venv" >&2
    exit 1
  }
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req"
echo "$want" >"$stamp"
echo "install_prep: installed $req into $venv in $((SECONDS - start)) s"
