#!/usr/bin/env bash
# gpu_check phase `bundle` (HERE, on a CPU machine with the CUDA toolkit): builds for sm_90 (Release, one
# architecture) only the programs the GPU phases run, strips them and packs them, with the tiny job's data and the
# fallback copies of two small runtime libraries, into .gpubundle/ (git-ignored), so that GPU minutes are not spent
# compiling. Also fetches .devbundle (mpi_launch/device_bundle.sh: the Debian packages) when it is missing.
# Carry both to the GPU machine: run(command="bash mpi_launch/gpu_check.sh correctness",
# carry=[".gpubundle", ".devbundle"], timeout_s=540). README.md beside this file.
#   env: DFLASH_GPU_BUNDLE_BUILD_DIR (default ./build-gpu-bundle), DFLASH_JOBS (default: the cores),
#        DFLASH_CUDA_ARCH (90)
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
build="${DFLASH_GPU_BUNDLE_BUILD_DIR:-$gc_root/build-gpu-bundle}"
jobs="${DFLASH_JOBS:-$(nproc)}"
arch="${DFLASH_CUDA_ARCH:-90}"
t0=$(date +%s)
fail() { echo "gpu_check bundle: $*" >&2; exit 1; }
mkdir -p "$build" || fail "cannot make $build"
log="$build/gpu_bundle.log"
: >"$log"

