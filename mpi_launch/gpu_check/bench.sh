#!/usr/bin/env bash
# gpu_check phase `bench` (GPU): dflash_bench cuda (DFlash attention at the seed's shapes, tensor cores and CUDA
# cores, against a cuBLASLt GEMM rate; the target's decode attention at the 27B's shape, unsplit against split-K;
# vocab loss at the seed's shapes; a small fp32 loss; a small drafter), the bf16 target forward of one TP-5 shard
# of a 27B-sized hybrid, and the tiny bf16 job on the GPU (it learns; tests/integration/cuda_job.sh bf16). Each time
# is printed against the same run's GEMMs alone. README.md beside this file.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gc_begin bench
gc_extra() {
  echo "  benchmark lines (ratio = bound / time; 1.0 = as fast as the GEMMs alone):"
  grep -hE "^cuda |ratio|TFLOP/s|attention fwd|scratch|^\| 1 \||^  n=[0-9]+ " "$gc_logs"/bench_*.log 2>/dev/null | sed 's/^/    /'
  grep -h "^bf16: mean loss" "$gc_logs"/cuda_job_bf16.log 2>/dev/null | sed 's/^/  tiny job: /'
}
# line-buffered output, so that a benchmark cut short by its timeout still leaves the lines it printed
lb=()
command -v stdbuf >/dev/null && lb=(stdbuf -oL -eL)
if gc_need_gpu && gc_setup; then
  bench="$gc_build/apps/dflash_bench"
  # the chunk-parallel gated delta rule at the seed's heaviest TP-5 shard (12 value / 4 key heads of 128, S 8192, 48
  # layers): each pass by CUDA events, against the per-token kernel; measured 26.4 ms a forward with the 4-warp state
  # pass (printed beside), docs/benchmarks.md predicts 11.9-15.2 ms with the 8-warp one
  step bench_delta 90 "${lb[@]}" "$bench" cuda delta --reps 3
  # DFlash attention, bf16, the seed's shapes: forward and backward TFLOP/s on tensor cores and on CUDA cores (the
  # CUDA-core kernels are estimated at 1.4-6 s per forward+backward here; DFLASH_BENCH_CORES=0 leaves them out)
  step bench_attention 180 "${lb[@]}" "$bench" cuda attention --seq 8192 --anchors 1024 --block 32 --heads 32 \
    --kv-heads 8 --head-dim 128 --cores "${DFLASH_BENCH_CORES:-1}"
  # the target's decode/verify attention at the 27B's shape (cache 8192, 24 / 4 heads × 256): unsplit against
  # split-K at n = 1 and 16, bf16 on tensor cores (docs/benchmarks.md's prediction: 7-15x), then fp32 on CUDA cores
  # (~6x); milliseconds of GPU work, the context's start and the caches' random fill dominate
  step bench_decode 60 "${lb[@]}" "$bench" cuda decode --seq 8192 --heads 24 --kv-heads 4 --head-dim 256 --reps 3
  # vocab loss at the seed's shapes (T 32768, H 5120, V 248320, chunk 2048)
  step bench_loss 150 "${lb[@]}" "$bench" cuda loss --precision bf16 --T 32768 --H 5120 --V 248320 --chunk 2048 --reps 1
  step bench_drafter 90 "${lb[@]}" "$bench" cuda drafter --precision bf16 --seq 4096 --anchors 128 --block 32 \
    --hidden 2048 --layers 2 --heads 16 --kv-heads 4 --head-dim 128 --intermediate 5632 --reps 2
  # the target forward in bf16: one TP-5 rank's shard of a Qwen3.6-27B-sized hybrid (5 Q / 1 KV heads of 256, 3 key
  # / 9 value DeltaNet heads of 128, intermediate 3456 of 17408, H 5120), 4 of its 64 layers (3 DeltaNet, 1 full
  # attention); tokens/s and the time of its GEMMs alone
  step bench_target 180 "${lb[@]}" bash "$gc_root/tests/integration/mpirun.sh" -np 1 "$bench" target --device cuda \
    --precision bf16 --tp 1 --seq 2048,8192 --reps 2 --arch qwen3_5 --hidden 5120 --layers 4 --heads 5 --kv-heads 1 \
    --head-dim 256 --intermediate 3456 --vocab 4096 --linear-k-heads 3 --linear-v-heads 9 --linear-k-dim 128 \
    --linear-v-dim 128 --full-attention-interval 4 --partial-rotary 0.25
  step bench_loss32 60 "${lb[@]}" "$bench" cuda loss --precision fp32 --T 4096 --H 1024 --V 32768 --chunk 1024 --reps 2
  # bf16 learns: 8 ranks on this GPU, 30 steps, drafter head_dim 64 (its attention on the tensor-core kernels)
  step cuda_job_bf16 240 bash "$gc_root/tests/integration/cuda_job.sh" "$gc_build" "$gc_root" "$gc_jobs_dir" bf16
fi
gc_end
