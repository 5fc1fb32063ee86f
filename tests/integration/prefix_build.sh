#!/usr/bin/env bash
# A build from a prefix, as users without root get their libraries from modules, spack or conda: yaml-cpp, fmt,
# CLI11 and nlohmann_json are copied into a private prefix (headers, libraries and CMake package files, as such an
# install lays them out), the trainer is configured with -DCMAKE_PREFIX_PATH=PREFIX -DDFLASH_BUILD_TESTS=OFF (no
# test framework), and the test checks that CMake took every one of them from the prefix, that dflash_mpi builds
# and links against the prefix's libraries, and that it runs.
#   prefix_build.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src="$1" work="$2"
fail() { echo "FAIL (prefix_build): $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
prefix="$work/prefix"
arch_lib="lib/$(gcc -print-multiarch)"
mkdir -p "$prefix/include" "$prefix/$arch_lib/cmake" "$prefix/share/cmake"
# compiled libraries: headers, the shared objects (copied, not linked: a real prefix holds its own files), packages
for pkg in yaml-cpp fmt; do
  cp -r "/usr/include/$pkg" "$prefix/include/"
  cp -r "/usr/$arch_lib/cmake/$pkg" "$prefix/$arch_lib/cmake/"
  cp -P /usr/$arch_lib/lib$pkg.so /usr/$arch_lib/lib$pkg.so.* "$prefix/$arch_lib/"
done
# header-only libraries
cp -r /usr/include/CLI /usr/include/nlohmann "$prefix/include/"
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$prefix/share/cmake/"

build="$work/build"
# Debug with -O0 and no debug info, in unity batches of 16 sources: this checks where the libraries come from, that
# it builds, links and runs; optimising, debug info or parsing the same headers once per source costs the test suite
# time for nothing it checks (measured on 2 cores: ~34 s in batches, several minutes one source at a time; ccache
# cannot help here, the prefix's header paths differ from the main build's). A batch is one translation unit: two of
# its sources that define the same name at file scope (anonymous namespaces included) fail to compile here; rename
# one, or give that file the SKIP_UNITY_BUILD_INCLUSION property.
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DCMAKE_C_FLAGS_DEBUG=-O0 \
  -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 \
  -DCMAKE_PREFIX_PATH="$prefix" -DDFLASH_BUILD_TESTS=OFF -DDFLASH_CUDA=OFF >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure failed"; }
for pkg in yaml-cpp fmt CLI11 nlohmann_json; do
  dir="$(grep "^${pkg}_DIR:" "$build/CMakeCache.txt" | cut -d= -f2)"
  [[ "$dir" == "$prefix"/* ]] || fail "$pkg was found in '$dir', not in the prefix $prefix"
  echo "$pkg from $dir"
done
[[ ! -d "$build/tests" ]] || fail "DFLASH_BUILD_TESTS=OFF still configured tests/"
cmake --build "$build" -j"$(nproc)" --target dflash_mpi >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; fail "build failed"; }
ldd "$build/apps/dflash_mpi" | tee "$work/ldd.log" | grep -E "yaml-cpp|fmt"
grep -q "$prefix/$arch_lib/libyaml-cpp" "$work/ldd.log" || fail "dflash_mpi does not load yaml-cpp from the prefix"
"$build/apps/dflash_mpi" --help >"$work/help.log" 2>&1 || { cat "$work/help.log"; fail "dflash_mpi --help failed"; }
grep -q "dflash_mpi" "$work/help.log" || fail "no usage text"
echo "PASS (prefix_build): configured from $prefix without the test framework; dflash_mpi builds, links and runs"
