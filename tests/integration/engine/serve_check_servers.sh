#!/usr/bin/env bash
# dflash-prep serve-check against stand-in vLLM and SGLang servers (test_serve_check_servers.py says what it
# asserts), in dflash-prep's environment; a few seconds. Skipped (77) only without that environment.
#   serve_check_servers.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src="$1" work="$2"
py="${DFLASH_PREP_VENV:-$src/data/prep/.venv}/bin/python"
if [[ ! -x "$py" ]]; then
  echo "skipped: $py is missing: make it with 'bash mpi_launch/install_prep.sh'"
  exit 77
fi
rm -rf "$work"
exec "$py" "$src/tests/integration/engine/test_serve_check_servers.py" --src "$src" --work "$work"
