#!/usr/bin/env bash
# The in-training eval (docs/eval.md "During training"), one ctest test per case (tests/integration/CMakeLists.txt).
#   train_eval.sh BUILD_DIR SOURCE_DIR WORK_DIR CASE
# run      (fixture train_eval_run) 60 steps of the quickstart config on the tiny data in file order, log.every 1,
#          held-out eval (eval.data = the training file, its first 6 sequences) and speculative eval (3 prompts x 24
#          tokens) after every 20 steps, checkpoints every 20: WORK_DIR/run
# spec     the speculative tau in metrics.jsonl after steps 20, 40, 60 == dflash_eval --drafter ckpt/step_N on the
#          same prompts and limits (same weights, CPU fp32: the same numbers, histogram included)
# heldout  the held-out eval after 20 steps == training step 21's loss/acc/tau: with data.shuffle false step 21
#          (the first of epoch 3: 64 sequences make 10 steps of 6) trains sequences 0..5 in slots 0..5, which is
#          what the eval sees, with the same anchors
# best     ckpt/best is the first step with the highest speculative tau; dflash_eval reads it; resume (auto) takes
#          the newest step_* and never best; ckpt.resume = best is refused
# stop     evals every 10 steps, --stop-after-steps at a due step (10) and just before one (9, where the target
#          group may already wait for the weights of step 10): the job ends cleanly, no hang
# groups   two target groups of TP 2 + 3 drafters: every drafter gets its held-out share from its own group
# bad      eval.every without eval.data, eval.spec_every without eval.prompts, a missing eval file: a clear error,
#          non-zero exit, within 30 s
set -euo pipefail
build="$1" src="$2" work="$3" case="$4"
tiny="$build/tests/integration/tiny_data"
mpirun_sh="$src/tests/integration/mpirun.sh"
bin="$build/apps/dflash_mpi"
run="$work/run"
fail() { echo "FAIL ($case): $*" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
common=(--set "target.path=$tiny/target" --set "data.path=$tiny/train.h5" --set data.shuffle=false
        --set eval.every=10 --set "eval.data=$tiny/train.h5" --set eval.max_sequences=6
        --set eval.spec_every=10 --set "eval.prompts=$tiny/prompts.h5" --set eval.spec_prompts=3
        --set eval.max_new_tokens=24)
# the fixture run's schedule (the best and resume cases repeat it: run.steps is in the config hash)
every20=(--set eval.every=20 --set eval.spec_every=20 --set run.steps=60 --set log.every=1 --set ckpt.every=20
         --set ckpt.keep=0)

expect_error() {  # PATTERN CMD...: fails unless CMD exits non-zero within 30 s with a message matching PATTERN
  local pattern="$1"; shift
  local rc=0
  timeout 30 "$@" >"$work/bad.log" 2>&1 || rc=$?
  [[ $rc -ne 0 ]] || { cat "$work/bad.log"; fail "exited 0, expected an error matching '$pattern'"; }
  [[ $rc -ne 124 ]] || { cat "$work/bad.log"; fail "did not exit within 30 s (a rank hung)"; }
  grep -q -- "$pattern" "$work/bad.log" || { cat "$work/bad.log"; fail "no message matching '$pattern'"; }
  echo "ok: exit $rc with '$pattern'"
}

case "$case" in
  run)
    rm -rf "$run"
    mkdir -p "$work"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${every20[@]}" \
      --set "run.out_dir=$run" >"$work/train.log" 2>&1 ||
      { tail -30 "$work/train.log"; fail "training failed"; }
    grep "eval step" "$work/train.log"
    [[ $(grep -c '"kind":"eval"' "$run/metrics.jsonl") -eq 3 ]] || fail "expected 3 held-out eval records"
    [[ $(grep -c '"kind":"spec_eval"' "$run/metrics.jsonl") -eq 3 ]] || fail "expected 3 speculative eval records"
    # the picture of the run plots the training records only (60 of them)
    "$build/apps/dflash_logs" plot "$run" | tee "$work/plot.log"
    grep -q "60 records (steps 1..60)" "$work/plot.log" || fail "dflash_logs plot counted the eval records"
    echo "PASS (run)"
    ;;
  spec)
    for step in 20 40 60; do
      dir="$run/ckpt/step_$(printf %08d $step)"
      "$build/apps/dflash_eval" --target "$tiny/target" --drafter "$dir" --prompts "$tiny/prompts.h5" --limit 3 \
        --max-new-tokens 24 --out "$work/eval_$step.json" >/dev/null
      python3 - "$run/metrics.jsonl" "$work/eval_$step.json" $step <<'PY' || fail "step $step: the in-training tau differs"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
