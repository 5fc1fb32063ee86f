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
    # the run's picture: dflash_logs plot writes a well-formed SVG with a line per series
    "$build/apps/dflash_logs" plot "$out/run" | tee "$out/plot.log"
    grep -q "wrote $out/run/metrics.svg: 3 records (steps 10..30)" "$out/plot.log" || fail "plot did not report"
    python3 -c 'import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); \
      n = sum(1 for e in r.iter() if e.tag.endswith("polyline")); print(n, "polylines"); sys.exit(n < 15)' \
      "$out/run/metrics.svg" || fail "metrics.svg is not a well-formed SVG with its lines"
    "$build/apps/dflash_logs" "$out/run" | tee "$out/summary.log"
    grep -q "STRAGGLER" "$out/summary.log" && fail "a finished run has no straggler"
    # absurd filters are refused by name, not answered with nothing (or everything) and exit 0
    for bad in "--rank 99999999999999:a world rank is 0 .. 999999" "--rank 12:has no rank_12.log" \
               "--tail -5:--tail -5: give the number of last lines" "--tail 0:--tail 0: give the number"; do
      set +e
      "$build/apps/dflash_logs" "$out/run" ${bad%%:*} >"$out/bad.log" 2>&1
      rc=$?
      set -e
      [[ $rc -ne 0 ]] && grep -q -- "${bad#*:}" "$out/bad.log" ||
        fail "dflash_logs ${bad%%:*}: rc $rc, $(cat "$out/bad.log")"
    done
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
  fused_mode)
    # loss.mode fused (dX formed in the forward pass) trains the same weights as recompute, up to rounding; and a
    # run with truncated sequences and a back-pressure window of 1 packet completes
    eq=(--set run.steps=3 --set log.every=1 --set optim.lr=1e-3 --set optim.warmup_ratio=0)
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${eq[@]}" \
      --set loss.mode=recompute --set "run.out_dir=$out/recompute" >"$out/recompute.log"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${eq[@]}" \
      --set loss.mode=fused --set "run.out_dir=$out/fused" >"$out/fused.log"
    "$build/tests/integration/safetensors_compare" "$out/fused/drafter_final.safetensors" \
      "$out/recompute/drafter_final.safetensors" --rtol 1e-6 || fail "fused and recompute weights differ"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=6 \
      --set data.max_seq_len=40 --set layout.packets_in_flight=1 --set "run.out_dir=$out/short" >"$out/short.log"
    [[ -f "$out/short/drafter_final.safetensors" ]] || fail "the truncated run did not finish"
    echo "PASS (fused_mode)"
    ;;
  two_groups)
    # 2 target groups of TP 2 feeding 3 drafters (group 0 -> drafters 0 and 2, group 1 -> drafter 1)
    "$mpirun_sh" -np 7 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set layout.target_tp=2 \
      --set layout.target_groups=2 --set layout.drafter_dp=3 --set run.steps=12 --set log.every=4 | tee "$out/log"
    [[ $(losses "$out/run/metrics.jsonl" | wc -l) -eq 3 ]] || fail "expected 3 metrics records"
    for r in 0 1 2 3; do
      grep -q "sent the packets of steps 1..12" "$out/run/logs/rank_0$r.log" || fail "target rank $r did not finish"
    done
    grep -q "\[rank 2 | target | group 1 tp 0\]" "$out/run/logs/rank_02.log" || fail "rank 2 log lacks its group"
    echo "PASS (two_groups)"
    ;;
  check)
    # --check (no mpirun): validates config, target, data and prints the plan; a bad value is refused
    "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --check | tee "$out/log"
    grep -q "check: OK" "$out/log" || fail "no 'check: OK'"
    grep -q "mpirun -np 8 (5 target TP x 1 groups + 3 drafter DP)" "$out/log" || fail "no rank count"
    grep -q "64 sequences, 4980 tokens; 10 steps per epoch, 600 steps" "$out/log" || fail "wrong data plan"
    grep -q "94656 parameters" "$out/log" || fail "wrong drafter size"
    [[ ! -d "$out/run" ]] || fail "--check must not write the run folder"
    grep -q "target weights 91 tensors with the shapes config.json implies" "$out/log" || fail "weights not verified"
    grep -q "trained        3072 tokens with loss_mask 1" "$out/log" || fail "no trained-token count"
    grep -q "slurm          #SBATCH --signal=USR1@600 for a start; nothing measured yet" "$out/log" ||
      fail "no slurm signal margin"
    expect_error "drafter.mask_token_id = 600 is outside the target vocabulary" "$bin" \
      "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set drafter.mask_token_id=600 --check
    # --check is a plain process: it works where MPI cannot even start (an unusable transport)
    OMPI_MCA_pml=bogus "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --check >"$out/no_mpi.log" 2>&1 ||
      { cat "$out/no_mpi.log"; fail "--check needed MPI"; }
    # a target folder holding only config.json (never OK: INCOMPLETE, exit 2), a mask token the data trains on, a
    # block longer than every sequence
    mkdir -p "$out/bare" && cp "$tiny/target/config.json" "$out/bare/"
    expect_error "check: INCOMPLETE: $out/bare holds config.json but no model.safetensors" "$bin" \
      "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set "target.path=$out/bare" --check
    grep -q "check: OK" "$out/log" && fail "a folder without weights reported check: OK"
    # a tokenizer.json in the target folder that cannot have made the data: --check names the largest data id
    mkdir -p "$out/tok" && cp "$tiny/target/"* "$out/tok/"
    echo '{"model": {"vocab": {"a": 0, "b": 1, "c": 2}}, "added_tokens": [{"id": 3, "special": true}]}' \
      >"$out/tok/tokenizer.json"
    expect_error "the data holds token id [0-9]* but $out/tok/tokenizer.json has only 4 tokens" "$bin" \
      "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set "target.path=$out/tok" --check
    expect_error "trained position(s) hold drafter.mask_token_id = 5 " "$bin" "$src/mpi_launch/configs/tiny.yaml" \
      "${common[@]}" --set drafter.mask_token_id=5 --check
    expect_error "drafter.block_size = 200 is longer than every sequence" "$bin" "$src/mpi_launch/configs/tiny.yaml" \
      "${common[@]}" --set drafter.block_size=200 --check
    ;;
  cuda_device)
    # run.device cuda: on a machine with a GPU the drafter step runs on it (mpi_launch/gpu_check.sh runs that job);
    # without one (or without the CUDA backend) every rank stops with an error naming the fix, never a hang
    if "$build/tests/cuda/dflash_cuda_tests" --list-test-cases >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
      echo "skipped: a CUDA device is present (gpu_check.sh runs the tiny job on it)"; exit 77
    fi
    export DFLASH_EMU_DEVICES=0  # on the emulated GPU: a machine without one (cuda_job.sh runs the job with one)
    expect_error "(run.device: cuda, --device cuda), but no CUDA device" "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" \
      --set run.device=cuda
    grep -qF "run on the CPU (run.device: cpu" "$out/log" || fail "the error does not name the fix"
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
  resume_bitexact)
    # 20 steps straight vs 10 steps, stop (checkpoint), resume, 10 more: identical weights and losses, bit for bit
    run=(--set run.steps=20 --set log.every=1)
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${run[@]}" \
      --set "run.out_dir=$out/straight" >"$out/straight.log"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${run[@]}" \
      --set "run.out_dir=$out/split" --stop-after-steps 10 >"$out/split1.log"
    [[ -f "$out/split/ckpt/step_00000010/DONE" ]] || fail "no complete checkpoint at step 10"
    [[ ! -f "$out/split/drafter_final.safetensors" ]] || fail "a stopped run must not write final weights"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${run[@]}" \
      --set "run.out_dir=$out/split" --set ckpt.resume=auto >"$out/split2.log"
    grep -q "resuming from .*step_00000010 at step 10" "$out/split/logs/rank_05.log" || fail "did not resume at 10"
    "$build/tests/integration/safetensors_compare" "$out/straight/drafter_final.safetensors" \
      "$out/split/drafter_final.safetensors" --rtol 0 || fail "weights differ"
    diff <(losses "$out/straight/metrics.jsonl") <(losses "$out/split/metrics.jsonl") || fail "loss sequences differ"
    [[ $(losses "$out/split/metrics.jsonl" | wc -l) -eq 20 ]] || fail "expected 20 logged losses"
    # each rank's log holds both attempts, each after its header: the first attempt's lines were not truncated
    for r in 00 05; do
      [[ $(grep -c "===== attempt: host .*, pid [0-9]*, " "$out/split/logs/rank_$r.log") -eq 2 ]] ||
        fail "rank_$r.log does not hold two attempt headers"
    done
    grep -q "checkpoint: .*step_00000010" "$out/split/logs/rank_05.log" || fail "the first attempt's lines are gone"
    echo "PASS (resume_bitexact): 20 losses and every weight identical"
    ;;
  ckpt_incomplete)
    # checkpoints at 5 and 10; a crash while writing 10 (no DONE) makes resume take 5; a truncated weights file in
    # a DONE-marked checkpoint is refused with a message naming it
    # metrics of steps 6..10 (and a torn line, as kill -9 leaves) outlive the checkpoint resumed from: the resume
    # drops them, so metrics.jsonl stays one series 1, 2, ..., 6
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=10 \
      --set ckpt.every=5 --set ckpt.keep=0 --set log.every=1 >"$out/run.log"
    [[ -f "$out/run/ckpt/step_00000005/DONE" && -f "$out/run/ckpt/step_00000010/DONE" ]] || fail "checkpoints missing"
    rm "$out/run/ckpt/step_00000010/DONE"
    printf '{"step":11,"lo' >>"$out/run/metrics.jsonl"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=10 \
      --set ckpt.resume=auto --set log.every=1 --stop-after-steps 1 >"$out/resume.log"
    grep -q "resuming from .*step_00000005 at step 5" "$out/run/logs/rank_05.log" ||
      fail "resume did not skip the checkpoint without DONE"
    echo "resume skipped step_00000010 (no DONE) and took step_00000005"
    steps=$(sed -n 's/^{"step":\([0-9]*\),.*/\1/p' "$out/run/metrics.jsonl" | tr '\n' ' ')
    [[ "$steps" == "1 2 3 4 5 6 " && $(wc -l <"$out/run/metrics.jsonl") -eq 6 ]] ||
      fail "metrics.jsonl after the resume holds steps '$steps', expected 1..6"
    grep -q "metrics.jsonl: dropped 6 record(s) past step 5" "$out/run/logs/rank_05.log" || fail "no drop warning"
    truncate -s -100 "$out/run/ckpt/step_00000006/model.safetensors"
    expect_error "model.safetensors" "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" \
      --set run.steps=10 --set ckpt.resume=auto
    grep -q "truncated" "$out/log" || fail "the refusal does not say the file is truncated"
    ;;
  ckpt_mismatch)
    # a checkpoint of 3 drafter ranks is refused by a run with 1, naming what differs
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=4 \
      --set ckpt.every=2 >"$out/run.log"
    expect_error "drafter_dp=3, this run has drafter_dp=1" "$mpirun_sh" -np 6 "$bin" \
      "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=4 --set layout.drafter_dp=1 \
      --set ckpt.resume=auto
    # the checkpoint records its data's identity; a resume on other data (same config) is refused, naming both
    grep -q '"dataset": "64 sequences, 4980 tokens, content 0x[0-9a-f]\{16\}"' "$out/run/ckpt/step_00000004/state.json" ||
      fail "state.json lacks the dataset identity"
    awk 'BEGIN { srand(3); for (s = 0; s < 8; ++s) { printf "{\"input_ids\": ["; for (i = 0; i < 30; ++i)
         printf "%s%d", (i ? ", " : ""), 1 + int(rand() * 500); print "]}" } }' >"$out/other.jsonl"
    "$build/apps/dflash_data" import-jsonl "$out/other.jsonl" "$out/other.h5" >/dev/null
    expect_error "trained on the dataset '64 sequences, 4980 tokens, content 0x.*', this run's data.path is '8 sequences, 240 tokens" \
      "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=4 \
      --set ckpt.resume=auto --set "data.path=$out/other.h5"
    ;;
  sigterm)
    # SIGTERM to every rank mid-run: the job finishes its step, writes a complete checkpoint, exits 0; resume goes on
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=100000 \
      --set log.every=1 >"$out/run.log" 2>&1 &
    job=$!
    for _ in $(seq 1 300); do
      [[ -f "$out/run/metrics.jsonl" && $(wc -l <"$out/run/metrics.jsonl") -ge 3 ]] && break
      sleep 0.1
    done
    # a second job on the same out_dir is refused, naming the running one, and writes nothing there
    expect_error "is in use by another job (host .*, pid [0-9]*" "$mpirun_sh" -np 8 "$bin" \
      "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=100000
    [[ $(grep -c "===== attempt:" "$out/run/logs/rank_05.log") -eq 1 ]] || fail "the refused job wrote to the logs"
    # signal the ranks (the children of mpirun), as slurm signals the tasks; SIGTERM to mpirun itself kills the job
    pkill -TERM -P "$job" -f dflash_mpi || fail "no dflash_mpi rank to signal"
    rc=0
    timeout 60 tail --pid=$job -f /dev/null || fail "the job did not exit within 60 s of SIGTERM"
    wait $job || rc=$?
    tail -n 5 "$out/run.log"
    [[ $rc -eq 0 ]] || fail "exit code $rc after SIGTERM, expected 0"
    ckpt=$(ls -d "$out/run/ckpt"/step_* | tail -1)
    [[ -f "$ckpt/DONE" ]] || fail "no complete checkpoint after SIGTERM"
    step=$((10#${ckpt##*step_}))
    grep -q "stopping after step $step on SIGTERM" "$out/run/logs/rank_05.log" || fail "no stop message"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=100000 \
      --set log.every=1 --set ckpt.resume=auto --stop-after-steps 2 >"$out/resume.log"
    grep -q "resuming from .*at step $step" "$out/run/logs/rank_05.log" || fail "resume did not continue at $step"
    echo "PASS (sigterm): checkpoint at step $step, resumed from it"
    ;;
  disk_full)
    # a full disk under metrics.jsonl (/dev/full: every write fails with ENOSPC): the job stops at the first
    # record with an error naming the file and the step, instead of training on with nothing recorded
    mkdir -p "$out/run"
    ln -s /dev/full "$out/run/metrics.jsonl"
    expect_error "writing $out/run/metrics.jsonl failed at step 2: No space left on device" "$mpirun_sh" -np 8 \
      "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=50 --set log.every=2
    ! grep -q "step 4/50" "$out/log" || fail "training went on after the failed write"
    ;;
  out_dir_guard)
    # a finished run's out_dir: a fresh start is refused and touches nothing; run.start_over moves the earlier run
    # to superseded/ (deletes nothing); a requeue (ckpt.resume auto) that finds only ckpt/best keeps it
    hashes() { (cd "$1" && sha256sum drafter_final.safetensors ckpt/step_00000004/model.safetensors); }
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=4 \
      --set ckpt.every=2 >"$out/first.log"
    before="$(hashes "$out/run")"
    expect_error "run.out_dir = $out/run holds an earlier run (ckpt/step_00000002, ckpt/step_00000004, drafter_final.safetensors, metrics.jsonl)" \
      "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=4
    grep -q "set run.start_over: true to move" "$out/log" || fail "the refusal does not name the way out"
    [[ "$(hashes "$out/run")" == "$before" ]] || fail "the refused start changed the earlier run's weights"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=4 \
      --set ckpt.every=2 --set run.start_over=true >"$out/again.log"
    grep -q "run.start_over: the earlier run's ckpt, drafter_final.safetensors, metrics.jsonl moved to $out/run/superseded/" \
      "$out/run/logs/rank_00.log" || fail "no start_over notice in rank 0's log"
    aside=$(ls -d "$out/run/superseded/"*)
    [[ "$(hashes "$aside")" == "$before" ]] || fail "the superseded copy is not the earlier run"
    [[ -f "$out/run/ckpt/step_00000004/DONE" && -f "$out/run/drafter_final.safetensors" ]] || fail "no new run"
    mkdir -p "$out/requeue/ckpt" && cp -r "$out/run/ckpt/step_00000004" "$out/requeue/ckpt/best"
    best="$(sha256sum <"$out/requeue/ckpt/best/model.safetensors")"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=2 \
      --set "run.out_dir=$out/requeue" --set ckpt.resume=auto >"$out/requeue.log"
    [[ -f "$out/requeue/ckpt/best/DONE" && "$(sha256sum <"$out/requeue/ckpt/best/model.safetensors")" == "$best" ]] ||
      fail "the requeued run did not keep ckpt/best"
    echo "PASS (out_dir_guard): refused, moved aside with start_over, best kept on requeue"
    ;;
  bounds)
    # absurd sizes are refused by name; sizes within the bounds that no machine holds are refused by the memory
    # plan, in --check (exit 3, after the plan) and in the job before any allocation (never std::bad_alloc)
    expect_error "key 'drafter.layers' must be in \[1, 256\], got 100000" "$bin" "$src/mpi_launch/configs/tiny.yaml" \
      "${common[@]}" --set drafter.layers=100000 --check
    big=(--set drafter.layers=256 --set drafter.intermediate=1048576)
    rc=0
    "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${big[@]}" --check >"$out/big.log" 2>&1 || rc=$?
    [[ $rc -eq 3 ]] || { cat "$out/big.log"; fail "--check of a plan no machine holds exited $rc, expected 3"; }
    grep -q "check: DOES NOT FIT (the memory plan below)" "$out/big.log" || fail "no DOES NOT FIT header"
    grep -q "does not fit this machine: its ranks need" "$out/big.log" || fail "no refusal naming the numbers"
    grep -q "check: OK" "$out/big.log" && fail "--check said OK for a plan that does not fit"
    expect_error "the fuller GPU needs .* GB, more than any card listed" "$bin" "$src/mpi_launch/configs/tiny.yaml" \
      "${common[@]}" "${big[@]}" --set run.device=cuda --check
    expect_error "the memory plan does not fit .*: its ranks need" "$mpirun_sh" -np 8 "$bin" \
      "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${big[@]}"
    grep -q "bad_alloc" "$out/log" && fail "the job ended in std::bad_alloc"
    # the speculative eval's generation cannot run past the target's positions (40960 in the tiny target)
    expect_error "eval.max_new_tokens = 1000000: must be in \[1, 1048576\]\|eval.max_new_tokens = 1000000: prompt .* past the target's max_position_embeddings 40960" \
      "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set eval.spec_every=1 \
      --set "eval.prompts=$tiny/prompts.h5" --set eval.max_new_tokens=1000000 --check
    # unclear before: a folder given as the config, --stop-after-steps 0
    expect_error "$out: is a directory, not a config file" "$bin" "$out" --check
    expect_error "give a whole number of steps >= 1" "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" \
      --stop-after-steps 0
    ;;
  start_checks)
    # the job runs --check's tokenizer checks itself, and a checkpoint records its target: a resume against a
    # different target of the same shape (one weight byte changed) is refused, naming both identities
    mkdir -p "$out/tok" && cp "$tiny/target/"* "$out/tok/"
    echo '{"model": {"vocab": {"a": 0, "b": 1, "c": 2}}, "added_tokens": [{"id": 3, "special": true}]}' \
      >"$out/tok/tokenizer.json"
    expect_error "tokenizer, target and data disagree" "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" \
      "${common[@]}" --set "target.path=$out/tok" --set run.steps=2
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=2 \
      --set ckpt.every=2 --set run.out_dir="$out/run2" >"$out/run2.log"
    grep -q '"target": "91 tensors, [0-9]* parameters, sampled content 0x[0-9a-f]\{16\}"' \
      "$out/run2/ckpt/step_00000002/state.json" || fail "state.json lacks the target identity"
    mkdir -p "$out/other" && cp "$tiny/target/"* "$out/other/"
    python3 - "$out/other/model.safetensors" <<'PY'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    f.seek(8 + n + 2)
    b = f.read(1)
    f.seek(8 + n + 2)
    f.write(bytes([b[0] ^ 0x01]))
