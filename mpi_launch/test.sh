#!/usr/bin/env bash
# Installs dependencies (when missing), builds in Release and runs every test through ctest; then, where the CUDA
# toolkit's headers are installed, builds the CUDA code a second time for the emulated GPU (-DDFLASH_CUDA=EMULATE,
# kernels/cuda/emu: the CUDA runtime, cuBLASLt and NCCL emulated on the CPU) and runs every `cuda` test there, none
# skipped. Usage: bash mpi_launch/test.sh [ctest args...]   (build folders: $DFLASH_BUILD_DIR, default ./build, and
# $DFLASH_EMU_BUILD_DIR, default ./build-emu; DFLASH_TEST_EMULATED=0 leaves the emulated GPU out)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DFLASH_BUILD_DIR:-$root/build}"
# how long each phase took, on stdout (CI's time budget is spent here)
phase_start=$SECONDS
phase() { echo "test.sh: $1 took $((SECONDS - phase_start)) s"; phase_start=$SECONDS; }
bash "$root/mpi_launch/install_deps.sh" --test   # --test: slurm-wlm and munge for tests/integration/slurm/
phase "install_deps"
# Python environments of data/prep (with the [report] extra: tensorboard, wandb, for the report tests); the serving one (torch, ~4.6 GB; DFLASH_PREP_SERVE=0 leaves it out) only feeds
# the real-server test, which reports itself skipped, with the reason, when it could not be made; the vLLM one (its
# CPU build, sharing that torch; DFLASH_PREP_VLLM=0 leaves it out) feeds engine_vllm, skipped the same way
bash "$root/mpi_launch/install_prep.sh" --serve --report --vllm ||
  echo "test.sh: warning: install_prep.sh --serve --report --vllm failed (see above); data_prep, report and engine" \
       "tests that need it will be skipped"
phase "install_prep"
# Both builds compile the same C++ sources with different -D/-I (the CUDA backend real or emulated): ccache, in its
# preprocessor mode, matches every file whose preprocessed text is the same, so the second build mostly hits the
# first's cache (the environment variables set the launcher of every configure here, the tests' own included).
if command -v ccache >/dev/null; then export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache; fi
# DFLASH_CUDA always given (default AUTO: the CUDA backend wherever the toolkit is): quickstart.sh may have configured
# ./build without it (no GPU), and the tests expect this build. Device code for sm_90 only (CUDAARCHS overrides): the
# emulated-GPU build below compiles every .cu for sm_90, sm_100 and sm_120 with nvcc for its kernel records, which
# is where the other architectures' device code is compiled and checked.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDFLASH_CUDA="${DFLASH_CUDA:-AUTO}" \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDAARCHS:-90}"
cmake --build "$build" -j"$(nproc)"
phase "the build"
ctest --test-dir "$build" --output-on-failure --timeout 600 "$@"
phase "the tests"

# The CUDA code on the emulated GPU: only the programs its tests need; ctest args (a filter) apply here too.
if [[ "${DFLASH_TEST_EMULATED:-1}" != 0 ]]; then
  if [[ -f /usr/local/cuda/include/cuda_runtime.h || -n "${CUDA_HOME:-}" ]]; then
    emu="${DFLASH_EMU_BUILD_DIR:-$root/build-emu}"
    cmake -S "$root" -B "$emu" -DCMAKE_BUILD_TYPE=Release -DDFLASH_CUDA=EMULATE
    cmake --build "$emu" -j"$(nproc)" --target dflash_cuda_tests emu_runtime_tests emu_cublaslt_tests emu_mma_tests \
      emu_limits_tests nccl_emu_check nccl_check stream_check dflash_mpi dflash_eval dflash_data dflash_bench
    phase "the emulated-GPU build"
    ctest --test-dir "$emu" -L cuda --output-on-failure --timeout 1500 "$@"
    phase "the emulated-GPU tests"
  else
    echo "test.sh: no CUDA toolkit headers (/usr/local/cuda/include): the emulated GPU's tests are not built"
  fi
fi
