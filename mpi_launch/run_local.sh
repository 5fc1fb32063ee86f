#!/usr/bin/env bash
# Runs dflash_mpi on this machine: mpirun with the flags one machine needs and BLAS/OpenMP threads set so that
# ranks × threads does not exceed the cores.
#   usage: mpi_launch/run_local.sh [-np N] CONFIG.yaml [--set key=value ...]
#   env:   DFLASH_BIN (default: build/apps/dflash_mpi next to this script's repo), DFLASH_THREADS (per rank),
#          DFLASH_REPORT_PYTHON (the Python of the metrics follower), DFLASH_REPORT=0 (no follower)
# With report.tensorboard or report.wandb set in the config, the metrics follower (dflash-prep report --follow,
# docs/reporting.md) runs in the background, logging to <run.out_dir>/logs/report.log. It watches this script's
# pid, which mpirun keeps (exec), so it ends by itself shortly after mpirun; a missing Python environment is a
# warning, never a failed job.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DFLASH_BIN:-$root/build/apps/dflash_mpi}"
np=8
if [[ "${1:-}" == "-np" ]]; then np="$2"; shift 2; fi
if [[ $# -lt 1 ]]; then
  echo "usage: $0 [-np N] CONFIG.yaml [--set key=value ...]" >&2
  exit 2
fi
if [[ ! -x "$bin" ]]; then
  echo "run_local.sh: $bin not found; build first (bash mpi_launch/test.sh, or cmake --build build)" >&2
  exit 2
fi
cores="$(nproc)"
threads="${DFLASH_THREADS:-$(( cores / np > 0 ? cores / np : 1 ))}"
flags=(--bind-to none)
(( np > cores )) && flags+=(--oversubscribe)   # more ranks than cores: let them share
[[ $(id -u) -eq 0 ]] && flags+=(--allow-run-as-root)
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"
# CUDA loads every kernel at start (lazy loading would load one while an NCCL kernel spins for its peer, and
# serialise the device behind it: docs/cuda.md, "Two NCCL communicators per rank"); the user's value wins
export CUDA_MODULE_LOADING="${CUDA_MODULE_LOADING:-EAGER}"

# ---- metrics follower (docs/reporting.md); the same block is in mpi_launch/slurm/*.sbatch ----
# print_key KEY ARGS...: one resolved config value; '' when unset, not known, or not one line (--help among ARGS);
# a config error is mpirun's to report
print_key() {
  local k="$1" v; shift
  v=$("$bin" "$@" --print-key "$k" 2>/dev/null) || v=""
  [[ "$v" == *$'\n'* ]] && v=""
  printf '%s' "$v"
}
report_pid="" report_me="run_local.sh"
# start_report_follower OUT_DIR TENSORBOARD WANDB WANDB_OFFLINE PID: `dflash-prep report --follow` in the background
# (report_pid), in the first of $DFLASH_REPORT_PYTHON, data/prep/.venv that has the packages
start_report_follower() {
  local out_dir="$1" tb="$2" wb="$3" offline="$4" pid="$5" py="" c args=() mods=()
  local has='import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in sys.argv[1:]))'
  if [[ -n "$tb" ]]; then args+=(--tensorboard "$tb"); mods+=(tensorboard); fi
  if [[ -n "$wb" ]]; then args+=(--wandb "$wb"); mods+=(wandb); fi
  if [[ -n "$wb" && "$offline" == true ]]; then args+=(--offline); fi
  for c in "${DFLASH_REPORT_PYTHON:-}" "$root/data/prep/.venv/bin/python"; do
    if [[ -n "$c" && -x "$c" ]] && "$c" -c "$has" "${mods[@]}" 2>/dev/null; then py="$c"; break; fi
    if [[ -n "${DFLASH_REPORT_PYTHON:-}" ]]; then break; fi   # the one asked for, or none
  done
  if [[ -z "$py" ]]; then
    echo "$report_me: warning: report.tensorboard / report.wandb are set but no Python environment has ${mods[*]}" \
         "(${DFLASH_REPORT_PYTHON:-data/prep/.venv}); training without the metrics" \
         "follower. Install it: bash $root/mpi_launch/install_prep.sh --report; replay the metrics later:" \
         "docs/reporting.md" >&2
    return 0
  fi
  mkdir -p "$out_dir/logs"
  PYTHONPATH="$root/data/prep${PYTHONPATH:+:$PYTHONPATH}" "$py" -m dflash_prep.report "$out_dir" "${args[@]}" \
    --follow --pid "$pid" </dev/null >>"$out_dir/logs/report.log" 2>&1 &
  report_pid=$!
  echo "$report_me: metrics follower (pid $report_pid): ${tb:+TensorBoard $tb }${wb:+W&B project $wb }(log $out_dir/logs/report.log)"
}
if [[ "${DFLASH_REPORT:-1}" != 0 ]]; then
  report_tb=$(print_key report.tensorboard "$@")
  report_wb=$(print_key report.wandb "$@")
  if [[ -n "$report_tb$report_wb" ]]; then
    report_out=$(print_key run.out_dir "$@")
    # mpirun replaces this shell below and keeps its pid: the follower ends once mpirun has exited
    if [[ -n "$report_out" ]]; then
      start_report_follower "$report_out" "$report_tb" "$report_wb" "$(print_key report.wandb_offline "$@")" $$
    fi
  fi
fi
exec mpirun "${flags[@]}" -np "$np" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x CUDA_MODULE_LOADING "$bin" "$@"
