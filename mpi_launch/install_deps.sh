#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages dflash_mpi builds against. Idempotent: packages already
# installed are skipped, and apt-get is not touched at all when nothing is missing.
#   --test  also what only the tests use: slurm-wlm and munge, for the real-slurm test (tests/integration/slurm/
#           starts its own munged, slurmctld and slurmd; the system services Debian enables for them stay unconfigured)
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  procps                          # pkill, used by the SIGTERM integration test
  openmpi-bin libopenmpi-dev      # MPI launcher + headers (Open MPI)
  libhdf5-dev                     # training datasets
  libyaml-cpp-dev                 # config files
  libfmt-dev                      # formatting, logs
  doctest-dev                     # unit tests
  libopenblas-openmp-dev          # CPU BLAS (cblas), OpenMP build: cooperates with our OpenMP loops
  nlohmann-json3-dev              # safetensors headers, config.json
  libcli11-dev                    # command-line parsing and --help of every program
  libboost-context-dev            # the emulated GPU's fibers (-DDFLASH_CUDA=EMULATE: every CUDA test on the CPU)
  ccache                          # mpi_launch/test.sh: the emulated-GPU build reuses the first build's compiles
)

if [[ "${1:-}" == --test ]]; then
  packages+=(slurm-wlm munge)
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--test]" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
