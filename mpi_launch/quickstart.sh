#!/usr/bin/env bash
# Fresh machine to a trained tiny drafter: installs dependencies (when missing), builds in Release, makes the tiny
# random Qwen3 target and its target-regenerated data (data/make_tiny.sh), then trains with 8 MPI ranks on this
# machine (5 target TP + 3 drafter DP; mpi_launch/configs/tiny.yaml). Outputs: runs/tiny_data/, runs/tiny/
# (logs/rank_XX.log, metrics.jsonl, config.resolved.yaml, ckpt/, drafter_final.safetensors). Prints how long each
# phase took.
# The build ($DFLASH_BUILD_DIR, default ./build) holds only the programs a user runs next (dflash_mpi, dflash_data,
# dflash_eval, dflash_logs), not the tests. A build folder that is not configured yet is configured for this
# machine: no GPU (nvidia-smi lists none) -> the CUDA backend off, no device code compiled; a GPU -> the CUDA backend
# for its architecture only. DFLASH_CUDA=AUTO|ON|OFF|EMULATE (and CUDAARCHS) choose instead. A build folder that is
# configured already (by mpi_launch/test.sh, or by hand) is built as it is configured, so the two scripts share
# ./build without undoing each other's choice (test.sh configures its own: it always passes DFLASH_CUDA).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DFLASH_BUILD_DIR:-$root/build}"
# how long each phase took, on stdout
phase_start=$SECONDS
phase() { echo "quickstart: $1 took $((SECONDS - phase_start)) s"; phase_start=$SECONDS; }
bash "$root/mpi_launch/install_deps.sh"
phase "install_deps"

if command -v ccache >/dev/null; then export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache; fi
cuda=()
if [[ -n "${DFLASH_CUDA:-}" ]]; then
  cuda=(-DDFLASH_CUDA="$DFLASH_CUDA")
elif [[ ! -f "$build/CMakeCache.txt" ]]; then
  # the first GPU's compute capability, e.g. 9.0 -> 90; none without a GPU (or without nvidia-smi)
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ' || true)
  if [[ "$arch" =~ ^[0-9]+$ ]]; then
    echo "quickstart: a GPU (sm_$arch): the CUDA backend for it only (DFLASH_CUDA=OFF leaves it out)"
    cuda=(-DDFLASH_CUDA=AUTO -DCMAKE_CUDA_ARCHITECTURES="$arch")
  else
    echo "quickstart: no GPU (nvidia-smi lists none): the CUDA backend is not built (DFLASH_CUDA=AUTO builds it)"
    cuda=(-DDFLASH_CUDA=OFF)
  fi
fi
if [[ ! -f "$build/CMakeCache.txt" || ${#cuda[@]} -gt 0 ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "${cuda[@]}"
else
  echo "quickstart: $build is configured already: built as it is configured (DFLASH_CUDA=... to change it)"
fi
phase "configure"
cmake --build "$build" -j"$(nproc)" --target dflash_mpi dflash_data dflash_eval dflash_logs
phase "the build"

cd "$root"
if [[ ! -f runs/tiny_data/train.h5 ]]; then
  bash data/make_tiny.sh "$build" runs/tiny_data
fi
phase "the tiny target and data"
# a checkpoint every 200 steps (and at the end), so the result can be exported: dflash_mpi --export. Run again, it
# trains again: run.start_over moves the previous run to runs/tiny/superseded/<time>/ (nothing is deleted)
DFLASH_BIN="$build/apps/dflash_mpi" bash mpi_launch/run_local.sh -np 8 mpi_launch/configs/tiny.yaml \
  --set ckpt.every=200 --set run.start_over=true "$@"
phase "the tiny training"
