#!/usr/bin/env bash
# Every program and subcommand answers --help (exit 0, its usage on stdout), and a usage error exits non-zero
# with a message that carries no source location.
#   help_cli.sh BUILD_DIR
set -euo pipefail
build="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
check_help() {
  local out rc=0
  out=$("$@" --help 2>&1) || rc=$?
  [[ $rc -eq 0 ]] || fail "'$* --help' exited $rc: $out"
  grep -qi "usage\|options" <<<"$out" || fail "'$* --help' printed no usage: $out"
  ! grep -q '\.\(cpp\|h\):[0-9]' <<<"$out" || fail "'$* --help' prints a source location: $out"
  echo "ok: $* --help"
}
check_usage_error() {
  local out rc=0
  out=$("$@" --no-such-option 2>&1) || rc=$?
  [[ $rc -ne 0 ]] || fail "'$* --no-such-option' exited 0"
  grep -q -- "--no-such-option" <<<"$out" || fail "'$* --no-such-option' does not name the option: $out"
  ! grep -q '\.\(cpp\|h\):[0-9]' <<<"$out" || fail "'$* --no-such-option' prints a source location: $out"
  echo "ok: $* --no-such-option -> exit $rc"
}
for cmd in "dflash_data export" "dflash_data import-jsonl" "dflash_data inspect" "dflash_data make-target" \
    "dflash_data make-prompts" "dflash_data regenerate" "dflash_bench drafter" "dflash_bench loss" \
    "dflash_bench target" "dflash_bench eval" "dflash_logs" "dflash_eval" "dflash_mpi" "dflash_mpi --export"; do
  read -r prog sub <<<"$cmd"
  check_help "$build/apps/$prog" ${sub:+$sub}
  if [[ "$cmd" == "dflash_mpi" ]]; then
    check_usage_error "$build/apps/$prog" some.yaml  # the config comes first
  elif [[ "$cmd" == "dflash_mpi --export" ]]; then
    check_usage_error "$build/apps/$prog" --export STEP_DIR OUT_DIR
  else
    check_usage_error "$build/apps/$prog" ${sub:+$sub}
  fi
done
check_help "$build/apps/dflash_data"
check_help "$build/apps/dflash_bench"
echo "PASS (help_cli)"
