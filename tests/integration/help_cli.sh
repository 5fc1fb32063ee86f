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
  # the usage once (not a hand-written text and then CLI11's), every option with its type (no untyped TEXT)
  local usages
  usages=$(grep -ci "usage:" <<<"$out" || true)
  [[ $usages -eq 1 ]] || fail "'$* --help' prints its usage $usages times: $out"
  ! grep -qw 'TEXT' <<<"$out" || fail "'$* --help' shows an option as TEXT: $out"
  echo "ok: $* --help"
}
# check_usage_error RC cmd...: an unknown option exits RC ("nonzero": any error), naming it
check_usage_error() {
  local want="$1" out rc=0
  shift
  out=$("$@" --no-such-option 2>&1) || rc=$?
  [[ $rc -ne 0 ]] || fail "'$* --no-such-option' exited 0"
  [[ $want == nonzero || $rc -eq $want ]] || fail "'$* --no-such-option' exited $rc, not $want: $out"
  grep -q -- "unknown option --no-such-option" <<<"$out" || fail "'$* --no-such-option' does not name the option: $out"
  ! grep -q '\.\(cpp\|h\):[0-9]' <<<"$out" || fail "'$* --no-such-option' prints a source location: $out"
  echo "ok: $* --no-such-option -> exit $rc"
}
# check_not_a_number OPTION cmd...: a number option given "abc" exits 2 with a message naming the option
check_not_a_number() {
  local option="$1" out rc=0
  shift
  out=$("$@" "$option" abc 2>&1) || rc=$?
  [[ $rc -eq 2 ]] || fail "'$* $option abc' exited $rc, not 2: $out"
  grep -q -- "$option" <<<"$out" || fail "'$* $option abc' does not name the option: $out"
  echo "ok: $* $option abc -> exit 2"
}
for cmd in "dflash_data export" "dflash_data import-jsonl" "dflash_data inspect" "dflash_data make-target" \
    "dflash_data make-prompts" "dflash_data regenerate" "dflash_bench drafter" "dflash_bench loss" \
    "dflash_bench target" "dflash_bench eval" "dflash_bench numerics" "dflash_bench stream" "dflash_bench cuda" \
    "dflash_logs" "dflash_logs plot" "dflash_eval" "dflash_mpi" "dflash_mpi --export"; do
  read -r prog sub <<<"$cmd"
  check_help "$build/apps/$prog" ${sub:+$sub}
  if [[ "$cmd" == "dflash_mpi" ]]; then
    check_usage_error 2 "$build/apps/$prog" some.yaml  # the config comes first
  elif [[ "$cmd" == "dflash_mpi --export" ]]; then
    check_usage_error nonzero "$build/apps/$prog" --export STEP_DIR OUT_DIR  # exits 1 like every export error
  else
    check_usage_error 2 "$build/apps/$prog" ${sub:+$sub}
  fi
done
check_not_a_number --max-new-tokens "$build/apps/dflash_eval" --target t --drafter d --prompts p.h5
check_not_a_number --max-new-tokens "$build/apps/dflash_data" regenerate --target t --prompts p.h5 --out o.h5
check_not_a_number --vocab "$build/apps/dflash_data" inspect some.h5
check_not_a_number --tail "$build/apps/dflash_logs" some_run
check_not_a_number --reps "$build/apps/dflash_bench" drafter
check_not_a_number --hidden "$build/apps/dflash_data" make-target --out some_dir
check_help "$build/apps/dflash_data"
check_help "$build/apps/dflash_bench"
echo "PASS (help_cli)"