step = int(sys.argv[3])
r = [x for x in recs if x.get("kind") == "spec_eval" and x["step"] == step]
assert len(r) == 1, r
r, e = r[0], json.load(open(sys.argv[2]))
for k in ("tau", "kept_histogram", "acceptance_by_position", "generated_tokens", "verify_forwards", "prompts"):
    assert r["spec_" + k] == e[k], (k, r["spec_" + k], e[k])
assert e["prompts"] == 3 and e["generated_tokens"] == 3 * 24, e
print(f"step {step}: in-training speculative tau {r['spec_tau']:.4f} == dflash_eval {e['tau']:.4f}, "
      f"histogram {r['spec_kept_histogram']}")
PY
    done
    echo "PASS (spec)"
    ;;
  heldout)
    python3 - "$run/metrics.jsonl" <<'PY' || fail "held-out eval differs from the training step on the same sequences"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ev = {x["step"]: x for x in recs if x.get("kind") == "eval"}
tr = {x["step"]: x for x in recs if "kind" not in x}
assert sorted(ev) == [20, 40, 60], sorted(ev)
e, t = ev[20], tr[21]
assert t["steps_averaged"] == 1
for k in ("loss", "ce", "kl", "cap", "acc", "topk_acc", "tau", "acc_by_pos", "weight_sum", "positions"):
    assert e["eval_" + k] == t[k], (k, e["eval_" + k], t[k])
assert e["eval_sequences"] == 6, e
# a real eval: weights change between evals, and so does the loss of the same sequences
assert ev[40]["eval_loss"] != ev[20]["eval_loss"]
print(f"held-out after 20 steps: loss {e['eval_loss']:.6f} acc {e['eval_acc']:.4f} tau {e['eval_tau']:.4f} == "
      f"training step 21 on the same sequences")
PY
    echo "PASS (heldout)"
    ;;
  best)
    best="$run/ckpt/best"
    [[ -f "$best/DONE" ]] || fail "no complete $best"
    python3 - "$run/metrics.jsonl" "$best/state.json" <<'PY' || fail "best is not the step with the best tau"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"spec_eval"' in l]
