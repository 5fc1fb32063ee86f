#!/usr/bin/env bash
# Installs dflash_prep's Python packages (pinned) into virtual environments. Idempotent: an environment that
# already holds its requirements file's packages is left alone.
# Usage: bash mpi_launch/install_prep.sh          data/prep/requirements.txt -> $DFLASH_PREP_VENV
#                                                 (default data/prep/.venv; no torch: ~45 s, 320 MB)
#        bash mpi_launch/install_prep.sh --serve  the same, and data/prep/requirements-serve.txt (torch +
#                                                 transformers[serving], a real OpenAI-compatible server on CPU for
#                                                 the test data_prep_regenerate_serve) -> $DFLASH_PREP_SERVE_VENV
#                                                 (default data/prep/.venv-serve; ~2-4 min, 5.7 GB: PyPI's torch is
#                                                 the CUDA build). DFLASH_PREP_SERVE=0 skips this part.
# Then: data/prep/dflash-prep tokenize ...        (the wrapper runs the tool in the first environment)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -gt 1 || ($# -eq 1 && "$1" != "--serve") ]]; then
  echo "usage: $0 [--serve]" >&2
  exit 2
fi

# install VENV REQUIREMENTS: makes VENV when missing, installs REQUIREMENTS unless its stamp says they are there
install() {
  local venv="$1" req="$2"
  local stamp="$venv/.requirements.sha256" want
  want="$(cat "$root/data/prep/requirements.txt" "$req" | sha256sum | cut -d' ' -f1)"
  if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "install_prep: $venv is up to date"
    return
  fi
  local start=$SECONDS
  if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv" || {
      echo "install_prep: 'python3 -m venv $venv' failed; on Debian/Ubuntu install python3-venv" >&2
      exit 1
    }
  fi
  "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req"
  echo "$want" >"$stamp"
  echo "install_prep: installed $req into $venv in $((SECONDS - start)) s"
}

install "${DFLASH_PREP_VENV:-$root/data/prep/.venv}" "$root/data/prep/requirements.txt"
if [[ "${1:-}" == "--serve" ]]; then
  if [[ "${DFLASH_PREP_SERVE:-1}" == 0 ]]; then
    echo "install_prep: DFLASH_PREP_SERVE=0: no serving environment (data_prep_regenerate_serve will be skipped)"
  else
    install "${DFLASH_PREP_SERVE_VENV:-$root/data/prep/.venv-serve}" "$root/data/prep/requirements-serve.txt"
  fi
fi
