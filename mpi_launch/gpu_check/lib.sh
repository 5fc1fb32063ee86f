# shellcheck shell=bash
# Shared by the phases of mpi_launch/gpu_check.sh (sourced, not run): the step runner with its time budget, the
# logs kept under $OUT, the summary, and the GPU machine's setup (the dependencies, the CUDA libraries, the
# programs: the prebuilt bundle or a build). mpi_launch/gpu_check/README.md says what each phase runs and costs.
#
# Settings (environment):
#   DFLASH_GPU_PHASE_BUDGET  seconds one GPU phase may take in all, setup and any build included (default 450, so
#                            that a phase ends with its summary inside the device tool's 540 s with margin); each
#                            step's timeout is cut to what is left, and a step that no longer fits is NOT RUN
#   DFLASH_GPU_BUNDLE        use (default): the programs of a carried .gpubundle, also when these sources differ
#                            from the ones it was built from (the summary then says STALE and setup.log which
#                            files); fresh: the bundle only when it matches these sources, else a build;
#                            off: always build. No .gpubundle: a build (est. 1-2 min on the GPU machine's 16 cores)
#   DFLASH_GPU_BUILD_DIR     the fallback build (default ./build-gpu); DFLASH_JOBS (default: the cores),
#                            DFLASH_CUDA_ARCH (90)
#   DFLASH_GPU_CHECK_LOGS    where the logs go (default ./runs/gpu_check/<phase>); each finished step's log is also
#                            copied under $OUT/gpu_check/ (the device tool brings $OUT back, also after a time-out)
#   DFLASH_GPU_CHECK_FORCE=1 run the GPU steps even where no GPU is visible (to try the script; they fail)

gc_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
gc_bundle_dir="$gc_root/.gpubundle"
gc_devbundle_dir="$gc_root/.devbundle"
# the programs the GPU phases run, as paths under a build folder (the bundle keeps that layout)
gc_programs=(apps/dflash_mpi apps/dflash_eval apps/dflash_data apps/dflash_bench tests/cuda/dflash_cuda_tests
             tests/dflash_tests tests/integration/nccl_check tests/integration/stream_check)
gc_targets=(dflash_cuda_tests dflash_tests dflash_mpi dflash_eval dflash_data dflash_bench nccl_check stream_check)
# the source files a bundle is checked against (what the compilers read)
gc_source_list() {
  (cd "$gc_root" && find apps lib kernels tests cmake CMakeLists.txt -type f \( -name '*.cpp' -o -name '*.h' \
    -o -name '*.cu' -o -name '*.cuh' -o -name '*.hpp' -o -name '*.inc' -o -name 'CMakeLists.txt' -o -name '*.cmake' \) \
    2>/dev/null | LC_ALL=C sort)
}

gc_summary=()
gc_failed=0
# gc_begin PHASE: the phase's logs folder, clock and budget
gc_begin() {
  gc_phase="$1"
  gc_logs="${DFLASH_GPU_CHECK_LOGS:-$gc_root/runs/gpu_check}/$gc_phase"
  rm -rf "$gc_logs"
  mkdir -p "$gc_logs"
  gc_t0=$(date +%s)
  gc_budget="${DFLASH_GPU_PHASE_BUDGET:-450}"
  echo "gpu_check $gc_phase: budget ${gc_budget}s, logs in $gc_logs ($(date -u +%FT%TZ))"
}
gc_left() { echo $(( gc_budget - ($(date +%s) - gc_t0) )); }

