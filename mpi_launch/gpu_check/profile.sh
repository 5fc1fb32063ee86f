#!/usr/bin/env bash
# gpu_check phase `profile` (GPU): where the measured time goes in the parts the models missed. The target forward
# of one TP-5 shard of a Qwen3.6-27B-sized hybrid (4 layers) with each part timed on the GPU (the stream
# synchronised around it: DeltaNet mixer, full attention, MLP, embedding, outputs), then Nsight Compute on the
# chunk-parallel delta rule's three passes (SOL, warp stall reasons, scheduler) where ncu can read the counters,
# and the twin families an earlier run failed. README.md beside this file.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gc_begin profile
gc_extra() {
  grep -hE "^\| 1 \||synchronised" "$gc_logs"/target_parts.log 2>/dev/null | sed 's/^/  target: /'
  grep -hE "chunked|per-token" "$gc_logs"/delta_passes.log 2>/dev/null | sed 's/^/  delta: /'
  grep -hE "^\[doctest\] test cases" "$gc_logs"/twins_again.log 2>/dev/null | sed 's/^/  twins: /'
}
lb=()
command -v stdbuf >/dev/null && lb=(stdbuf -oL -eL)
# DFLASH_GPU_PROFILE_STEPS: the steps to run (default all): target delta ncu twins
want() { [[ " ${DFLASH_GPU_PROFILE_STEPS:-target delta ncu twins} " == *" $1 "* ]]; }
if gc_need_gpu && gc_setup; then
  bench="$gc_build/apps/dflash_bench"
  want target && step target_parts 240 "${lb[@]}" bash "$gc_root/tests/integration/mpirun.sh" -np 1 "$bench" target --device cuda \
    --precision bf16 --tp 1 --seq 8192 --reps 2 --arch qwen3_5 --hidden 5120 --layers 4 --heads 5 --kv-heads 1 \
    --head-dim 256 --intermediate 3456 --vocab 4096 --linear-k-heads 3 --linear-v-heads 9 --linear-k-dim 128 \
    --linear-v-dim 128 --full-attention-interval 4 --partial-rotary 0.25
  want delta && step delta_passes 60 "${lb[@]}" "$bench" cuda delta --reps 3 --layers 1
  if want ncu && command -v ncu >/dev/null; then
    step ncu_delta 150 ncu --clock-control none --kernel-name regex:delta_chunk --launch-skip 3 --launch-count 3 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section LaunchStats --section InstructionStats "$bench" cuda delta --reps 1 --layers 1
  fi
  want twins && step twins_again 120 "$gc_build/tests/cuda/dflash_cuda_tests" \
    "--test-case=cuda twin elementwise:*,cuda twin bf16:*,cuda twin attention_tc: split-K through*"
fi
gc_end
