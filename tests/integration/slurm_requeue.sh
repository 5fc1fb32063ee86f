#!/usr/bin/env bash
# The requeue decision of the slurm scripts (mpi_launch/slurm/requeue.sh) on prepared run folders: the outcomes a
# real slurm run does not produce on purpose (no status.json, "running" left with exit 0, a kill -9's exit code, a
# SIGTERM stop). The scripts themselves run under a real slurm in tests/integration/slurm/slurm_real.sh (their
# signals, requeues, binding, two nodes); this stub-free table is what remains here.
#   slurm_requeue.sh BUILD_DIR SOURCE_DIR WORK_DIR CASE     CASE: decision
set -euo pipefail
build="$1" src="$2" work="$3" case="$4"
out="$work/$case"
rm -rf "$out" && mkdir -p "$out"
fail() { echo "FAIL ($case): $*" >&2; exit 1; }
source "$src/mpi_launch/slurm/requeue.sh"

case "$case" in
  decision)
    d="$out/d" && mkdir -p "$d"
    status() { printf '{\n  "outcome": "%s",\n  "step": 10,\n  "total_steps": 20,\n  "requeue": %s\n}\n' "$1" "$2" >"$d/status.json"; }
    [[ $(dflash_attempt_outcome "$d" 0) == unknown ]] || fail "exit 0 without status.json: expected unknown"
    status running false
    [[ $(dflash_attempt_outcome "$d" 0) == unknown ]] || fail "exit 0, status still running: expected unknown"
    [[ $(dflash_attempt_outcome "$d" 1) == failed ]] || fail "exit 1: expected failed"
    status partial false
    [[ $(dflash_attempt_outcome "$d" 0) == partial ]] || fail "partial: expected partial"
    status stopped true
    [[ $(dflash_attempt_outcome "$d" 0) == stopped ]] || fail "status stopped: expected stopped"
    status stopped false
    [[ $(dflash_attempt_outcome "$d" 0) == terminated ]] || fail "stopped by SIGTERM (requeue false): expected terminated"
    [[ $(dflash_attempt_outcome "$d" 137) == failed ]] || fail "killed: expected failed"
    status finished false
    [[ $(dflash_attempt_outcome "$d" 0) == finished ]] || fail "status finished: expected finished"
    echo "PASS (decision)"
    ;;
  *) fail "unknown case" ;;
esac