# keep_log NAME: copies $gc_logs/NAME.log to $OUT/gpu_check/PHASE/NAME.log as soon as the step ends. The device
# tool brings back at most 8 files: up to 6 logs travel as files, later ones are appended to
# $OUT/gpu_check/more.log, and $OUT/gpu_check/summary.txt (every phase's summary) is the 8th.
keep_log() {
  [[ -n "${OUT:-}" && -f "$gc_logs/$1.log" ]] || return 0
  mkdir -p "$OUT/gpu_check"
  local n
  n=$(find "$OUT/gpu_check" -type f ! -name more.log ! -name summary.txt 2>/dev/null | wc -l)
  if (( n < 6 )); then
    mkdir -p "$OUT/gpu_check/$gc_phase" && cp "$gc_logs/$1.log" "$OUT/gpu_check/$gc_phase/$1.log" 2>/dev/null
  else
    { echo "===== $gc_phase/$1.log"; cat "$gc_logs/$1.log"; } >>"$OUT/gpu_check/more.log" 2>/dev/null
  fi
  return 0
}

gc_record() { gc_summary+=("$(printf '%-15s %s' "$1" "$2")"); }

# step NAME TIMEOUT_S CMD...: runs CMD with its output in $gc_logs/NAME.log under a timeout cut to the phase's
# budget; records PASS / FAIL / SKIP (a "skipped:" line or exit 77: a failure on a GPU machine) / NOT RUN.
step() {
  local name="$1" limit="$2" left
  shift 2
  left=$(( $(gc_left) - 10 ))   # 10 s kept for the summary
  if (( left < 15 )); then
    gc_record "$name" "NOT RUN  (the phase's ${gc_budget}s budget is spent)"
    gc_failed=1
    return 1
  fi
  (( limit > left )) && limit=$left
  local t0 rc dt
  t0=$(date +%s)
  echo "== $name (timeout ${limit}s)"
  # timeout signals the whole process group (mpirun and its ranks too); KILL 10 s after TERM
  timeout -k 10 "$limit" "$@" >"$gc_logs/$name.log" 2>&1 </dev/null
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  echo "   rc $rc, ${dt}s"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "(gpu_check: timed out after ${limit}s)" >>"$gc_logs/$name.log"
  fi
  keep_log "$name"
  if [[ $rc -eq 0 ]] && grep -q "^skipped:" "$gc_logs/$name.log"; then
    gc_record "$name" "$(printf 'SKIP %4ds  (%s) = a failure on a GPU machine' "$dt" "$(grep -m1 '^skipped:' "$gc_logs/$name.log")")"
    gc_failed=1
  elif [[ $rc -eq 0 ]]; then
    gc_record "$name" "$(printf 'PASS %4ds' "$dt")"
  else
    local why="rc $rc"
    [[ $rc -eq 77 ]] && why="rc 77 = $(grep -m1 -i 'skipped' "$gc_logs/$name.log" | cut -c1-100) = a failure on a GPU machine"
    [[ $rc -eq 124 || $rc -eq 137 ]] && why="timed out after ${limit}s"
    gc_record "$name" "$(printf 'FAIL %4ds  (%s; log %s)' "$dt" "$why" "$gc_logs/$name.log")"
    gc_failed=1
    tail -n 30 "$gc_logs/$name.log"
  fi
  return $rc
}

# a phase may redefine gc_extra to add lines to its summary (the measurements its logs hold)
gc_extra() { :; }
# gc_end: prints the summary (also to $OUT/gpu_check/summary.txt) and returns the phase's status
gc_end() {
  local text
  text="$(
    echo "gpu_check $gc_phase summary ($(( $(date +%s) - gc_t0 )) s of ${gc_budget}s; logs in $gc_logs)"
    printf '  %s\n' "${gc_summary[@]}"
    gc_extra   # the phase's own lines (its measurements)
    echo "  => $([[ $gc_failed -eq 0 ]] && echo "PASS" || echo "FAILED")"
  )"
  echo
  echo "$text"
  if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT/gpu_check" && echo "$text" >>"$OUT/gpu_check/summary.txt"; fi
  return $gc_failed
}