PY
    expect_error "trained against the target '91 tensors, .*', this run's target.path is '91 tensors" "$mpirun_sh" -np 8 \
      "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=2 --set run.out_dir="$out/run2" \
      --set "target.path=$out/other" --set ckpt.resume=auto
    ;;
  warm_start)
    # drafter.init: the first step's loss of a run warm-started from an export equals the loss of the exported
    # weights on the same batch as measured by the run that wrote them (file order and every anchor: with 10 steps
    # per epoch its step 21 is epoch 2's first, which sees step 1's batch and anchors); a random start's differs;
    # a mismatch is refused
    det=(--set data.shuffle=false --set loss.anchors_per_seq=512 --set log.every=1)
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${det[@]}" --set run.steps=21 \
      --set ckpt.every=20 --set ckpt.keep=0 >"$out/a.log"
    grep -q "21 steps of 3 x 2 sequences" "$out/a.log" || fail "not 3 x 2 sequences per step (64 sequences: 10 steps per epoch)"
    "$bin" --export "$out/run/ckpt/step_00000020" "$out/export" --dtype f32 >"$out/export.log"
    want=$(losses "$out/run/metrics.jsonl" | sed -n 21p)
    "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${det[@]}" --set "run.out_dir=$out/b" \
      --set "drafter.init=$out/export" --check >"$out/b_check.log" || { cat "$out/b_check.log"; fail "--check"; }
    grep -q "warm start     export $out/export (model.safetensors [0-9]* bytes, content 0x[0-9a-f]\{16\}): shapes, block, mask token, vocabulary and taps match" \
      "$out/b_check.log" || fail "--check does not verify the warm start"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${det[@]}" --set run.steps=1 \
      --set "run.out_dir=$out/b" --set "drafter.init=$out/export" --set ckpt.every=1 >"$out/b.log"
    got=$(losses "$out/b/metrics.jsonl" | sed -n 1p)
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${det[@]}" --set run.steps=1 \
      --set "run.out_dir=$out/c" --set "drafter.init=$out/run/ckpt/step_00000020" >"$out/c.log"
    from_ckpt=$(losses "$out/c/metrics.jsonl" | sed -n 1p)
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${det[@]}" --set run.steps=1 \
      --set "run.out_dir=$out/r" >"$out/r.log"
    random=$(losses "$out/r/metrics.jsonl" | sed -n 1p)
    echo "loss of the step-20 weights on the first batch: run A step 21 $want, warm start from the export $got," \
         "from the checkpoint $from_ckpt; random start $random"
    [[ -n "$want" && "$got" == "$want" && "$from_ckpt" == "$want" ]] || fail "the warm start's first loss differs"
    [[ "$random" != "$want" ]] || fail "a random start has the warm start's loss"
    grep -q "warm start (drafter.init): export $out/export" "$out/b/logs/rank_05.log" || fail "no warm start line"
    grep -q '"init": "export ' "$out/b/ckpt/step_00000001/state.json" || fail "state.json does not record the init"
    grep -q "^# drafter.init: export $out/export (model.safetensors" "$out/b/config.resolved.yaml" ||
      fail "config.resolved.yaml does not record the init's content"
    expect_error "drafter.init = $out/export: its drafter.block_size is 8, this run has drafter.block_size = 4" \
      "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=1 \
      --set "run.out_dir=$out/d" --set "drafter.init=$out/export" --set drafter.block_size=4
    ;;
  watchdog)
    # SIGSTOP of one drafter rank: the ranks waiting on it log, within run.watchdog_seconds (8 s here: above the
    # longest legitimate wait of this tiny run on a loaded 2-core machine), which rank they are and what they wait
    # on, and the job ends with an error instead of hanging forever
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=100000 \
      --set log.every=1 --set run.watchdog_seconds=8 >"$out/run.log" 2>&1 &
    job=$!
    for _ in $(seq 1 300); do
      [[ -f "$out/run/metrics.jsonl" && $(wc -l <"$out/run/metrics.jsonl") -ge 2 ]] && break
      sleep 0.1
    done
    pid=$(sed -n 's/.*===== attempt: host .*, pid \([0-9]*\), .*/\1/p' "$out/run/logs/rank_06.log" | tail -1)
    [[ -n "$pid" ]] || fail "no pid in the attempt header of rank_06.log"
    kill -STOP "$pid"
    start=$SECONDS
    if ! timeout 60 tail --pid=$job -f /dev/null; then
      kill -KILL "$pid" "$job"
      fail "the job still ran 60 s after SIGSTOP of rank 6"
    fi
    rc=0
    wait $job || rc=$?
    took=$((SECONDS - start))
    cat "$out/run.log"
    # mpirun's SIGKILL reaches the stopped rank (a stopped process dies of SIGKILL) shortly after mpirun returns
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      ps -o pid,stat,cmd -p "$pid" || true
      kill -KILL "$pid"
      fail "the stopped rank outlived the job by 10 s"
    fi
    [[ $rc -ne 0 ]] || fail "exit 0 after a stalled rank"
    grep -h "watchdog: world rank [0-9]* has waited [0-9]* s for the " "$out/run/logs/"rank_0[0-57].log >"$out/stalls" ||
      fail "no watchdog line in the logs of the waiting ranks"
    cat "$out/stalls"
    # the ranks blocked directly on rank 6 (targets sending to it, drafters in the all-reduce with it) report within
    # the 2 s every reporting rank waits before it aborts
    grep -q "on the drafter DP group\|rank 6 of the world" "$out/stalls" || fail "no watchdog line names a wait on rank 6"
    # and the heartbeats name the stopped rank itself (its own watchdog cannot speak)
    grep -h "world rank 6 (.*): STOPPED: no heartbeat for [0-9]* s" "$out/run/logs/"rank_0[0-57].log ||
      fail "no watchdog report names rank 6 as stopped"
    (( took <= 40 )) || fail "the job took ${took} s to end after the stall (watchdog 8 s)"
    echo "PASS (watchdog): job ended ${took} s after SIGSTOP of rank 6, exit $rc"
    ;;
  export_dump)
    # --export of a checkpoint (f32 weights equal the checkpoint's), and --dump-step's file holds inputs, loss and
    # gradients under the export names
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=2 \
      --set ckpt.every=1 >"$out/run.log"
    "$bin" --export "$out/run/ckpt/step_00000002" "$out/export" --dtype f32
    for key in '"architectures"' '"DFlashDraftModel"' '"block_size"' '"target_layer_ids"' '"mask_token_id"'; do
      grep -q "$key" "$out/export/config.json" || fail "config.json lacks $key"
    done
    "$build/tests/integration/safetensors_compare" "$out/export/model.safetensors" \
      "$out/run/ckpt/step_00000002/model.safetensors" --rtol 0 || fail "exported weights differ"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=2 \
      --set "run.out_dir=$out/dump_run" --dump-step "$out/dump" >"$out/dump.log"
    f="$out/dump/step_00000001.safetensors"
    [[ -f "$f" ]] || fail "no dump file"
    header=$(head -c 200000 "$f" | tr -d '\0')
    for key in inputs.slot0.tokens inputs.slot5.taps inputs.slot5.anchors inputs.slot3.final_hidden loss.ce \
        loss.weight_sum layers.1.mlp.down_proj.weight fc.weight hidden_norm.weight dflash.loss.kl; do
      grep -q "\"$key\"" <<<"$header" || fail "dump lacks $key"
    done
    # the dump carries the loss's hyperparameters and the weights the step started from: a dump of step 2 resumed
    # from the step-1 checkpoint holds exactly that checkpoint's weights
    for key in weights.fc.weight dflash.loss.ce_weight dflash.loss.kl_weight dflash.loss.cap_weight \
        dflash.loss.kl_temperature dflash.loss.decay_gamma dflash.block_size dflash.mask_token_id dflash.layer_types; do
      grep -q "\"$key\"" <<<"$header" || fail "dump lacks $key"
    done
    grep -q '"dflash.layer_types":"full,full"' <<<"$header" || fail "dump layer types are not full,full"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set run.steps=2 \
      --set "run.out_dir=$out/dump_run2" --set "ckpt.resume=$out/run/ckpt/step_00000001" --dump-step "$out/dump2" \
      >"$out/dump2.log"
    python3 - "$out/dump2/step_00000002.safetensors" "$out/run/ckpt/step_00000001/model.safetensors" <<'PY' ||
import json, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items()}
dump, ckpt = tensors(sys.argv[1]), tensors(sys.argv[2])
start = {k[len("weights."):]: v for k, v in dump.items() if k.startswith("weights.")}
assert start.keys() == ckpt.keys(), (sorted(start), sorted(ckpt))
bad = [k for k in ckpt if start[k] != ckpt[k]]
assert not bad, bad
print(f"dump: {len(start)} starting-weight tensors equal the step-1 checkpoint bit for bit")
PY
      fail "the dump's starting weights differ from the checkpoint it resumed from"
    echo "PASS (export_dump)"
    ;;
  *)
    fail "unknown case"
    ;;
esac
