#!/usr/bin/env bash
# Speculative decoding with a trained tiny drafter, one ctest test per case (tests/integration/CMakeLists.txt).
#   spec_eval.sh BUILD_DIR SOURCE_DIR WORK_DIR CASE
# train    (fixture tiny_drafter) dflash_mpi trains the quickstart drafter (mpi_launch/configs/tiny.yaml) for
#          $STEPS steps on the tiny data and checkpoints at the end: WORK_DIR/run
# lossless spec_decode_check with that drafter at TP 1 and TP 5: output == greedy token for token, chain and tree
#          (budget 16, top-k 4; budget B-1 / top-k 1 == the chain); tau_tree is printed
# hybrid   spec_decode_check on a random hybrid target (DeltaNet rollback) at TP 1 and TP 5
# eval     dflash_eval on 16 prompts: a real speculative tau clearly above 1 (>= 1.3), printed next to the training
#          tau from metrics.jsonl; the JSON has every field; tau_tree (--tree-budget 16) reported with consistent
#          counts; the exported drafter gives the same tau; bad input fails
set -euo pipefail
build="$1" src="$2" work="$3" case="$4"
tiny="$build/tests/integration/tiny_data"
mpirun_sh="$src/tests/integration/mpirun.sh"
run="$work/run"
steps=${STEPS:-400}
fail() { echo "FAIL ($case): $*" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

case "$case" in
  train)
    rm -rf "$run"
    mkdir -p "$work"
    "$mpirun_sh" -np 8 "$build/apps/dflash_mpi" "$src/mpi_launch/configs/tiny.yaml" --set "target.path=$tiny/target" \
      --set "data.path=$tiny/train.h5" --set "run.out_dir=$run" --set run.steps=$steps --set log.every=50 \
      --set ckpt.every=$steps >"$work/train.log" 2>&1 || { tail -30 "$work/train.log"; fail "training failed"; }
    [[ -f "$run/ckpt/step_$(printf %08d $steps)/DONE" ]] || fail "no final checkpoint"
    tail -3 "$run/metrics.jsonl"
    echo "PASS (train)"
    ;;
  lossless)
    for np in 1 5; do
      "$mpirun_sh" -np $np "$build/tests/integration/spec_decode_check" --target "$tiny/target" \
        --prompts "$tiny/prompts.h5" --drafter "$run" --count 3 --max-new 40 --min-tau 1.3 --tree-budget 16 \
        --tree-topk 4 | tee "$work/lossless_$np.log"
      grep -q "TP $np (dense target): lossless for every proposer.*tree (budget 16, top-k 4) lossless.*drafter tau_tree" \
        "$work/lossless_$np.log" || fail "TP $np did not pass"
    done
    echo "PASS (lossless)"
    ;;
  eval)
    out="$work/eval"
    rm -rf "$out"
    mkdir -p "$out"
    "$build/apps/dflash_eval" --target "$tiny/target" --drafter "$run" --prompts "$tiny/prompts.h5" --limit 16 \
      --max-new-tokens 48 --out "$out/eval.json" --check-greedy --teacher-forced --tree-budget 16 | tee "$out/log"
    python3 - "$out/eval.json" <<'PY' || fail "eval.json is not what it should be"
import json, sys
j = json.load(open(sys.argv[1]))
for k in ("tau", "training_tau", "kept_histogram", "acceptance_by_position", "target_forwards_per_token",
          "tokens_per_second", "generated_tokens", "verify_forwards"):
    assert k in j, k
