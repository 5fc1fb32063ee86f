#!/usr/bin/env bash
# The one-GPU check of the CUDA backend, in phases that each fit one call of a short-lived GPU machine (about 15
# minutes of GPU time in all, at most 10 minutes a command): each GPU phase ends with its summary inside a 450 s
# budget (DFLASH_GPU_PHASE_BUDGET), each step under its own timeout, each finished step's log copied under $OUT.
#
#   bash mpi_launch/gpu_check.sh bundle       HERE (CPU machine, CUDA toolkit): build the programs for sm_90 and
#                                             pack them into .gpubundle/ (+ .devbundle/ for the Debian packages)
#   bash mpi_launch/gpu_check.sh correctness  GPU: the CUDA twin tests, the cuda_math tests, the tiny fp32 job on
#                                             the GPU against the CPU
#   bash mpi_launch/gpu_check.sh bench        GPU: dflash_bench cuda attention / decode / loss / drafter, target,
#                                             the tiny bf16 job (learns)
#   bash mpi_launch/gpu_check.sh nccl         GPU: the NCCL checks, the packet stream, dflash_eval on the GPU
#   bash mpi_launch/gpu_check.sh profile      GPU: the target's parts timed on the GPU, ncu on the delta rule
#   bash mpi_launch/gpu_check.sh all          correctness, bench, nccl in turn (no argument: the same); longer
#                                             than one device-tool call allows
#
# The GPU phases use the bundle's programs when .gpubundle/ is carried and was built from these sources, and
# build them otherwise (DFLASH_GPU_BUNDLE=auto|use|off). They set CUDA_MODULE_LOADING=EAGER. Exit status 0 only
# when nothing failed (a skipped GPU test counts as a failure; without a GPU a phase stops at once and fails).
# Phases, their costs, the exact device-tool calls: mpi_launch/gpu_check/README.md.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gpu_check"
phase="${1:-all}"
case "$phase" in
  bundle | correctness | bench | nccl | profile) exec bash "$here/$phase.sh" ;;
  all)
    rc=0
    for p in correctness bench nccl; do bash "$here/$p.sh" || rc=1; done
    echo
    echo "gpu_check all: $([[ $rc -eq 0 ]] && echo PASS || echo FAILED) (each phase's summary above)"
    exit $rc
    ;;
  -h | --help | help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: bash $0 bundle|correctness|bench|nccl|profile|all (see mpi_launch/gpu_check/README.md)" >&2; exit 2 ;;
esac
