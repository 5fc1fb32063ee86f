#!/usr/bin/env bash
# dflash_mpi with a Qwen3.5-style hybrid target (mpi_launch/configs/tiny_hybrid.yaml), one case per ctest test:
#   learns  8 ranks (TP 5 + DP 3), 30 steps: the mean loss of steps 21-30 is ≥ 5% below that of steps 1-10
#   check   --check of mpi_launch/configs/qwen3_6_27b.yaml with the shipped target config.json: the plan of the 27B
#           run printed without its weights
#   regenerate  dflash_data regenerate with a random hybrid target: TP 1 and TP 3 write the same sequences
#   bad     user errors (unknown --arch, value heads not a multiple of key heads, a yarn rope config, TP above the
#           DeltaNet value heads) exit non-zero with a message naming them
# Uses the tiny data of the dflash_tiny_data fixture (data/make_tiny.sh).
#   hybrid_trainer_cli.sh BUILD_DIR SOURCE_DIR WORK_DIR CASE
set -euo pipefail
build="$1" src="$2" work="$3" case="$4"
bin="$build/apps/dflash_mpi"
tiny="$build/tests/integration/tiny_data"
mpirun_sh="$src/tests/integration/mpirun.sh"
out="$work/$case"
rm -rf "$out"
mkdir -p "$out"

fail() { echo "FAIL ($case): $*" >&2; exit 1; }
losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1"; }