B = j["block_size"]
assert j["prompts"] == 16 and j["generated_tokens"] == 16 * 48, j
assert len(j["kept_histogram"]) == B + 1 and sum(j["kept_histogram"]) == j["verify_forwards"]
assert sum(k * n for k, n in enumerate(j["kept_histogram"])) + 16 == j["generated_tokens"]
assert abs(j["target_forwards_per_token"] - (j["verify_forwards"] + 16) / j["generated_tokens"]) < 1e-12
a = j["acceptance_by_position"]
assert len(a) == B - 1 and all(a[i] >= a[i + 1] for i in range(B - 2))
assert j["tau"] >= 1.3, f"speculative tau {j['tau']} is not clearly above 1"
# teacher forcing at the anchors speculative decoding visited keeps exactly what it kept (same drafts, same target)
assert abs(j["teacher_forced_tau_visited"] - j["tau"]) < 1e-12, (j["teacher_forced_tau_visited"], j["tau"])
assert j["teacher_forced_anchors"] == 16 * 47, j["teacher_forced_anchors"]
# tree verification (--tree-budget 16, top-k 4): the same tokens (checked by dflash_eval), counts that add up
assert j["tree_budget"] == 16 and j["tree_topk"] == 4
hist = j["kept_histogram_tree"]
assert len(hist) == B + 1 and sum(hist) == j["verify_forwards_tree"]
assert sum(k * n for k, n in enumerate(hist)) + 16 == j["generated_tokens"]
assert abs(j["target_forwards_per_token_tree"] - (j["verify_forwards_tree"] + 16) / j["generated_tokens"]) < 1e-12
assert B <= j["tree_nodes_per_verify"] <= 17, j["tree_nodes_per_verify"]
print(f"tau_tree {j['tau_tree']:.3f} (budget 16, top-k 4) vs tau {j['tau']:.3f}")
print(f"teacher-forced tau on the generated sequences {j['teacher_forced_tau']:.3f} (all anchors)")
print(f"speculative tau {j['tau']:.3f} vs training (teacher-forced) tau {j['training_tau']:.3f}")
PY
    grep -q "lossless: identical to greedy" "$out/log" || fail "no lossless line"
    # the exported drafter evaluates to the same tau (f32 export: the same weights)
    "$build/apps/dflash_data" export "$(ls -d "$run"/ckpt/step_* | tail -1)" "$out/export" --dtype f32 >/dev/null
    "$build/apps/dflash_eval" --target "$tiny/target" --drafter "$out/export" --prompts "$tiny/prompts.h5" \
      --limit 16 --max-new-tokens 48 --out "$out/export.json" | tee "$out/export.log"
    python3 -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); assert a["tau"]==b["tau"], (a["tau"], b["tau"])' \
      "$out/eval.json" "$out/export.json" || fail "the exported drafter gives a different tau"
    # TP 5 gives the same result
    "$mpirun_sh" -np 5 "$build/apps/dflash_eval" --target "$tiny/target" --drafter "$run" --prompts "$tiny/prompts.h5" \
      --limit 16 --max-new-tokens 48 --out "$out/tp5.json" >"$out/tp5.log" 2>&1 || { cat "$out/tp5.log"; fail "TP 5 failed"; }
    python3 -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:]); assert a["kept_histogram"]==b["kept_histogram"], (a, b)' \
      "$out/eval.json" "$out/tp5.json" || fail "TP 5 accepts differently from TP 1"
    # bad input: a folder that holds no drafter; a drafter for another target width
    rc=0; "$build/apps/dflash_eval" --target "$tiny/target" --drafter "$out" --prompts "$tiny/prompts.h5" >"$out/bad.log" 2>&1 || rc=$?
    [[ $rc -ne 0 ]] && grep -q "no complete checkpoint under" "$out/bad.log" || { cat "$out/bad.log"; fail "bad --drafter accepted"; }
    for bad in "--tree-budget 0:--tree-budget 0: must be >= 1" "--tree-topk 2:--tree-topk needs --tree-budget N" \
               "--device gpu:--device: gpu not in {cpu,cuda}" "--precision bf16:--precision bf16 with --device cpu" \
               "--device cuda --tree-budget 4:--tree-budget needs --device cpu"; do
      rc=0; "$build/apps/dflash_eval" --target "$tiny/target" --drafter "$run" --prompts "$tiny/prompts.h5" ${bad%%:*} \
        >"$out/bad.log" 2>&1 || rc=$?
      [[ $rc -ne 0 ]] && grep -q -- "${bad#*:}" "$out/bad.log" || { cat "$out/bad.log"; fail "'${bad%%:*}' accepted"; }
    done
    echo "PASS (eval)"
    ;;
  hybrid)
    # a Qwen3.5-style hybrid target (Gated DeltaNet layers: their state is restored and the kept inputs re-run
    # after every partial acceptance), untrained drafter + oracle / wrong stand-ins, TP 1 and TP 5
    rm -rf "$work/hybrid"
    "$build/apps/dflash_data" make-target --arch qwen3_5 --out "$work/hybrid/target" --hidden 64 --layers 8 --heads 10 \
      --kv-heads 2 --head-dim 16 --intermediate 128 --vocab 512 --linear-k-heads 4 --linear-v-heads 12 \
      --linear-k-dim 16 --linear-v-dim 16 --seed 5 >/dev/null
    for np in 1 5; do
      "$mpirun_sh" -np $np "$build/tests/integration/spec_decode_check" --target "$work/hybrid/target" \
        --prompts "$tiny/prompts.h5" --count 2 --max-new 30 --tree-budget 8 | tee "$work/hybrid_$np.log"
      grep -q "TP $np (hybrid target): lossless for every proposer" "$work/hybrid_$np.log" || fail "TP $np did not pass"
      grep -q "tree verification refused on the hybrid target" "$work/hybrid_$np.log" || fail "TP $np: tree not refused"
    done
    echo "PASS (hybrid)"
    ;;
  *) fail "unknown case" ;;
esac