st = json.load(open(sys.argv[2]))
top = max(r["spec_tau"] for r in recs)
first = min(r["step"] for r in recs if r["spec_tau"] == top)
b = st["extra"]["best"]
assert st["step"] == first and b["step"] == first and b["metric"] == "spec_tau" and b["value"] == top, (st, recs)
print(f"best: step {first}, speculative tau {top:.4f} (evals: {[(r['step'], round(r['spec_tau'], 4)) for r in recs]})")
PY
    # dflash_eval finds it, with the tau recorded
    "$build/apps/dflash_eval" --target "$tiny/target" --drafter "$best" --prompts "$tiny/prompts.h5" --limit 3 \
      --max-new-tokens 24 --out "$work/best.json" >/dev/null
    python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))["extra"]["best"]; assert a["tau"]==b["value"], (a["tau"], b)' \
      "$work/best.json" "$best/state.json" || fail "dflash_eval --drafter best gives another tau"
    # resume takes the newest step_*, never best (copy the run: the fixture stays as it is)
    rm -rf "$work/resume" && cp -r "$run" "$work/resume"
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${every20[@]}" \
      --set "run.out_dir=$work/resume" --set ckpt.resume=auto >"$work/resume.log" 2>&1 ||
      { tail -20 "$work/resume.log"; fail "resume failed"; }
    grep -q "resuming from $work/resume/ckpt/step_00000060 at step 60" "$work/resume/logs/rank_05.log" ||
      fail "resume did not take ckpt/step_00000060"
    grep -q "best checkpoint: .*holds step" "$work/resume/logs/rank_05.log" || fail "the resumed run did not read best"
    expect_error "the best checkpoint holds weights without optimizer state" \
      "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" "${every20[@]}" \
      --set "run.out_dir=$work/resume" --set "ckpt.resume=$work/resume/ckpt/best"
    echo "PASS (best)"
    ;;
  stop)
    for n in 10 9; do
      out="$work/stop_$n"
      rm -rf "$out"
      rc=0
      # a clean stop takes ~5 s; 180 s tells a hang from a checkpoint fsync stalled by a loaded disk (seen once: 60 s)
      timeout 180 "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set "run.out_dir=$out" \
        --set run.steps=30 --stop-after-steps $n >"$work/stop_$n.log" 2>&1 || rc=$?
      [[ $rc -eq 0 ]] || { tail -20 "$work/stop_$n.log"; fail "--stop-after-steps $n: exit $rc (124: a rank hung)"; }
      [[ -f "$out/ckpt/step_$(printf %08d $n)/DONE" ]] || fail "--stop-after-steps $n: no checkpoint of step $n"
      spec=$(grep -c '"kind":"spec_eval"' "$out/metrics.jsonl" || true)
      [[ $spec -eq $((n == 10 ? 1 : 0)) ]] || fail "--stop-after-steps $n: $spec speculative eval records"
      grep -q '"kind":"eval"' "$out/metrics.jsonl" && fail "--stop-after-steps $n: a held-out eval ran on the stop"
      echo "ok: --stop-after-steps $n ended cleanly ($spec speculative eval)"
    done
    echo "PASS (stop)"
    ;;
  groups)
    # 2 target groups of TP 2 feeding 3 drafters (group 0 -> drafters 0 and 2, group 1 -> drafter 1): each group
    # streams its own drafters' held-out sequences (7: 3, 2, 2 per drafter), group 0 decodes the prompts
    out="$work/groups"
    rm -rf "$out"
    timeout 120 "$mpirun_sh" -np 7 "$bin" "$src/mpi_launch/configs/tiny.yaml" "${common[@]}" --set "run.out_dir=$out" \
      --set layout.target_tp=2 --set layout.target_groups=2 --set layout.drafter_dp=3 --set run.steps=12 \
      --set log.every=1 --set eval.every=4 --set eval.spec_every=6 --set eval.max_sequences=7 \
      >"$work/groups.log" 2>&1 || { tail -20 "$work/groups.log"; fail "two target groups: the job failed or hung"; }
    python3 - "$out/metrics.jsonl" <<'PY' || fail "two target groups: wrong eval records"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ev = [r for r in recs if r.get("kind") == "eval"]
sp = [r for r in recs if r.get("kind") == "spec_eval"]
assert [r["step"] for r in ev] == [4, 8, 12] and all(r["eval_sequences"] == 7 for r in ev), ev
assert [r["step"] for r in sp] == [6, 12] and all(r["spec_prompts"] == 3 for r in sp), sp
print(f"held-out loss {[round(r['eval_loss'], 4) for r in ev]}, speculative tau {[round(r['spec_tau'], 4) for r in sp]}")
PY
    echo "PASS (groups)"
    ;;
  bad)
    cfg=("$src/mpi_launch/configs/tiny.yaml" --set "target.path=$tiny/target" --set "data.path=$tiny/train.h5"
         --set "run.out_dir=$work/bad")
    expect_error "eval.every is 10 but eval.data is empty: set eval.data" \
      "$mpirun_sh" -np 8 "$bin" "${cfg[@]}" --set eval.every=10
    expect_error "eval.spec_every is 5 but eval.prompts is empty: set eval.prompts" \
      "$mpirun_sh" -np 8 "$bin" "${cfg[@]}" --set eval.spec_every=5
    expect_error "eval.data = $work/none.h5: no such file" \
      "$mpirun_sh" -np 8 "$bin" "${cfg[@]}" --set eval.every=10 --set "eval.data=$work/none.h5"
    expect_error "eval.prompts = $work/none.h5: no such file" \
      "$bin" "${cfg[@]}" --check --set eval.spec_every=10 --set "eval.prompts=$work/none.h5"
    echo "PASS (bad)"
    ;;
  *) fail "unknown case" ;;
esac
