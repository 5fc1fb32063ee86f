#!/usr/bin/env bash
# One-GPU check of the CUDA backend, for a machine with an NVIDIA GPU (sized for one H200: under 8 minutes
# including the build). Steps, each timed and summarised at the end:
#   1. build with CUDA for one architecture (default sm_90; DFLASH_CUDA_ARCH=120 for RTX PRO 6000 Blackwell), only
#      the programs the steps below run
#   2. the `cuda` twin tests: every CUDA kernel against its CPU twin, and the whole target forward (dense + hybrid,
#      plain and cached) on CUDA against the CPU target (a skip counts as a failure here)
#   3. the host-device math tests (cuda_math: the kernels' per-row / per-tile math on the CPU)
#   4. dflash_bench cuda: vocab loss at the seed's shapes (T 32768, H 5120, V 248320, chunk 2048), a small fp32
#      loss, and a small drafter forward+backward, each against its cuBLASLt GEMMs alone; dflash_bench target: the
#      bf16 target forward of one TP-5 shard of a 27B-sized hybrid against its GEMMs alone
#   5. the tiny training job with run.device=cuda: fp32 against the same job on the CPU (50 steps' losses within
#      1e-4 relative), and bf16 learning (its loss falls); 8 ranks on one GPU, so the data plane is mpi. With
#      run.device=cuda both the drafter step and the target TP forward run on the GPU (the target in the run's
#      precision: fp32, then bf16 weights and activations), so the loss comparison covers the target's fp32 GPU
#      path and the bf16 run the bf16 target; GPU drafters take their packets staged over MPI into device memory
#   5b. dflash_eval with the target on the GPU (fp32) on the drafter that job trained: lossless, and the same tau as
#      with the target on the CPU
#   6. the NCCL data plane: bootstrap + one-rank collectives, device and host (staged) buffers (nccl_np1); the
#      packet stream to GPU drafters over MPI (stream_staged: page-locked staging, copy-stream uploads); with
#      more GPUs than one also the multi-rank NCCL checks (ring, timeout abort, the packet stream and its stop
#      protocol on nccl), each needing as many GPUs as ranks; with one GPU they are listed as SKIP (not a failure)
# A machine without the Debian packages and without a network (the device tool's): first, where apt works,
# `bash mpi_launch/device_bundle.sh fetch` (.devbundle, ~32 MB, git-ignored), then carry .devbundle along.
# Usage: bash mpi_launch/gpu_check.sh        env: DFLASH_GPU_BUILD_DIR (default ./build-gpu), DFLASH_JOBS (16),
#        DFLASH_CUDA_ARCH (90). Logs: $build/gpu_check/*.log. Exit status 0 only when no step failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DFLASH_GPU_BUILD_DIR:-$root/build-gpu}"
jobs="${DFLASH_JOBS:-16}"
arch="${DFLASH_CUDA_ARCH:-90}"
logs="$build/gpu_check"
mkdir -p "$logs"
# the device tool brings back what a command leaves under $OUT: each step's log is copied there as it ends, so a
# run cut short by the tool's time limit still returns the finished steps' logs
keep_log() { [[ -z "${OUT:-}" ]] || { mkdir -p "$OUT/gpu_check" && cp "$logs/$1.log" "$OUT/gpu_check/" 2>/dev/null; }; }
summary=()
failed=0
t_all=$(date +%s)

