# Sourced by the CLI test scripts.
# expect RC PATTERN cmd...: run cmd, require exit code RC (or "nonzero") and PATTERN (grep -E) in its output.
expect() {
  local want="$1" pattern="$2"
  shift 2
  local out rc
  out="$("$@" 2>&1)"
  rc=$?
  echo "\$ $*"
  echo "$out"
  echo "[exit $rc]"
  if [[ "$want" == nonzero ]]; then
    if [[ $rc -eq 0 || $rc -ge 128 ]]; then echo "FAIL: expected a non-zero exit (not a crash), got $rc"; exit 1; fi
  elif [[ $rc -ne $want ]]; then
    echo "FAIL: expected exit $want, got $rc"; exit 1
  fi
  if ! grep -Eq -- "$pattern" <<<"$out"; then echo "FAIL: output does not match /$pattern/"; exit 1; fi
}
