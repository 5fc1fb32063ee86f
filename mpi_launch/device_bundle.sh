#!/usr/bin/env bash
# The build dependencies of dflash_mpi for a GPU machine that has the CUDA toolkit and a C++ compiler but neither
# the Debian packages the project builds against (Open MPI, HDF5, yaml-cpp, fmt, doctest, OpenBLAS, nlohmann-json,
# CLI11) nor a network to fetch them: a borrowed machine, a locked-down node. Fetch them where apt works, carry the
# folder there, unpack it there without installing anything.
#
#   bash mpi_launch/device_bundle.sh fetch [DIR]
#       On Debian 12 (bookworm) with apt: downloads into DIR (default .devbundle) the .debs of the build
#       dependencies and of every shared library they need, except the C/C++ runtime, the toolchain and the -dev
#       packages of things we do not compile against (about 35 MB). DIR is git-ignored here (.git/info/exclude).
#   source mpi_launch/device_bundle.sh env [DIR] [PREFIX]
#       On the GPU machine: unpacks every .deb of DIR into PREFIX (default /tmp/dflash-deps) with dpkg -x, or python3
#       where there is no dpkg (nothing outside PREFIX is touched, no maintainer script runs), adds the links Debian's alternatives would have made
#       (mpicc, mpirun, ...), and exports what CMake, the compilers, the programs and mpirun need to use PREFIX:
#       PATH, LD_LIBRARY_PATH, CMAKE_PREFIX_PATH, OPAL_PREFIX (Open MPI relocated), PMIx's plugin path, and
#       DFLASH_CMAKE_DEPS_ARGS (the -D options that point FindMPI / FindHDF5 / the BLAS lookup into PREFIX).
#       mpi_launch/gpu_check.sh does this by itself when the repository holds .devbundle. A second call with the
#       same .debs and PREFIX (the next gpu_check phase on a warm machine) skips the unpacking (a stamp in PREFIX).
# The libraries are Debian 12's (glibc 2.36): they run on any x86-64 Linux with glibc ≥ 2.36. Sourcing changes no
# shell option of the caller.

# What we compile against; their shared libraries follow from their dependencies.
bundle_roots=(openmpi-bin openmpi-common libopenmpi-dev libopenmpi3 libhdf5-dev libhdf5-103-1 libyaml-cpp-dev
              libfmt-dev doctest-dev libopenblas-openmp-dev libopenblas0-openmp nlohmann-json3-dev libcli11-dev)
# Present on any machine that can build C++ (runtime, toolchain) or never needed to build and run the tests here:
# -dev packages beyond the roots, Fortran, documentation and desktop pieces (hwloc's optional plugins pull X11).
bundle_skip='^(libc6|libgcc-s1|libstdc\+\+6|zlib1g|gcc.*|g\+\+.*|cpp.*|binutils.*|perl.*|debconf.*|dpkg|adduser|'\
'lsb-base|debianutils|gfortran.*|libgfortran.*|flang.*|libflang.*|libjs-.*|libjpeg.*|libclang.*|llvm.*|libllvm.*|'\
'autoconf|automake|autotools-dev|m4|libtool|install-info|tar|coreutils|passwd|init-system-helpers|'\
'sensible-utils|cdebconf|libdebian-installer4|.*-dev|hdf5-helpers|libhdf5-fortran-.*|libhdf5-hl-fortran-.*|ucf|'\
'procps|lsb-release|mount|util-linux.*|python3.*|libpython3.*|openssh-client|tzdata|readline-common|netbase|'\
'media-types|mime-support|x11-common|fonts-.*|fontconfig.*|libgomp1|libasan.*|libubsan.*|libtsan.*|liblsan.*|'\
'libitm1|libcc1-0|libisl23|libmpc3|libmpfr6|libctf.*|libgprofng0|libsframe1|libbinutils|libquadmath0|libatomic1|'\
'publicsuffix|libhwloc-plugins)$'