# The visible GPUs (nvidia-smi -L); none: the phase stops at once with a clear message, unless FORCE
gc_gpus=0
gc_need_gpu() {
  gc_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [[ "${gc_gpus:-0}" -ge 1 ]]; then
    nvidia-smi -L 2>/dev/null | sed 's/^/  /'
    return 0
  fi
  if [[ "${DFLASH_GPU_CHECK_FORCE:-0}" == 1 ]]; then
    echo "gpu_check $gc_phase: no GPU visible (nvidia-smi -L lists none); DFLASH_GPU_CHECK_FORCE=1: running the steps anyway"
    return 0
  fi
  gc_record "gpu" "FAIL  (no NVIDIA GPU visible: nvidia-smi -L lists none; this phase runs on a GPU machine)"
  gc_failed=1
  return 1
}

# ---- setup on the GPU machine: dependencies, CUDA libraries, programs ----

# The Debian packages: a carried .devbundle is unpacked and used; else the machine's own (install_deps.sh only
# when a build needs it)
gc_deps() {
  gc_deps_args=""
  if compgen -G "$gc_devbundle_dir/*.deb" >/dev/null; then
    # shellcheck source-path=SCRIPTDIR source=../device_bundle.sh
    source "$gc_root/mpi_launch/device_bundle.sh" env "$gc_devbundle_dir" /tmp/dflash-deps || return 1
    gc_deps_args="$DFLASH_CMAKE_DEPS_ARGS"
  else
    echo "no .devbundle: using the machine's own packages (Open MPI, HDF5, yaml-cpp, fmt, OpenBLAS)"
  fi
}

