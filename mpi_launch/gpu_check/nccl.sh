#!/usr/bin/env bash
# gpu_check phase `nccl` (GPU): the NCCL data plane (bootstrap + one-rank collectives, device and host buffers;
# with more GPUs the multi-rank checks), the packet stream to GPU drafters over MPI, dflash_bench stream, and
# dflash_eval with the target on the GPU (lossless, the CPU's tau) on the drafter the tiny fp32 GPU job trained
# (the correctness phase's on a warm machine; else this phase trains it first). README.md beside this file.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
gc_begin nccl
gc_extra() {
  grep -h "^eval: tau" "$gc_logs"/cuda_job_eval.log 2>/dev/null | sed 's/^/  /'
  grep -h "measured" "$gc_logs"/bench_stream.log 2>/dev/null | head -n 3 | sed 's/^/  stream: /'
  grep -h "^nccl_check: bf16 target" "$gc_logs"/nccl_target_bf16.log 2>/dev/null | sed 's/^/  /'
}
if gc_need_gpu && gc_setup; then
  mpirun_sh="$gc_root/tests/integration/mpirun.sh"
  # one rank always (a skip is a failure: NCCL or the GPU is missing)
  step nccl_np1 120 bash "$mpirun_sh" -np 1 "$gc_build/tests/integration/nccl_check"
  # a GPU drafter fed over MPI (the tiny job's path): page-locked staging, uploads on the receiver's copy stream,
  # the stop protocol with staged packets in flight; 4 ranks on this GPU
  step stream_staged 120 bash "$mpirun_sh" -np 4 "$gc_build/tests/integration/stream_check" \
    --dir "$gc_logs/stream_staged" --tp 2 --dp 2 --packets 8 --stop-after 3 --plane mpi --drafter-memory device
  if [[ "${gc_gpus:-0}" -ge 2 ]]; then
    step nccl_np2 120 bash "$mpirun_sh" -np 2 "$gc_build/tests/integration/nccl_check"
    step nccl_timeout 120 bash "$mpirun_sh" -np 2 "$gc_build/tests/integration/nccl_check" --timeout-check
    # the bf16 TP target over NCCL, layout.tp_allreduce fp32 and bf16 (ncclBfloat16), against the fp32 CPU target:
    # TP 5 on 5 GPUs, else TP 2
    step nccl_target_bf16 120 bash "$mpirun_sh" -np "$(( gc_gpus >= 5 ? 5 : 2 ))" \
      "$gc_build/tests/integration/nccl_check" --target "$gc_logs/nccl_target_bf16"
    if [[ "$gc_gpus" -ge 4 ]]; then
      step stream_nccl 120 bash "$mpirun_sh" -np 4 "$gc_build/tests/integration/stream_check" \
        --dir "$gc_logs/stream_nccl" --tp 2 --dp 2 --packets 8 --stop-after 3 --plane nccl
    else
      step stream_nccl 120 bash "$mpirun_sh" -np 2 "$gc_build/tests/integration/stream_check" \
        --dir "$gc_logs/stream_nccl" --tp 1 --dp 1 --packets 5 --plane nccl
      gc_record nccl_4gpu "SKIP  (stream_check --tp 2 --dp 2 --plane nccl needs 4 GPUs, $gc_gpus visible)"
    fi
  else
    gc_record nccl_multi "SKIP  (nccl_np2, nccl_timeout, nccl_target_bf16, stream_*_nccl need one GPU per rank: ${gc_gpus:-0} visible; not a failure)"
  fi
  # the packet stream over NCCL on one GPU cannot run (two ranks); its throughput on the mpi plane
  step bench_stream 120 bash "$mpirun_sh" -np 2 "$gc_build/apps/dflash_bench" stream --plane mpi --seq 8192 --packets 4
  # dflash_eval --device cuda (fp32) on the drafter the tiny fp32 GPU job trained: lossless, the CPU's tau
  if [[ ! -f "$gc_jobs_dir/cuda_fp32/metrics.jsonl" ]]; then
    step cuda_job_fp32 300 bash "$gc_root/tests/integration/cuda_job.sh" "$gc_build" "$gc_root" "$gc_jobs_dir" fp32
  fi
  step cuda_job_eval 180 bash "$gc_root/tests/integration/cuda_job.sh" "$gc_build" "$gc_root" "$gc_jobs_dir" eval
fi
gc_end