bundle_fetch() {
  local dir="${1:-.devbundle}"
  command -v apt-get >/dev/null && command -v apt-cache >/dev/null ||
    { echo "device_bundle fetch: needs apt-get (Debian 12)" >&2; return 1; }
  mkdir -p "$dir" || return 1
  # the dependency closure of the roots, first alternative of each "a | b", skipping the base set
  local -A seen=()
  local stack=("${bundle_roots[@]}") list=() p d
  while ((${#stack[@]})); do
    p="${stack[-1]}"
    unset 'stack[-1]'
    [[ -n "${seen[$p]:-}" ]] && continue
    local is_root=0 r
    for r in "${bundle_roots[@]}"; do [[ $r == "$p" ]] && is_root=1; done
    [[ $is_root -eq 0 && "$p" =~ $bundle_skip ]] && continue
    seen[$p]=1
    list+=("$p")
    # "|Depends: a" then "Depends: b" is "a | b": keep a; skip virtual packages (<name>)
    while read -r d; do stack+=("$d"); done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances "$p" 2>/dev/null |
      awk '/^ *\|?(Pre)?Depends:/ { if (!alt && $NF !~ /^</) print $NF; alt = ($1 ~ /^\|/) }')
  done
  (cd "$dir" && apt-get download "${list[@]}") >/dev/null || { echo "device_bundle fetch: apt-get download failed" >&2; return 1; }
  # kept out of git: DIR relative to its repository in that repository's info/exclude (a worktree's too)
  local repo exclude
  dir="$(cd "$dir" && pwd)"
  repo="$(git -C "$dir" rev-parse --show-toplevel 2>/dev/null)"
  if [[ -n "$repo" && "$dir" == "$repo"/* ]]; then
    exclude="$(git -C "$repo" rev-parse --git-path info/exclude)"
    [[ "$exclude" == /* ]] || exclude="$repo/$exclude"
    mkdir -p "$(dirname "$exclude")"
    grep -qxF "/${dir#"$repo"/}/" "$exclude" 2>/dev/null || echo "/${dir#"$repo"/}/" >>"$exclude"
  fi
  echo "device_bundle: ${#list[@]} packages, $(du -sh "$dir" | cut -f1) in $dir"
}

bundle_env() {
  local dir="${1:-.devbundle}" prefix="${2:-/tmp/dflash-deps}"
  compgen -G "$dir/*.deb" >/dev/null || { echo "device_bundle env: no .deb in $dir (run fetch first)" >&2; return 1; }
  mkdir -p "$prefix" || return 1
  local f stamp
  # unpacked before from the same .debs (a warm machine, the next gpu_check phase): only the exports below
  stamp="$(cd "$dir" && stat -c '%n %s' -- *.deb | sha256sum | cut -d' ' -f1)"
  if [[ "$(cat "$prefix/.dflash-devbundle" 2>/dev/null)" == "$stamp" ]]; then
    :
  elif command -v dpkg-deb >/dev/null && [[ -z "${DFLASH_BUNDLE_NO_DPKG:-}" ]]; then
    for f in "$dir"/*.deb; do dpkg-deb -x "$f" "$prefix" || return 1; done
  else  # not a Debian-like machine: a .deb is an ar archive holding data.tar.*; python3's tarfile reads xz and gz
    python3 - "$prefix" "$dir"/*.deb <<'PY' || return 1
import io, sys, tarfile
prefix = sys.argv[1]
for deb in sys.argv[2:]:
    blob = open(deb, "rb").read()
    assert blob[:8] == b"!<arch>\n", f"{deb}: not an ar archive"
    at = 8
    while at < len(blob):
        name, size = blob[at:at + 16].decode().strip().rstrip("/"), int(blob[at + 48:at + 58])
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(blob[at + 60:at + 60 + size])) as t:
                # packages hold absolute symlinks (into /usr): keep them as dpkg does
                kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
                t.extractall(prefix, **kw)
        at += 60 + size + (size & 1)
PY
  fi
  echo "$stamp" >"$prefix/.dflash-devbundle"
  local usr="$prefix/usr" arch=x86_64-linux-gnu
  local lib="$usr/lib/$arch"
  # Debian's alternatives (made by maintainer scripts, which dpkg -x does not run)
  local w
  for w in mpicc mpicxx mpic++ mpiCC; do ln -sf opal_wrapper "$usr/bin/$w"; done
  for w in mpirun mpiexec; do ln -sf orterun "$usr/bin/$w"; done
  export PATH="$usr/bin:$PATH"
  export LD_LIBRARY_PATH="$lib:$lib/openblas-openmp:$lib/hdf5/serial:$lib/openmpi/lib:$lib/pmix2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CMAKE_PREFIX_PATH="$usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export OPAL_PREFIX="$usr"                                   # Open MPI finds its components and help files here
  export PMIX_MCA_mca_base_component_path="$lib/pmix2/lib/pmix"  # PMIx's plugins
  export OMPI_MCA_plm_rsh_agent=                               # no ssh client needed for a single node
  # each package's CMake config named outright: a compiler that is not Debian's does not search lib/<arch>/cmake
  export DFLASH_CMAKE_DEPS_ARGS="-DMPI_C_COMPILER=$usr/bin/mpicc -DMPI_CXX_COMPILER=$usr/bin/mpicxx \
-DHDF5_C_INCLUDE_DIR=$usr/include/hdf5/serial -DHDF5_C_LIBRARY_hdf5=$lib/hdf5/serial/libhdf5.so \
-DDFLASH_BLAS_DIR=$lib/openblas-openmp -DDFLASH_CBLAS_INCLUDE_DIR=$usr/include/$arch/openblas-openmp \
-Dfmt_DIR=$lib/cmake/fmt -Dyaml-cpp_DIR=$lib/cmake/yaml-cpp -Ddoctest_DIR=$usr/lib/cmake/doctest \
-Dnlohmann_json_DIR=$usr/share/cmake/nlohmann_json -DCLI11_DIR=$usr/share/cmake/CLI11"
  echo "device_bundle: $(find "$dir" -maxdepth 1 -name '*.deb' | wc -l) packages unpacked in $prefix"
}

case "${1:-}" in
  fetch) shift; set -uo pipefail; bundle_fetch "$@" ;;
  env) shift; bundle_env "$@" ;;
  *) echo "usage: bash $0 fetch [DIR] | source $0 env [DIR] [PREFIX]" >&2; return 2 2>/dev/null || exit 2 ;;
esac
