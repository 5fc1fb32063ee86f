#!/usr/bin/env bash
# dflash_mpi end to end, one case per ctest test. Uses the tiny target + data made by the dflash_tiny_data
# fixture (data/make_tiny.sh) and mpi_launch/configs/tiny.yaml with --set overrides.
#   trainer_cli.sh BUILD_DIR SOURCE_DIR WORK_DIR CASE
set -euo pipefail
build="$1" src="$2" work="$3" case="$4"
bin="$build/apps/dflash_mpi"
tiny="$build/tests/integration/tiny_data"
mpirun_sh="$src/tests/integration/mpirun.sh"
out="$work/$case"
rm -rf "$out"
mkdir -p "$out"
common=(--set "target.path=$tiny/target" --set "data.path=$tiny/train.h5" --set "run.out_dir=$out/run")

fail() { echo "FAIL ($case): $*" >&2; exit 1; }

# loss values from metrics.jsonl, one per line
losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1"; }

# runs dflash_mpi expecting failure within 30 s, with a message matching $1 on stdout/stderr
expect_error() {
  local pattern="$1"; shift
  local start=$SECONDS rc=0
  timeout 30 "$@" >"$out/log" 2>&1 || rc=$?
  local took=$((SECONDS - start))
  cat "$out/log"
  [[ $rc -ne 0 ]] || fail "exited 0, expected an error"
  [[ $rc -ne 124 ]] || fail "did not exit within 30 s (a rank hung)"
  grep -q -- "$pattern" "$out/log" || fail "no message matching '$pattern'"
  echo "PASS ($case): exit $rc after ${took}s with a message matching '$pattern'"
}

case "$case" in
  learns)
    # 8 ranks, 30 steps, loss averaged over steps 1-10, 11-20, 21-30: the last is clearly (>= 5%) below the first
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" \
      --set run.steps=30 --set optim.micro_batches=2 --set log.every=10 | tee "$out/log"
    mapfile -t l < <(losses "$out/run/metrics.jsonl")
    [[ ${#l[@]} -eq 3 ]] || fail "expected 3 metrics records, got ${#l[@]}"
    echo "mean loss of steps 1-10: ${l[0]}; 11-20: ${l[1]}; 21-30: ${l[2]}"
    awk -v a="${l[0]}" -v b="${l[2]}" 'BEGIN { exit !(b < 0.95 * a) }' || fail "loss ${l[2]} is not 5% below ${l[0]}"
    [[ -f "$out/run/drafter_final.safetensors" ]] || fail "no final weights"
    for r in 0 1 2 3 4 5 6 7; do
      f="$out/run/logs/rank_0$r.log"
      [[ -s "$f" ]] || fail "missing per-rank log $f"
    done
    grep -q "\[rank 0 | target | 0\]" "$out/run/logs/rank_00.log" || fail "rank 0 log lacks its prefix"
    grep -q "\[rank 5 | drafter | 0\]" "$out/run/logs/rank_05.log" || fail "rank 5 log lacks its prefix"
    echo "PASS (learns)"
    ;;
  equivalence)
    # 3 drafter ranks x 1 micro-batch == 1 drafter rank x 3 micro-batches over the same sequences, 3 steps.
    # lr 1e-3 without warmup: AdamW divides by sqrt(v), so fp32 summation-order noise in near-zero gradient
    # elements becomes a step of up to lr; a small lr keeps that noise below the 1e-5 being tested.
    eq=(--set run.steps=3 --set log.every=1 --set optim.lr=1e-3 --set optim.warmup_ratio=0)
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${eq[@]}" \
      --set layout.drafter_dp=3 --set optim.micro_batches=1 --set "run.out_dir=$out/dp3" >"$out/dp3.log"
    "$mpirun_sh" -np 6 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${eq[@]}" \
      --set layout.drafter_dp=1 --set optim.micro_batches=3 --set "run.out_dir=$out/dp1" >"$out/dp1.log"
    "$build/tests/integration/safetensors_compare" "$out/dp3/drafter_final.safetensors" \
      "$out/dp1/drafter_final.safetensors" --rtol 1e-5
    # the logged losses agree step by step (same sequences, anchors and weights up to rounding)
    paste <(losses "$out/dp3/metrics.jsonl") <(losses "$out/dp1/metrics.jsonl") | tee "$out/losses" |
      awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * $2) bad = 1 } END { exit bad || NR != 3 }' ||
      fail "loss sequences differ: $(tr '\n' ' ' <"$out/losses")"
    echo "PASS (equivalence)"
    ;;
  world_mismatch)
    expect_error "the world has 7 ranks" "$mpirun_sh" -np 7 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}"
    ;;
  unknown_key)
    expect_error "did you mean 'optim.lr'" "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" \
      "${common[@]}" --set optim.lrr=0.1
    ;;
  missing_data)
    expect_error "$out/nothing.h5" "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" \
      --set "data.path=$out/nothing.h5"
    ;;
  token_beyond_vocab)
    printf '{"input_ids": [1, 2, 3, 4, 5, 6]}\n{"input_ids": [7, 8, 600, 9, 10, 11]}\n{"input_ids": [1, 2, 3]}\n' \
      >"$out/bad.jsonl"
    "$build/apps/dflash_data" import-jsonl "$out/bad.jsonl" "$out/bad.h5" >/dev/null
    expect_error "sequence 1" "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" \
      --set "data.path=$out/bad.h5"
    ;;
  *)
    fail "unknown case"
    ;;
esac