case "$case" in
  learns)
    "$build/apps/dflash_data" make-target --arch qwen3_5 --out "$out/target" --hidden 64 --layers 8 --heads 10 \
      --kv-heads 2 --head-dim 16 --intermediate 128 --vocab 512 --linear-k-heads 4 --linear-v-heads 12 \
      --linear-k-dim 16 --linear-v-dim 16 --seed 5
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny_hybrid.yaml" --set "target.path=$out/target" \
      --set "data.path=$tiny/train.h5" --set "run.out_dir=$out/run" --set run.steps=30 --set log.every=10 \
      | tee "$out/log"
    mapfile -t l < <(losses "$out/run/metrics.jsonl")
    [[ ${#l[@]} -eq 3 ]] || fail "expected 3 metrics records, got ${#l[@]}"
    echo "mean loss of steps 1-10: ${l[0]}; 11-20: ${l[1]}; 21-30: ${l[2]}"
    awk -v a="${l[0]}" -v b="${l[2]}" 'BEGIN { exit !(b < 0.95 * a) }' || fail "loss ${l[2]} is not 5% below ${l[0]}"
    [[ -f "$out/run/drafter_final.safetensors" ]] || fail "no final weights"
    echo "PASS (learns)"
    ;;
  moe_learns)
    # mpi_launch/configs/tiny_moe.yaml as its header says: a random Qwen3-MoE target (6 experts top-2 over TP 5:
    # 2,1,1,1,1 a rank; layer 0 dense), the drafter learns from its taps
    "$build/apps/dflash_data" make-target --arch qwen3_moe --out "$out/target" --hidden 64 --layers 8 --heads 16 \
      --kv-heads 8 --head-dim 16 --intermediate 128 --vocab 512 --experts 6 --experts-per-tok 2 \
      --moe-intermediate 48 --mlp-only-layers 0 --seed 5
    "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny_moe.yaml" --set "target.path=$out/target" \
      --set "data.path=$tiny/train.h5" --set "run.out_dir=$out/run" --set run.steps=30 --set log.every=10 \
      | tee "$out/log"
    mapfile -t l < <(losses "$out/run/metrics.jsonl")
    [[ ${#l[@]} -eq 3 ]] || fail "expected 3 metrics records, got ${#l[@]}"
    echo "mean loss of steps 1-10: ${l[0]}; 11-20: ${l[1]}; 21-30: ${l[2]}"
    awk -v a="${l[0]}" -v b="${l[2]}" 'BEGIN { exit !(b < 0.95 * a) }' || fail "loss ${l[2]} is not 5% below ${l[0]}"
    echo "PASS (moe_learns)"
    ;;
  check)
    # no weights: the shipped config.json is all --check needs to print the plan (the tiny data stands in for the
    # data); the result is INCOMPLETE with exit code 2, never OK
    set +e
    "$bin" "$src/mpi_launch/configs/qwen3_6_27b.yaml" --set "target.path=$src/mpi_launch/configs/qwen3_6_27b_target" \
      --set "data.path=$tiny/train.h5" --set "run.out_dir=$out/run" --set run.device=cuda --check > "$out/log" 2>&1
    rc=$?
    set -e
    cat "$out/log"
    [[ $rc -eq 2 ]] || fail "--check without weights must exit 2 (INCOMPLETE), got $rc"
    grep -q "check: INCOMPLETE" "$out/log" || fail "no 'check: INCOMPLETE'"
    grep -q "target weights NOT CHECKED" "$out/log" || fail "no 'NOT CHECKED' line"
    grep -q "64 layers, H 5120, 24 Q / 4 KV heads, vocab 248320; taps 1,16,31,46,61" "$out/log" ||
      fail "the plan does not show the 27B target"
    grep -q "5 layers, 32 Q / 8 KV heads x 128, I 17408, block 16" "$out/log" || fail "wrong drafter shape"
    grep -q "mpirun -np 8 (5 target TP x 1 groups + 3 drafter DP)" "$out/log" || fail "no rank count"
    grep -q "weights (bf16)  *9.84 GB" "$out/log" || fail "wrong target shard size"
    grep -q "per-GPU memory (run.device cuda" "$out/log" || fail "no per-GPU memory plan"
    grep -q "fits on H200" "$out/log" || fail "the memory plan does not show the H200 verdict"
    grep -q "pipeline balance (predicted" "$out/log" || fail "no pipeline-balance prediction"
    grep -q "^    h200  *target .* s a sequence" "$out/log" || fail "no H200 row in the balance table"
    grep -q "^    rtx-pro-6000  *target .* delta rule chunk-parallel" "$out/log" ||
      fail "the RTX PRO 6000 row does not name its delta-rule kernel"
    [[ ! -d "$out/run" ]] || fail "--check must not write the run folder"
    echo "PASS (check)"
    ;;
  regenerate)
    # dflash_data regenerate with a hybrid target: TP 1 and TP 3 (DeltaNet key heads replicated) write the same data
    d="$build/apps/dflash_data"
    "$d" make-target --arch qwen3_5 --out "$out/target" --hidden 32 --layers 4 --heads 6 --kv-heads 2 --head-dim 16 \
      --intermediate 64 --vocab 128 --linear-k-heads 2 --linear-v-heads 4 --seed 9
    "$d" make-prompts --out "$out/prompts.h5" --vocab 128 --count 4 --min-len 3 --max-len 20 --seed 3
    "$d" regenerate --target "$out/target" --prompts "$out/prompts.h5" --out "$out/tp1.h5" --max-new-tokens 10 \
      | tee "$out/log1"
    "$mpirun_sh" -np 3 "$d" regenerate --target "$out/target" --prompts "$out/prompts.h5" --out "$out/tp3.h5" \
      --max-new-tokens 10 | tee "$out/log3"
    grep -q "on TP 3," "$out/log3" || fail "regenerate did not run on TP 3"
    for i in 0 1 2 3; do
      a="$("$d" inspect "$out/tp1.h5" --seq $i | tail -n 3)" b="$("$d" inspect "$out/tp3.h5" --seq $i | tail -n 3)"
      [[ "$a" == "$b" ]] || fail "sequence $i differs between TP 1 and TP 3: $a / $b"
    done
    "$d" inspect "$out/tp1.h5" | tee "$out/inspect"
    grep -q "(40 of 92)" "$out/inspect" || fail "expected 10 generated tokens for each of the 4 prompts"
    echo "PASS (regenerate)"
    ;;
  bad)
    # user errors name the option, file or key and exit non-zero
    d="$build/apps/dflash_data"
    expect_error() {
      local pattern="$1"; shift
      local rc=0
      timeout 30 "$@" >"$out/log" 2>&1 || rc=$?
      cat "$out/log"
      [[ $rc -ne 0 && $rc -ne 124 ]] || fail "exit $rc: expected an error exit"
      grep -q -- "$pattern" "$out/log" || fail "no message matching '$pattern'"
    }
    expect_error "--arch must be qwen3 (dense), qwen3_5 (Qwen3.5/3.6 hybrid), qwen3_moe" "$d" make-target --arch qwen4 \
      --out "$out/t0"
    expect_error "linear_num_value_heads 5 is not a multiple of linear_num_key_heads 2" \
      "$d" make-target --arch qwen3_5 --out "$out/t1" --linear-k-heads 2 --linear-v-heads 5
    # a hybrid target whose config asks for yarn RoPE is refused by the trainer's --check, naming the file
    "$d" make-target --arch qwen3_5 --out "$out/yarn" --hidden 32 --layers 4 --heads 10 --kv-heads 2 --vocab 512 \
      --linear-k-heads 4 --linear-v-heads 12 >/dev/null
    sed -i 's/"rope_type": "default"/"rope_type": "yarn"/' "$out/yarn/config.json"
    expect_error "yarn/config.json: rope_parameters.rope_type \"yarn\" is not supported" \
      "$bin" "$src/mpi_launch/configs/tiny_hybrid.yaml" --set "target.path=$out/yarn" --set "data.path=$tiny/train.h5" \
      --check
    # TP 5 over a hybrid with 4 DeltaNet value heads: no value head for one rank
    "$d" make-target --arch qwen3_5 --out "$out/few" --hidden 32 --layers 8 --heads 10 --kv-heads 2 --vocab 512 \
      --linear-k-heads 2 --linear-v-heads 4 >/dev/null
    expect_error "exceeds linear_num_value_heads 4" "$mpirun_sh" -np 8 "$bin" \
      "$src/mpi_launch/configs/tiny_hybrid.yaml" --set "target.path=$out/few" --set "data.path=$tiny/train.h5" \
      --set "run.out_dir=$out/run"
    echo "PASS (bad)"
    ;;
  *) fail "unknown case" ;;
esac