# step NAME TIMEOUT_S CMD...: runs CMD with its output in $logs/NAME.log; records PASS/FAIL and seconds.
step() {
  local name="$1" limit="$2"
  shift 2
  local t0 rc
  t0=$(date +%s)
  echo "== $name"
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  echo "   rc $rc, ${dt}s"
  keep_log "$name"
  if [[ $rc -eq 0 ]] && grep -q "^skipped:" "$logs/$name.log"; then
    summary+=("$(printf '%-14s SKIP  %4ds  (%s) = a failure of this GPU check' "$name" "$dt" "$(grep -m1 '^skipped:' "$logs/$name.log")")")
    failed=1
  elif [[ $rc -eq 0 ]]; then
    summary+=("$(printf '%-14s PASS  %4ds' "$name" "$dt")")
  else
    [[ $rc -eq 124 ]] && echo "   (timed out after ${limit}s)" >>"$logs/$name.log"
    summary+=("$(printf '%-14s FAIL  %4ds  (rc %d; log %s)' "$name" "$dt" "$rc" "$logs/$name.log")")
    failed=1
    tail -n 30 "$logs/$name.log"
  fi
  return $rc
}

nvidia-smi -L 2>/dev/null || echo "gpu_check: nvidia-smi not found; continuing (the tests ask CUDA directly)"

# 1. build. Dependencies: a carried .devbundle (mpi_launch/device_bundle.sh: a machine without the packages and
#    without a network) is unpacked and used; else install_deps.sh (a machine without network keeps what it has).
#    NCCL: the toolkit's, else the nvidia-nccl wheel of the machine's python3.
deps_args=""
if compgen -G "$root/.devbundle/*.deb" >/dev/null; then
  # shellcheck source=device_bundle.sh
  source "$root/mpi_launch/device_bundle.sh" env "$root/.devbundle" /tmp/dflash-deps >"$logs/deps.log" 2>&1 ||
    { echo "gpu_check: unpacking .devbundle failed:"; cat "$logs/deps.log"; exit 1; }
  deps_args="$DFLASH_CMAKE_DEPS_ARGS"
else
  bash "$root/mpi_launch/install_deps.sh" >"$logs/deps.log" 2>&1 || echo "gpu_check: install_deps.sh failed (see $logs/deps.log); trying the build anyway"
fi
if ! compgen -G "/usr/local/cuda/lib*/libnccl.so*" >/dev/null && [[ -z "${DFLASH_NCCL_ROOT:-}" ]]; then
  nccl_root="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)"
  if [[ -n "$nccl_root" ]]; then
    export DFLASH_NCCL_ROOT="$nccl_root" LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "gpu_check: NCCL from $nccl_root"
  fi
fi
if ! step build 420 bash -c "cmake -S '$root' -B '$build' -DCMAKE_BUILD_TYPE=Release -DDFLASH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES='$arch' $deps_args && cmake --build '$build' -j'$jobs' --target dflash_tests \
      dflash_cuda_tests dflash_mpi dflash_bench dflash_data dflash_eval nccl_check stream_check"; then
  printf '%s\n' "gpu_check summary (build failed: nothing else ran)" "${summary[@]}"
  exit 1
fi

# 2. twin tests: on a GPU machine a skipped test is a failure (it means no device was visible)
step cuda_twins 240 bash -c "'$build/tests/cuda/dflash_cuda_tests'; rc=\$?; if [[ \$rc -eq 77 ]]; then \
      echo 'the twin tests skipped: no CUDA device visible (a failure on a GPU machine)'; exit 1; fi; exit \$rc"

# 3. host-device math on the CPU
step cuda_math 120 ctest --test-dir "$build" -R "cuda_math" --output-on-failure

# 4. benchmarks (ratios measured in this run)
bench="$build/apps/dflash_bench"
step bench_loss 150 "$bench" cuda loss --precision bf16 --T 32768 --H 5120 --V 248320 --chunk 2048 --reps 1
step bench_loss32 60 "$bench" cuda loss --precision fp32 --T 4096 --H 1024 --V 32768 --chunk 1024 --reps 2
# the target forward on the GPU in bf16: one TP-5 rank's shard of a Qwen3.6-27B-sized hybrid (5 Q / 1 KV heads of
# 256, 3 key / 9 value DeltaNet heads of 128, intermediate 3456 of 17408, H 5120), 4 of its 64 layers (3 DeltaNet,
# 1 full attention); tokens/s and the time of its GEMMs alone (bound / time)
step bench_target 180 bash "$root/tests/integration/mpirun.sh" -np 1 "$bench" target --device cuda --precision bf16 \
  --tp 1 --seq 2048,8192 --reps 2 --arch qwen3_5 --hidden 5120 --layers 4 --heads 5 --kv-heads 1 --head-dim 256 \
  --intermediate 3456 --vocab 4096 --linear-k-heads 3 --linear-v-heads 9 --linear-k-dim 128 --linear-v-dim 128 \
  --full-attention-interval 4 --partial-rotary 0.25
