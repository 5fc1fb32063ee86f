#!/usr/bin/env bash
# The tiny training job with run.device: cuda, on a GPU or on the emulated GPU (-DDFLASH_CUDA=EMULATE), one case
# per ctest test (label cuda). Without either it reports itself skipped (exit 77), never passed.
#   cuda_job.sh BUILD_DIR SOURCE_DIR WORK_DIR CASE
# Cases:
#   fp32   the job on the CPU and with run.device cuda, fp32: the 10 steps' losses agree to 1e-4 relative (10: an
#          emulated step takes ~8 s on 2 cores; the losses' drift, if any, shows within them). On the
#          emulator with one GPU per rank (DFLASH_EMU_DEVICES=8), so layout.transport is nccl: the packets, the
#          target TP all-reduce and the drafter gradient all-reduce over NCCL; on a real machine transport auto.
#          The cuda run keeps its checkpoint for `eval`.
#   bf16   run.precision bf16, all 8 ranks on one GPU (the data plane is MPI), 20 steps, learns: the mean loss of
#          steps 14-20 is below that of steps 1-7 (as the CPU's `learns` case). The drafter's head_dim is 64 so
#          that its attention runs on the tensor-core kernels (head_dim 64/128/256; the tiny config's 16 would take
#          the CUDA-core ones). On the emulator also: the same job over 6 steps makes as many device and
#          page-locked allocations on every rank as over 20 (none in steady state)
#   eval   dflash_eval --device cuda on the fp32 run's drafter: lossless (--check-greedy), the CPU's τ
set -euo pipefail
build="$1" src="$2" work="$3" case="$4"
bin="$build/apps/dflash_mpi"
tiny="$build/tests/integration/tiny_data"
mpirun_sh="$src/tests/integration/mpirun.sh"
out="$work/$case"
fail() { echo "FAIL (cuda_job $case): $*" >&2; exit 1; }

emulated=0
grep -q '^DFLASH_CUDA:STRING=EMULATE$' "$build/CMakeCache.txt" 2>/dev/null && emulated=1
if ((!emulated)) && ! nvidia-smi >/dev/null 2>&1; then
  echo "skipped: no CUDA device and not an emulated build (-DDFLASH_CUDA=EMULATE runs this on the CPU)"; exit 77
fi

# Per-step losses of a run (log.every 1)
losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1/metrics.jsonl"; }
# The tiny job: [STEPS=n] run NAME [--set ...]; 50 steps unless STEPS says, a checkpoint at the end
run() {
  local name="$1" steps="${STEPS:-50}"; shift
  rm -rf "$work/$name"
  timeout 900 "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" --set "target.path=$tiny/target" \
    --set "data.path=$tiny/train.h5" --set "run.out_dir=$work/$name" --set run.steps=$steps --set log.every=1 \
    --set ckpt.every=$steps "$@" >"$work/$name.log" 2>&1 || { tail -n 40 "$work/$name.log"; fail "run $name failed"; }
  [[ $(losses "$work/$name" | wc -l) -eq $steps ]] ||
    fail "run $name logged $(losses "$work/$name" | wc -l) of $steps steps"
}
# Largest relative difference between two runs' per-step losses over $4 steps; fails above $3
compare() {
  paste <(losses "$work/$1") <(losses "$work/$2") |
    awk -v lim="$3" -v steps="$4" -v what="$2 vs $1" '{ d = ($1 - $2) / ($1 == 0 ? 1 : $1); if (d < 0) d = -d; if (d > m) m = d; n++ }
      END { printf "%s: %d steps, max relative loss difference %.3g (limit %g; last losses %s %s)\n", what, n, m, lim, $1, $2;
            exit !(n == steps && m <= lim) }'
}
mkdir -p "$work"
case "$case" in
  fp32)
    STEPS=10 run cpu --set run.device=cpu
    if ((emulated)); then
      DFLASH_EMU_DEVICES=8 STEPS=10 run cuda_fp32 --set run.device=cuda --set run.precision=fp32 \
        --set layout.transport=nccl
      grep -q "data plane nccl" "$work/cuda_fp32/logs/rank_00.log" ||
        fail "rank 0's log does not say the data plane is NCCL"
    else
      STEPS=10 run cuda_fp32 --set run.device=cuda --set run.precision=fp32
    fi
    compare cpu cuda_fp32 1e-4 10 || fail "the cuda fp32 losses differ from the CPU's"
    ;;
  bf16)
    rm -f "$work/alloc_6.txt" "$work/alloc_20.txt"
    DFLASH_EMU_ALLOC_REPORT="$work/alloc_20.txt" DFLASH_EMU_DEVICES=1 STEPS=20 run cuda_bf16 --set run.device=cuda \
      --set run.precision=bf16 --set layout.transport=mpi --set drafter.head_dim=64 --set data.max_seq_len=96
    losses "$work/cuda_bf16" | awk '{ if (NR <= 7) a += $1; if (NR > 13) b += $1; n++ }
      END { printf "bf16: mean loss steps 1-7 %.4f, 14-20 %.4f\n", a / 7, b / 7; exit !(n == 20 && b < a) }' ||
      fail "the bf16 run does not learn"
    if ((emulated)); then
      # No cudaMalloc / cudaMallocHost in steady state: the same job over 6 steps makes as many allocations, on
      # every rank, as over 20 (the emulated runtime counts them: DFLASH_EMU_ALLOC_REPORT). data.max_seq_len 96 is
      # the tiny data's longest sequence: with it the trainer sizes every per-sequence array once
      DFLASH_EMU_ALLOC_REPORT="$work/alloc_6.txt" DFLASH_EMU_DEVICES=1 STEPS=6 run cuda_bf16_short \
        --set run.device=cuda --set run.precision=bf16 --set layout.transport=mpi --set drafter.head_dim=64 \
        --set data.max_seq_len=96
      counts() { sed 's/ peak_device_bytes.*//' "$1" | sort; }
      [[ $(counts "$work/alloc_20.txt" | wc -l) -eq 8 ]] || fail "expected 8 allocation reports, got: $(cat "$work/alloc_20.txt")"
      diff <(counts "$work/alloc_6.txt") <(counts "$work/alloc_20.txt") >"$work/alloc.diff" ||
        fail "allocations per step: 6 steps vs 20 steps differ (per rank: < 6 steps, > 20 steps):
$(cat "$work/alloc.diff")"
      echo "bf16: allocations the same after 6 and 20 steps on every rank: $(counts "$work/alloc_20.txt" | tr '\n' ';')"
    fi
    ;;
  eval)
    [[ -d "$work/cuda_fp32" ]] || fail "needs the fp32 case's cuda run ($work/cuda_fp32)"
    for d in cpu cuda; do
      timeout 600 "$build/apps/dflash_eval" --target "$tiny/target" --drafter "$work/cuda_fp32" \
        --prompts "$tiny/prompts.h5" --limit 8 --max-new-tokens 32 --check-greedy --device $d --precision fp32 \
        --out "$work/eval_$d.json" >"$work/eval_$d.log" 2>&1 || { tail -n 20 "$work/eval_$d.log"; fail "dflash_eval --device $d"; }
    done
    python3 -c 'import json, sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); print("eval: tau cpu", a["tau"], "cuda", b["tau"]); sys.exit(not (a["tau"] is not None and abs(a["tau"] - b["tau"]) < 1e-9))' \
      "$work/eval_cpu.json" "$work/eval_cuda.json" || fail "the cuda target's tau differs from the CPU's"
    ;;
  *) fail "unknown case" ;;
esac
where=""
((emulated)) && where=" on the emulated GPU"
echo "PASS (cuda_job $case)$where"
