#!/usr/bin/env bash
# dflash_data writers on a full disk, simulated without root by a file-size limit: `ulimit -f 16` with SIGXFSZ
# ignored makes every write past 16 KiB fail with EFBIG ("File too large"), as ENOSPC fails it on a full disk.
# Usage: full_disk.sh DFLASH_DATA WORKDIR CASE
#   import_jsonl, make_prompts, regenerate: the command must exit non-zero (not by a signal: it used to die with
#     SIGSEGV in H5Fclose), name the file and the OS error, print no HDF5 error stack, leave no *.partial, and leave
#     a good OUT.h5 already at the target path byte for byte as it was; the same command without the limit works
#   truncated: a dataset cut to half its size is an error naming the file for inspect and as regenerate's input
set -uo pipefail
bin="$1" work="$2/$3" case="$3"
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
limit_kb=16

fail() { echo "FAIL: $*"; exit 1; }

# limited CMD...: CMD with files limited to $limit_kb KiB (SIGXFSZ ignored: the write fails with EFBIG instead)
limited() { bash -c 'trap "" XFSZ; ulimit -f "$0" || exit 99; exec "$@"' "$limit_kb" "$@"; }

# A small valid dataset at $1, different from what the commands write.
good_dataset() {
  printf '%s\n' '{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}' '{"input_ids": [5, 6]}' > small.jsonl
  "$bin" import-jsonl small.jsonl "$1" >/dev/null || fail "cannot write the small dataset $1"
}

# expect_full OUT CMD...: run CMD under the limit; OUT.h5 exists before and must come out unchanged.
expect_full() {
  local out="$1"
  shift
  local before err rc
  before="$(cksum < "$out")"
  err="$(limited "$@" 2>&1 >/dev/null)"
  rc=$?
  echo "\$ (ulimit -f $limit_kb) $*"
  echo "$err"
  echo "[exit $rc]"
  [[ $rc -ne 99 ]] || fail "ulimit -f did not work here"
  [[ $rc -ne 0 ]] || fail "the command succeeded; its output must be larger than $limit_kb KiB"
  [[ $rc -lt 128 ]] || fail "the command died by a signal (exit $rc) instead of reporting the error"
  grep -Fq -- "$out.partial: " <<<"$err" || fail "the error does not name the file written ($out.partial)"
  grep -Fq "File too large" <<<"$err" || fail "the error does not give the OS error (File too large)"
  grep -Eq "writing|closing" <<<"$err" || fail "the error does not say what was being written"
  ! grep -q "HDF5-DIAG" <<<"$err" || fail "HDF5 printed its own error stack"
  local left
  left="$(find . -name '*.partial')"
  [[ -z "$left" ]] || fail "partial file(s) left behind: $left"
  [[ "$(cksum < "$out")" == "$before" ]] || fail "$out was changed by the failed command"
  "$bin" inspect "$out" >/dev/null || fail "$out no longer validates"
  echo "ok: exit $rc, $out unchanged, no partial file"
}

case "$case" in
  import_jsonl)
    # 200 lines of 250 ids < 50000 (deterministic): about 110 KB of HDF5
    awk 'BEGIN { srand(7); for (i = 0; i < 200; i++) { s = "{\"input_ids\": ["; for (j = 0; j < 250; j++)
         s = s (j ? ", " : "") int(rand() * 50000); print s "]}" } }' > big.jsonl
    good_dataset out.h5
    expect_full out.h5 "$bin" import-jsonl big.jsonl out.h5
    "$bin" import-jsonl big.jsonl unlimited.h5 | grep -q "wrote unlimited.h5: 200 sequences, 50000 tokens" ||
      fail "the same import without the limit failed"
    ;;
  make_prompts)
    good_dataset out.h5
    expect_full out.h5 "$bin" make-prompts --out out.h5 --vocab 160 --count 500 --min-len 64 --max-len 64
    "$bin" make-prompts --out unlimited.h5 --vocab 160 --count 500 --min-len 64 --max-len 64 |
      grep -q "wrote unlimited.h5: 500 prompts" || fail "the same make-prompts without the limit failed"
    ;;
  regenerate)
    # the tiny target of regenerate_cli.sh; 300 prompts of 64 tokens + 1 generated: about 45 KB of output
    "$bin" make-target --out target --hidden 64 --layers 3 --heads 16 --kv-heads 8 --head-dim 16 --intermediate 96 \
      --vocab 160 --seed 7 >/dev/null || fail "make-target failed"
    "$bin" make-prompts --out prompts.h5 --vocab 160 --count 300 --min-len 64 --max-len 64 >/dev/null ||
      fail "make-prompts failed"
    good_dataset out.h5
    expect_full out.h5 "$bin" regenerate --target target --prompts prompts.h5 --out out.h5 --max-new-tokens 1
    "$bin" regenerate --target target --prompts prompts.h5 --out unlimited.h5 --max-new-tokens 1 |
      grep -q "wrote unlimited.h5: 300 sequences" || fail "the same regenerate without the limit failed"
    ;;
  truncated)
    "$bin" make-prompts --out good.h5 --vocab 160 --count 300 --min-len 64 --max-len 64 >/dev/null ||
      fail "make-prompts failed"
    cp good.h5 half.h5 && truncate -s $(( $(stat -c %s good.h5) / 2 )) half.h5 || fail "cannot truncate"
    for cmd in "inspect half.h5" "regenerate --target target --prompts half.h5 --out r.h5 --max-new-tokens 1"; do
      [[ "$cmd" != regenerate* ]] || "$bin" make-target --out target --hidden 32 --layers 1 --heads 2 --kv-heads 1 \
        --head-dim 16 --intermediate 32 --vocab 160 >/dev/null || fail "make-target failed"
      # shellcheck disable=SC2086
      err="$("$bin" $cmd 2>&1)"
      rc=$?
      echo "\$ dflash_data $cmd"
      echo "$err"
      echo "[exit $rc]"
      [[ $rc -ne 0 && $rc -lt 128 ]] || fail "expected a non-zero exit that is not a signal, got $rc"
      grep -Fq "half.h5: cannot open the HDF5 file" <<<"$err" || fail "the error does not name half.h5"
      grep -Fq "truncated" <<<"$err" || fail "the error does not say the file is truncated"
      ! grep -q "HDF5-DIAG" <<<"$err" || fail "HDF5 printed its own error stack"
    done
    [[ ! -e r.h5 && -z "$(find . -name '*.partial')" ]] || fail "a failed regenerate left a file"
    ;;
  *)
    fail "unknown case $case" ;;
esac
echo "PASS: $case"