step bench_drafter 90 "$bench" cuda drafter --precision bf16 --seq 4096 --anchors 128 --block 32 --hidden 2048 \
  --layers 2 --heads 16 --kv-heads 4 --head-dim 128 --intermediate 5632 --reps 2

# 5. the tiny job on the GPU (all 8 ranks on this one GPU; the drafter step and the target forward on the CUDA
#    backend): fp32 against the same job on the CPU (the per-step losses of 50 steps agree to 1e-4 relative); bf16
#    learns
t0=$(date +%s)
echo "== tiny_job"
(
  cd "$root"
  set -e
  [[ -f runs/tiny_data/train.h5 ]] || bash data/make_tiny.sh "$build" runs/tiny_data
  rm -rf runs/tiny_gpu_check_*
  for run in cpu:fp32 cuda:fp32 cuda:bf16; do
    DFLASH_BIN="$build/apps/dflash_mpi" timeout 120 bash mpi_launch/run_local.sh -np 8 mpi_launch/configs/tiny.yaml \
      --set run.device=${run%:*} --set run.precision=${run#*:} --set run.steps=50 --set log.every=1 \
      --set ckpt.every=50 --set run.out_dir=runs/tiny_gpu_check_${run%:*}_${run#*:}
  done
  # bf16 learns: the mean loss of steps 41-50 is below that of steps 1-10
  grep -o '"loss":[^,]*' runs/tiny_gpu_check_cuda_bf16/metrics.jsonl | cut -d: -f2 |
    awk '{ if (NR <= 10) a += $1; if (NR > 40) b += $1; n++ }
         END { printf "tiny_job: bf16 mean loss steps 1-10 %.4f, 41-50 %.4f\n", a / 10, b / 10; exit !(n == 50 && b < a) }'
  mv runs/tiny_gpu_check_cpu_fp32 runs/tiny_gpu_check_cpu
  mv runs/tiny_gpu_check_cuda_fp32 runs/tiny_gpu_check_cuda
  # per-step losses side by side; the largest relative difference
  paste <(grep -o '"loss":[^,]*' runs/tiny_gpu_check_cpu/metrics.jsonl | cut -d: -f2) \
        <(grep -o '"loss":[^,]*' runs/tiny_gpu_check_cuda/metrics.jsonl | cut -d: -f2) |
    awk '{ d = ($1 - $2) / ($1 == 0 ? 1 : $1); if (d < 0) d = -d; if (d > m) m = d; n++ }
         END { printf "tiny_job: %d steps, max relative loss difference cuda vs cpu %.3g (target forward + drafter step on cuda; last cpu loss %s)\n", n, m, $1;
               exit !(n == 50 && m <= 1e-4) }'
) >"$logs/tiny_job.log" 2>&1
rc=$?
dt=$(( $(date +%s) - t0 ))
echo "   rc $rc, ${dt}s"
keep_log tiny_job
if [[ $rc -eq 0 ]]; then
  summary+=("$(printf '%-14s PASS  %4ds  (%s; %s)' tiny_job "$dt" "$(grep -o 'max relative loss difference.*' "$logs/tiny_job.log")" "$(grep -o 'bf16 mean loss.*' "$logs/tiny_job.log")")")
else
  summary+=("$(printf '%-14s FAIL  %4ds  (rc %d; log %s)' tiny_job "$dt" "$rc" "$logs/tiny_job.log")")
  failed=1
  tail -n 30 "$logs/tiny_job.log"
fi

# 5b. dflash_eval with the target on the GPU (fp32): the drafter the GPU job trained, chain decoding lossless
#     (--check-greedy) and the same tau as with the target on the CPU
step eval_cuda 120 bash -c "cd '$root' && for d in cpu cuda; do '$build/apps/dflash_eval' --target runs/tiny_data/target \
    --drafter runs/tiny_gpu_check_cuda --prompts runs/tiny_data/prompts.h5 --limit 8 --max-new-tokens 32 \
    --check-greedy --device \$d --precision fp32 --out runs/tiny_gpu_check_eval_\$d.json || exit 1; done && \
  python3 -c 'import json; a, b = (json.load(open(f\"runs/tiny_gpu_check_eval_{d}.json\")) for d in (\"cpu\", \"cuda\")); \
print(\"eval_cuda: tau cpu\", a[\"tau\"], \"cuda\", b[\"tau\"]); assert abs(a[\"tau\"] - b[\"tau\"]) < 1e-9'"

# 6. NCCL: one rank always (a skip is a failure: it means NCCL or the GPU is missing); multi-rank ones need GPUs
mpirun_sh="$root/tests/integration/mpirun.sh"
step nccl_np1 120 bash "$mpirun_sh" -np 1 "$build/tests/integration/nccl_check"
# a GPU drafter fed over MPI (the tiny job's path): page-locked staging, uploads on the receiver's copy stream, the
# stop protocol with staged packets in flight; 4 ranks on this GPU
step stream_staged 120 bash "$mpirun_sh" -np 4 "$build/tests/integration/stream_check" --dir "$logs/stream_staged" \
  --tp 2 --dp 2 --packets 8 --stop-after 3 --plane mpi --drafter-memory device
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [[ "${gpus:-0}" -ge 4 ]]; then
  step nccl_np2 120 bash "$mpirun_sh" -np 2 "$build/tests/integration/nccl_check"
  step nccl_timeout 120 bash "$mpirun_sh" -np 2 "$build/tests/integration/nccl_check" --timeout-check
  step stream_nccl 120 bash "$mpirun_sh" -np 4 "$build/tests/integration/stream_check" --dir "$logs/stream_nccl" \
    --tp 2 --dp 2 --packets 8 --stop-after 3 --plane nccl
elif [[ "${gpus:-0}" -ge 2 ]]; then
  step nccl_np2 120 bash "$mpirun_sh" -np 2 "$build/tests/integration/nccl_check"
  step nccl_timeout 120 bash "$mpirun_sh" -np 2 "$build/tests/integration/nccl_check" --timeout-check
  step stream_nccl 120 bash "$mpirun_sh" -np 2 "$build/tests/integration/stream_check" --dir "$logs/stream_nccl" \
    --tp 1 --dp 1 --packets 5 --plane nccl
  summary+=("$(printf '%-14s SKIP  (stream_tp2_dp2_stop_nccl needs 4 GPUs, %s visible)' nccl_4gpu "$gpus")")
else
  summary+=("$(printf '%-14s SKIP  (nccl_np2, nccl_timeout, stream_*_nccl need one GPU per rank: %s visible)' \
    nccl_multi "${gpus:-0}")")
fi
# the packet stream over NCCL on one GPU cannot run (two ranks); its throughput on this GPU: dflash_bench stream
step bench_stream 120 bash "$mpirun_sh" -np 2 "$build/apps/dflash_bench" stream --plane mpi --seq 8192 --packets 4

echo
echo "gpu_check summary ($(( $(date +%s) - t_all )) s in all; logs in $logs)"
printf '  %s\n' "${summary[@]}"
echo "  benchmark ratios (bound / time; 1.0 = as fast as the GEMMs alone):"
grep -hE "^cuda |ratio|attention fwd|scratch|^\| 1 \|" "$logs"/bench_*.log 2>/dev/null | sed 's/^/    /'
exit $failed