# A directory that holds the shared library $1 on this machine: ld.so's cache, the CUDA toolkit, the nvidia-*
# wheels of the machine's python3 (the GPU image holds nvidia-nccl-cu13, nvidia-cublas, nvidia-cuda-runtime)
gc_find_lib() {
  local lib="$1" d
  ldconfig -p 2>/dev/null | grep -q " $lib " && { echo system; return 0; }
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -e "$d/$lib" ]] && { echo "$d"; return 0; }
  done
  local nv=()
  readarray -t nv < <(python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
  if ((${#nv[@]})); then
    d="$(find "${nv[@]}" -maxdepth 4 -name "$lib" 2>/dev/null | head -n 1)"
    [[ -n "$d" ]] && { dirname "$d"; return 0; }
  fi
  return 1
}

# The CUDA libraries the programs need, on LD_LIBRARY_PATH wherever this machine has them
gc_cuda_libs() {
  local lib d
  for lib in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
    if d="$(gc_find_lib "$lib")"; then
      echo "$lib: $d"
      if [[ "$d" != system && ":${LD_LIBRARY_PATH:-}:" != *":$d:"* ]]; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      fi
    else
      echo "$lib: not found on this machine"
    fi
  done
  # NCCL for a build: the toolkit's, else the wheel's folder
  if ! compgen -G "/usr/local/cuda/lib*/libnccl.so*" >/dev/null && [[ -z "${DFLASH_NCCL_ROOT:-}" ]]; then
    local nccl_root
    nccl_root="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)"
    [[ -n "$nccl_root" ]] && export DFLASH_NCCL_ROOT="$nccl_root"
  fi
}

# Is the bundle built from the sources here? Prints the files that differ; returns 1 when any does
gc_bundle_fresh() {
  local sums="$gc_bundle_dir/sources.sha256" changed
  [[ -f "$sums" ]] || { echo "the bundle has no sources.sha256"; return 1; }
  # changed or missing files, then files added since
  changed="$(cd "$gc_root" && sha256sum -c --quiet "$sums" 2>/dev/null | sed 's/: .*//'
             comm -13 <(sed 's/^[0-9a-f]*  //' "$sums" | LC_ALL=C sort) <(gc_source_list))"
  gc_stale_count=$(grep -c . <<<"$changed" || true)
  if [[ -n "$changed" ]]; then
    echo "sources changed since the bundle was built ($gc_stale_count files):"
    head -n 20 <<<"$changed" | sed 's/^/  /'
    return 1
  fi
  return 0
}

# gc_programs_ready: sets gc_build to a folder that holds the programs: the unpacked bundle, or a build
gc_build=""
gc_bundle_state="none"
gc_programs_ready() {
  local mode="${DFLASH_GPU_BUNDLE:-use}" cap barch
  # the GPU's architecture (9.0 on an H100/H200) against the bundle's (sm_90): another GPU gets a build for itself
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')"
  barch="$(sed -n 's/^arch sm_\([0-9]*\),.*/\1/p' "$gc_bundle_dir/MANIFEST.txt" 2>/dev/null)"
  if [[ "$mode" != off && -f "$gc_bundle_dir/bin.tar.xz" && -n "$cap" && -n "$barch" && "$cap" != "$barch" ]]; then
    gc_bundle_state="built for sm_$barch, this GPU is sm_$cap: building for it"
    mode=off
    export DFLASH_CUDA_ARCH="${DFLASH_CUDA_ARCH:-$cap}"
  fi
  if [[ "$mode" != off && -f "$gc_bundle_dir/bin.tar.xz" ]]; then
    if gc_bundle_fresh; then
      gc_bundle_state="fresh"
    elif [[ "$mode" != fresh ]]; then
      gc_bundle_state="STALE"
    else
      gc_bundle_state="stale: building instead (DFLASH_GPU_BUNDLE=fresh)"
    fi
    if [[ "$gc_bundle_state" == fresh || "$gc_bundle_state" == STALE ]]; then
      local dest=/tmp/dflash-gpubundle stamp
      stamp="$(sha256sum "$gc_bundle_dir/bin.tar.xz" | cut -d' ' -f1)"
      if [[ "$(cat "$dest/.stamp" 2>/dev/null)" != "$stamp" ]]; then
        rm -rf "$dest" && mkdir -p "$dest" || return 1
        if command -v xz >/dev/null; then
          tar -xJf "$gc_bundle_dir/bin.tar.xz" -C "$dest" || return 1
        else  # no xz on the machine: python3's tarfile reads it
          python3 -c 'import sys, tarfile; t = tarfile.open(sys.argv[1], "r:xz")
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
t.extractall(sys.argv[2], **kw)' \
            "$gc_bundle_dir/bin.tar.xz" "$dest" || return 1
        fi
        echo "$stamp" >"$dest/.stamp"
      fi
      gc_build="$dest"
      echo "programs: the bundle ($gc_bundle_state; $(grep -m1 '^built' "$gc_bundle_dir/MANIFEST.txt" 2>/dev/null))"
      return 0
    fi
  fi
  [[ "$mode" == off && "$gc_bundle_state" == none ]] && gc_bundle_state="off"
  # the fallback: build here, only the programs the phases run
  gc_build="${DFLASH_GPU_BUILD_DIR:-$gc_root/build-gpu}"
  local jobs="${DFLASH_JOBS:-$(nproc)}" arch="${DFLASH_CUDA_ARCH:-90}"
  echo "programs: building in $gc_build (bundle: $gc_bundle_state)"
  if [[ -z "$gc_deps_args" ]] && ! compgen -G "$gc_devbundle_dir/*.deb" >/dev/null; then
    timeout 120 bash "$gc_root/mpi_launch/install_deps.sh" || echo "install_deps.sh failed; trying the build anyway"
  fi
  local gen=()
  [[ ! -f "$gc_build/CMakeCache.txt" ]] && command -v ninja >/dev/null && gen=(-G Ninja)
  # the build may take what the phase's budget leaves beyond a minute for the steps (est. 1-2 min on 16 cores)
  local limit=$(( $(gc_left) - 60 ))
  (( limit >= 30 )) || { echo "no time left in the phase's budget to build"; return 1; }
  # shellcheck disable=SC2086  # gc_deps_args is a list of -D options
  if ! timeout -k 10 "$limit" cmake -S "$gc_root" -B "$gc_build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
         -DDFLASH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" $gc_deps_args; then
    echo "cmake configure failed"
    return 1
  fi
  limit=$(( $(gc_left) - 60 ))
  if (( limit < 30 )) || ! timeout -k 10 "$limit" cmake --build "$gc_build" -j"$jobs" --target "${gc_targets[@]}"; then
    echo "the build failed or ran out of the phase's budget"
    return 1
  fi
  if [[ ! -f "$gc_build/tests/integration/tiny_data/train.h5" ]]; then
    bash "$gc_root/data/make_tiny.sh" "$gc_build" "$gc_build/tests/integration/tiny_data" || return 1
  fi
}

# Every program finds its shared libraries: else the bundle's fallback copies (libcudart, libgomp), else a failure
gc_check_libs() {
  local missing p
  missing="$(for p in "${gc_programs[@]}"; do ldd "$gc_build/$p" 2>&1 | awk '/not found/ { print $1 }'; done | sort -u)"
  if [[ -n "$missing" && -d "$gc_build/lib" ]]; then
    local fb=() m
    while read -r m; do [[ -e "$gc_build/lib/$m" ]] && fb+=("$m"); done <<<"$missing"
    if ((${#fb[@]})); then
      echo "from the bundle's lib/ (not on this machine): ${fb[*]}"
      export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$gc_build/lib"
      missing="$(for p in "${gc_programs[@]}"; do ldd "$gc_build/$p" 2>&1 | awk '/not found/ { print $1 }'; done | sort -u)"
    fi
  fi
  if [[ -n "$missing" ]]; then
    echo "shared libraries not found: $(tr '\n' ' ' <<<"$missing")"
    echo "(the CUDA runtime, cuBLASLt and NCCL come from this machine: /usr/local/cuda or python3's nvidia-* wheels;"
    echo " Open MPI, HDF5, yaml-cpp, fmt, OpenBLAS from a carried .devbundle)"
    return 1
  fi
  echo "every program finds its shared libraries"
}

# gc_setup: the setup step of a GPU phase (its log is setup.log); on failure the phase ends with its summary
gc_setup() {
  local t0 rc
  t0=$(date +%s)
  echo "== setup"
  # lazy module loading can serialise the device while an NCCL kernel waits for its peer (issue 24): load eagerly
  export CUDA_MODULE_LOADING=EAGER
  {
    echo "CUDA_MODULE_LOADING=$CUDA_MODULE_LOADING"
    if command -v nvidia-smi >/dev/null; then nvidia-smi 2>&1 | head -n 15; else echo "nvidia-smi: not on PATH"; fi
    gc_deps && gc_cuda_libs && gc_programs_ready && gc_check_libs
  } >"$gc_logs/setup.log" 2>&1
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  echo "   rc $rc, ${dt}s"
  if [[ $rc -ne 0 ]]; then
    keep_log setup
    tail -n 30 "$gc_logs/setup.log"
    gc_record setup "$(printf 'FAIL %4ds  (log %s)' "$dt" "$gc_logs/setup.log")"
    gc_failed=1
    return 1
  fi
  gc_record setup "$(printf 'PASS %4ds  (programs: %s)' "$dt" \
    "$([[ $gc_build == /tmp/dflash-gpubundle ]] && echo "bundle, $gc_bundle_state" || echo "built in $gc_build; bundle: $gc_bundle_state")")"
  [[ "$gc_bundle_state" == STALE ]] && gc_record bundle "STALE  ($gc_stale_count source files differ from the bundle's build; setup.log lists them; a fresh one: bash mpi_launch/gpu_check.sh bundle)"
  return 0
}

# The tiny job's work folder, shared by the phases (a warm machine keeps it between calls)
# shellcheck disable=SC2034  # used by the phases
gc_jobs_dir="$gc_root/runs/gpu_check/cuda_job"