# 1. the build; the sources' hashes are taken before and after it: a file changed meanwhile means one more
#    (incremental) build, so that the list describes what was compiled
hashes() { (cd "$gc_root" && gc_source_list | tr '\n' '\0' | xargs -0 sha256sum); }
gen=()
[[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null && gen=(-G Ninja)
echo "== build (sm_$arch, Release, -j$jobs) in $build; log $log"
cmake -S "$gc_root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DDFLASH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" >>"$log" 2>&1 || { tail -n 30 "$log"; fail "cmake configure failed"; }
for attempt in 1 2; do
  before="$(hashes)"
  cmake --build "$build" -j"$jobs" --target "${gc_targets[@]}" >>"$log" 2>&1 || { tail -n 40 "$log"; fail "the build failed"; }
  after="$(hashes)"
  [[ "$before" == "$after" ]] && break
  echo "   sources changed during the build (attempt $attempt)"
done
[[ "$before" == "$after" ]] || echo "gpu_check bundle: WARNING: sources keep changing; the bundle may be stale on arrival"
t_build=$(( $(date +%s) - t0 ))
echo "   built in ${t_build}s"

# 2. the staging folder: the build's layout (apps/, tests/...), stripped
stage="$build/gpubundle-stage"
rm -rf "$stage"
mkdir -p "$stage/lib" || fail "cannot make $stage"
for p in "${gc_programs[@]}"; do
  [[ -x "$build/$p" ]] || fail "$build/$p was not built"
  mkdir -p "$stage/$(dirname "$p")"
  strip -o "$stage/$p" "$build/$p" || fail "strip $p failed"
done
# fallback copies, used on the GPU machine only where it lacks them (gc_check_libs): the CUDA runtime (0.7 MB;
# cuBLASLt, 540 MB, and NCCL, 220 MB, are too large to carry: the GPU machine's) and the OpenMP runtime (the
# .devbundle leaves the toolchain's libraries out)
for lib in libcudart.so.13 libgomp.so.1; do
  src="$(ldd "$stage/apps/dflash_mpi" | awk -v l="$lib" '$1 == l { print $3 }')"
  [[ -f "$src" ]] && cp -L "$src" "$stage/lib/$lib"
done
# the tiny job's data (tests/integration/cuda_job.sh reads BUILD/tests/integration/tiny_data), made with the
# staged dflash_data (it runs on the CPU)
echo "== tiny data"
bash "$gc_root/data/make_tiny.sh" "$stage" "$stage/tests/integration/tiny_data" >>"$log" 2>&1 ||
  { tail -n 20 "$log"; fail "make_tiny.sh failed"; }

# 3. pack: one solid xz archive (the programs share most of their bytes: the library and its sm_90 code)
echo "== pack"
out="$gc_bundle_dir"
rm -rf "$out"
mkdir -p "$out" || fail "cannot make $out"
tar -C "$stage" -cf - . | xz -9 -T"$jobs" >"$out/bin.tar.xz" || fail "packing failed"
echo "$after" >"$out/sources.sha256"
{
  echo "built $(date -u +%FT%TZ) on $(hostname) in ${t_build}s; git $(git -C "$gc_root" rev-parse --short HEAD 2>/dev/null)" \
       "with $(git -C "$gc_root" status --porcelain 2>/dev/null | wc -l) paths changed or untracked"
  echo "arch sm_$arch, Release; $(nvcc --version 2>/dev/null | tail -n 1); $(c++ --version | head -n 1);" \
       "$(ldd --version | head -n 1)"
  echo "contents (stripped, unpacked size):"
  (cd "$stage" && find . -type f ! -path './tests/integration/tiny_data/*' -printf '  %s\t%p\n' | sort -k2)
  echo "  $(du -sb "$stage/tests/integration/tiny_data" | cut -f1)	./tests/integration/tiny_data/"
  echo "shared libraries the programs need (from the GPU machine, or from .devbundle, or from lib/ above):"
  readelf -d "$stage"/apps/* "$stage"/tests/cuda/* "$stage"/tests/dflash_tests "$stage"/tests/integration/*_check 2>/dev/null |
    sed -n 's/.*Shared library: \[\(.*\)\]/  \1/p' | sort -u
  echo "assumed on the GPU machine: the NVIDIA driver (libcuda.so.1, CUDA 13 capable), cuBLASLt 13"
  echo "(libcublasLt.so.13) and NCCL 2 (libnccl.so.2): in /usr/local/cuda or python3's nvidia-* wheels; glibc >= 2.36,"
  echo "libstdc++ of GCC >= 12; the rest (Open MPI, HDF5, yaml-cpp, fmt, OpenBLAS) from a carried .devbundle"
} >"$out/MANIFEST.txt"

# 4. .devbundle (the Debian packages) where it is missing
if ! compgen -G "$gc_devbundle_dir/*.deb" >/dev/null; then
  echo "== .devbundle (mpi_launch/device_bundle.sh fetch)"
  bash "$gc_root/mpi_launch/device_bundle.sh" fetch "$gc_devbundle_dir" ||
    echo "gpu_check bundle: WARNING: no .devbundle; the GPU machine must then have the packages itself"
fi

# 5. sizes: what travels to the GPU machine (the working tree + the carried folders) must stay under 64 MiB
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
b_bundle=$(du -sb "$out" | cut -f1)
b_dev=$(du -sb "$gc_devbundle_dir" 2>/dev/null | cut -f1)
b_tree=$(cd "$gc_root" && git ls-files -co --exclude-standard -z 2>/dev/null | xargs -0 stat -c %s 2>/dev/null |
  awk '{ s += $1 } END { print s + 0 }')
total=$(( b_bundle + ${b_dev:-0} + b_tree ))
echo
echo "gpu_check bundle: $out: $(mib "$b_bundle") MiB packed ($(mib "$(du -sb "$stage" | cut -f1)") MiB unpacked), $(( $(date +%s) - t0 ))s in all"
echo "  travelling with carry=[\".gpubundle\", \".devbundle\"]: working tree $(mib "$b_tree") + .gpubundle $(mib "$b_bundle")" \
     "+ .devbundle $(mib "${b_dev:-0}") = $(mib "$total") MiB of the 64 MiB limit"
(( total < 64 * 1048576 )) || fail "over the device tool's 64 MiB: carry less"
sed -n '1,2p' "$out/MANIFEST.txt" | sed 's/^/  /'
