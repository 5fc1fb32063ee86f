#!/usr/bin/env bash
# gpu_check phase `correctness` (GPU): the CUDA twin tests (a skip is a failure here), the host-device math tests
# (cuda_math, on the CPU: seconds), and the tiny fp32 training job on the GPU against the same job on the CPU (the
# 50 steps' losses within 1e-4 relative; tests/integration/cuda_job.sh fp32). README.md beside this file.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gc_begin correctness
gc_extra() {
  grep -h "max relative loss difference" "$gc_logs"/cuda_job_fp32.log 2>/dev/null | sed 's/^/  tiny job: /'
  grep -hE "^\[doctest\] (test cases|assertions)" "$gc_logs"/cuda_twins.log 2>/dev/null | sed 's/^/  twins: /'
}
if gc_need_gpu && gc_setup; then
  # every CUDA kernel against its CPU twin, and the whole target forward (dense + hybrid, plain and cached) on
  # CUDA against the CPU target; exit 77 (no device) is a failure on a GPU machine
  step cuda_twins 240 "$gc_build/tests/cuda/dflash_cuda_tests"
  # the kernels' per-row / per-tile math on the CPU
  step cuda_math 60 env OMP_NUM_THREADS=2 "$gc_build/tests/dflash_tests" "--test-case=cuda_math*"
  # all 8 ranks on this one GPU (the data plane is mpi): the target TP forward and the drafter step on the GPU in
  # fp32 against the CPU run; the cuda run's drafter is kept for the nccl phase's eval
  step cuda_job_fp32 300 bash "$gc_root/tests/integration/cuda_job.sh" "$gc_build" "$gc_root" "$gc_jobs_dir" fp32
  # compute-sanitizer on the tensor-core attention at the published drafters' shapes (G 4 and 8, head_dim 128 and
  # 256, block 16 and 32, the 2048 window, row slices): memcheck (out-of-bounds, misaligned) and racecheck (shared
  # memory hazards); where the machine's runtime has no sanitizer the step fails, naming it
  if command -v compute-sanitizer >/dev/null; then
    step sanitizer_memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$gc_build/tests/cuda/dflash_cuda_tests" "--test-case=cuda twin attention_tc: the published drafters*"
    step sanitizer_racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 9 \
      "$gc_build/tests/cuda/dflash_cuda_tests" "--test-case=cuda twin attention_tc: the published drafters*"
  fi
fi
gc_end
