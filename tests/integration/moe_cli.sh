#!/usr/bin/env bash
# MoE targets end to end through the programs, one case per ctest test (tests/integration/CMakeLists.txt):
#   check_30b   dflash_mpi --check of mpi_launch/configs/qwen3_30b_a3b.yaml on the shipped config.json (no weights):
#               INCOMPLETE, exit 2; the plan shows 48 layers, H 2048, 32 Q / 4 KV heads, vocab 151936, taps
#               1,12,23,34,45, the drafter (5 layers, 32 Q / 4 KV x 128, I 6144, block 16: 304112896 parameters),
#               8 ranks, and the per-GPU memory plan's largest target shard 12.26 GB bf16 = the one this script
#               computes from the split (128 experts over TP 5: 26,26,26,25,25; Q heads 4,4,8,8,8), fits on H200
#   check_35b   the same for mpi_launch/configs/qwen3_6_35b_a3b.yaml (Qwen3_5MoeForConditionalGeneration): 40 layers,
#               H 2048, 16 Q / 2 KV heads, vocab 248320, taps 1,10,19,28,37; largest target shard 13.75 GB bf16 =
#               rank 0 computed here (52 of 256 experts, 4 key / 8 value DeltaNet heads, 3 Q heads, router 257 rows,
#               no shared-expert channels: the balanced split gives them to the lighter ranks)
#   eval_moe    a tiny random qwen3_moe target (tiny_moe.yaml's), its own regenerated data, 100 training steps with
#               mpi_launch/configs/tiny_moe.yaml (TP 5 + DP 3), then dflash_eval --check-greedy with tree verification:
#               lossless (chain and tree), tau and tau_tree in [1, block], tau > 1 (the trained drafter gets drafts
#               accepted); TP 5 accepts exactly as TP 1; spec_decode_check at TP 1 and 5 with that drafter and the
#               oracle / wrong / untrained proposers: lossless, exact acceptance counts, tree lossless and the
#               budget B-1 / top-k 1 tree == the chain
#   eval_moe35  the same with a tiny qwen3_5_moe target (Gated DeltaNet + routed and shared experts, fused layout),
#               40 steps: dflash_eval lossless chain decoding, tau in [1, block] (this random target is close to
#               uniform: tau stays ~1); --tree-budget refused; spec_decode_check at TP 1 and 5 (its oracle proposer
#               keeps whole blocks and then part of one: the DeltaNet rollback after a partial acceptance) lossless
#   bench       dflash_bench target --arch qwen3_moe|qwen3_5_moe at TP 1 and 2: the MoE columns (experts per rank
#               3,3 of 6; expert rows per forward, mean = S·k·MoE layers / TP exactly; the MLP share) are there
#   moe_cli.sh BUILD_DIR SOURCE_DIR WORK_DIR CASE      (the check cases use the dflash_tiny_data fixture's data)
set -euo pipefail
build="$1" src="$2" work="$3" case="$4"
bin="$build/apps/dflash_mpi"
d="$build/apps/dflash_data"
tiny="$build/tests/integration/tiny_data"
mpirun_sh="$src/tests/integration/mpirun.sh"
out="$work/$case"
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

fail() { echo "FAIL ($case): $*" >&2; exit 1; }
has() { grep -qF -- "$1" "$out/log" || fail "no '$1' in the output"; }

# dflash_mpi CONFIG --check without weights (run.device cuda: the per-GPU memory plan); must exit 2 (INCOMPLETE)
check_config() {
  local rc=0
  "$bin" "$1" --set "data.path=$tiny/train.h5" --set "run.out_dir=$out/run" --set run.device=cuda --check \
    >"$out/log" 2>&1 || rc=$?
  cat "$out/log"
  [[ $rc -eq 2 ]] || fail "--check without weights must exit 2 (INCOMPLETE), got $rc"
  has "check: INCOMPLETE"
  has "target weights NOT CHECKED (none present)"
  has "mpirun -np 8 (5 target TP x 1 groups + 3 drafter DP)"
  has "per-GPU memory (run.device cuda"
  has "fits on H200"
  [[ ! -d "$out/run" ]] || fail "--check must not write the run folder"
}

# the "weights (bf16)" GB of the memory plan's target shard
shard_gb() { sed -n 's/^ *weights (bf16) *\([0-9.]*\) GB$/\1/p' "$out/log" | head -1; }

# a tiny random MoE target (ARGS...), prompts and its own greedy data the way data/make_tiny.sh makes them
make_moe_pair() {
  "$d" make-target --out "$out/target" "$@" >/dev/null
  "$d" make-prompts --out "$out/prompts.h5" --vocab 512 --reserve 1 --count 64 --min-len 16 --max-len 48 --seed 1 \
    >/dev/null
  "$d" regenerate --target "$out/target" --prompts "$out/prompts.h5" --out "$out/train.h5" --max-new-tokens 48 \
    --vocab-limit 511 | tail -1
}

# STEPS of mpi_launch/configs/tiny_moe.yaml (TP 5 + DP 3) on that pair, a checkpoint at the end
train_tiny_moe() {
  "$mpirun_sh" -np 8 "$bin" "$src/mpi_launch/configs/tiny_moe.yaml" --set "target.path=$out/target" \
    --set "data.path=$out/train.h5" --set "run.out_dir=$out/run" --set run.steps=$1 --set log.every=$1 \
    --set ckpt.every=$1 >"$out/train.log" 2>&1 || { tail -30 "$out/train.log"; fail "training failed"; }
  [[ -f "$out/run/ckpt/step_$(printf %08d "$1")/DONE" ]] || fail "no final checkpoint"
  tail -1 "$out/run/metrics.jsonl" | cut -c1-160
}

# tau (and tau_tree when present) of an eval.json within [1, block]; prints them
tau_in_range() {
  python3 - "$1" <<'PY' || fail "tau outside [1, block] or counts that do not add up: $1"
import json, sys
j = json.load(open(sys.argv[1]))
B = j["block_size"]
assert j["lossless_checked"] is True, j
for k in ("tau", "tau_tree"):
    if k in j:
        assert 1.0 <= j[k] <= B, (k, j[k], B)
        print(f"{k} {j[k]:.3f} (block {B})")
hist = j["kept_histogram"]
assert sum(hist) == j["verify_forwards"] and sum(k * n for k, n in enumerate(hist)) + j["prompts"] == j["generated_tokens"]
PY
}

# spec_decode_check COUNT MAX_NEW KIND [ARGS...] at TP 1 and TP 5 with the trained drafter: lossless for every proposer
spec_check() {
  local count="$1" max_new="$2" kind="$3" np
  shift 3
  for np in 1 5; do
    "$mpirun_sh" -np $np "$build/tests/integration/spec_decode_check" --target "$out/target" \
      --prompts "$out/prompts.h5" --drafter "$out/run" --count "$count" --max-new "$max_new" "$@" >"$out/spec_$np.log" 2>&1 ||
      { cat "$out/spec_$np.log"; fail "spec_decode_check at TP $np failed"; }
    tail -1 "$out/spec_$np.log"
    grep -q "TP $np ($kind target): lossless for every proposer" "$out/spec_$np.log" || fail "TP $np: not lossless"
  done
}

case "$case" in
  check_30b)
    check_config "$src/mpi_launch/configs/qwen3_30b_a3b.yaml"
    has "48 layers, H 2048, 32 Q / 4 KV heads, vocab 151936; taps 1,12,23,34,45"
    has "experts        128 routed (top 8, width 768) in 48 of 48 layers; TP ranks hold 26,26,26,25,25"
    has "5 layers, 32 Q / 4 KV heads x 128, I 6144, block 16: 304112896 parameters"
    # the largest target shard from the split: experts shard_range(128, 1, 5, r), one KV head a rank (4 KV < TP 5:
    # Q heads 4,4,8,8,8), per layer q/o 2·q·128·H, k/v 2·128·H, router E·H, experts e·3·768·H; 48 layers, bf16
    want=$(awk 'BEGIN { H = 2048; split("26 26 26 25 25", e); split("4 4 8 8 8", q); best = 0
                        for (r = 1; r <= 5; ++r) {
                          w = 48 * (2 * q[r] * 128 * H + 2 * 128 * H + 128 * H + e[r] * 3 * 768 * H)
                          if (w > best) best = w }
                        printf "%.2f", best * 2 / 1e9 }')
    got=$(shard_gb)
    echo "largest target shard: ${got} GB printed, ${want} GB from 26 experts + 8 Q heads (rank 2)"
    [[ "$got" == "$want" ]] || fail "target shard ${got} GB, expected ${want} GB (26,26,26,25,25 experts a rank)"
    echo "PASS (check_30b)"
    ;;
  check_35b)
    check_config "$src/mpi_launch/configs/qwen3_6_35b_a3b.yaml"
    has "40 layers, H 2048, 16 Q / 2 KV heads, vocab 248320; taps 1,10,19,28,37"
    has "experts        256 routed (top 8, width 512, shared expert 512) in 40 of 40 layers; TP ranks hold 52,51,51,51,51"
    has "5 layers, 32 Q / 4 KV heads x 128, I 6144, block 16: 304112896 parameters"
    # rank 0: experts [0,52) of 256 (52,51,51,51,51), DeltaNet key heads [0,4) of 16 with value heads [0,8) of 32
    # (dk = dv = 128: in_proj_qkv 2·4·128 + 8·128 rows, z 8·128, b and a 8, out_proj 8·128 columns) in 30 layers,
    # Q heads [0,3) of KV head 0 (2 KV < TP 5: Q heads 3,3,2,4,4; q_proj 2·q·256 rows with the gate) in 10 layers,
    # router 256 + 1 (the shared expert's gate) rows in 40 layers; bf16. It is the largest shard even if every
    # shared-expert channel went to another rank (512 · 3 · H · 40 = 0.13 G weights < its 0.19 G lead over rank 1).
    want=$(awk 'BEGIN { H = 2048
                        experts = 40 * 52 * 3 * 512 * H; router = 40 * 257 * H
                        delta = 30 * H * ((2 * 4 * 128 + 8 * 128) + 8 * 128 + 2 * 8 + 8 * 128)
                        attn = 10 * H * (2 * 3 * 256 + 2 * 256 + 3 * 256)
                        printf "%.2f", (experts + router + delta + attn) * 2 / 1e9 }')
    got=$(shard_gb)
    echo "largest target shard: ${got} GB printed, ${want} GB from rank 0's 52 experts, 8 value heads, 3 Q heads"
    [[ "$got" == "$want" ]] || fail "target shard ${got} GB, expected ${want} GB (52,51,51,51,51 experts a rank)"
    echo "PASS (check_35b)"
    ;;
  eval_moe)
    # tiny_moe.yaml's target: 8 layers, H 64, 16 Q / 8 KV heads, 6 experts top 2 (TP 5: 2,1,1,1,1), layer 0 dense
    make_moe_pair --arch qwen3_moe --hidden 64 --layers 8 --heads 16 --kv-heads 8 --head-dim 16 --intermediate 128 \
      --vocab 512 --experts 6 --experts-per-tok 2 --moe-intermediate 48 --mlp-only-layers 0 --seed 5
    train_tiny_moe 100
    e="$build/apps/dflash_eval"
    "$e" --target "$out/target" --drafter "$out/run" --prompts "$out/prompts.h5" --limit 8 --max-new-tokens 32 \
      --check-greedy --tree-budget 12 --tree-topk 3 --out "$out/eval.json" | tee "$out/log"
    has "lossless: identical to greedy"
    has "eval: tau_tree"
    tau_in_range "$out/eval.json"
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["tau"] > 1, j["tau"]' "$out/eval.json" ||
      fail "the trained drafter got no draft token accepted (tau 1)"
    # TP 5 (experts 2,1,1,1,1 a rank): the same acceptance, chain and tree, token for token checked again
    "$mpirun_sh" -np 5 "$e" --target "$out/target" --drafter "$out/run" --prompts "$out/prompts.h5" --limit 8 \
      --max-new-tokens 32 --check-greedy --tree-budget 12 --tree-topk 3 --out "$out/tp5.json" >"$out/tp5.log" 2>&1 ||
      { cat "$out/tp5.log"; fail "TP 5 eval failed"; }
    grep -q "(TP 5)" "$out/tp5.log" || fail "the eval did not run on TP 5"
    python3 -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
for k in ("kept_histogram", "kept_histogram_tree"):
    assert a[k] == b[k], (k, a[k], b[k])' "$out/eval.json" "$out/tp5.json" || fail "TP 5 accepts differently from TP 1"
    spec_check 3 40 "dense" --tree-budget 12 --tree-topk 3
    grep -q "tree (budget 12, top-k 3) lossless" "$out/spec_5.log" || fail "tree verification not checked"
    echo "PASS (eval_moe)"
    ;;
  eval_moe35)
    # a Qwen3.5/3.6 MoE hybrid: 8 layers (DeltaNet ×3 + full attention) ×2, 10 Q / 2 KV heads, 4 key / 12 value
    # DeltaNet heads, 6 experts top 2 + a shared expert of 64 in every layer, experts fused as the released BF16 ones
    make_moe_pair --arch qwen3_5_moe --hidden 64 --layers 8 --heads 10 --kv-heads 2 --head-dim 16 --vocab 512 \
      --linear-k-heads 4 --linear-v-heads 12 --linear-k-dim 16 --linear-v-dim 16 --experts 6 --experts-per-tok 2 \
      --moe-intermediate 48 --shared-intermediate 64 --expert-layout fused --seed 5
    train_tiny_moe 40
    e="$build/apps/dflash_eval"
    "$e" --target "$out/target" --drafter "$out/run" --prompts "$out/prompts.h5" --limit 6 --max-new-tokens 32 \
      --check-greedy --out "$out/eval.json" | tee "$out/log"
    has "lossless: identical to greedy"
    tau_in_range "$out/eval.json"
    rc=0
    "$e" --target "$out/target" --drafter "$out/run" --prompts "$out/prompts.h5" --limit 1 --tree-budget 4 \
      >"$out/tree.log" 2>&1 || rc=$?
    [[ $rc -ne 0 ]] && grep -q "Gated DeltaNet" "$out/tree.log" || { cat "$out/tree.log"; fail "tree not refused"; }
    spec_check 2 30 "hybrid" --tree-budget 8
    grep -q "tree verification refused on the hybrid target" "$out/spec_5.log" || fail "spec_decode_check: tree not refused"
    echo "PASS (eval_moe35)"
    ;;
  bench)
    b="$build/apps/dflash_bench"
    tiny_size=(--tp 1,2 --seq 32,64 --hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 16 --vocab 256 --reps 1
               --experts 6 --experts-per-tok 2 --moe-intermediate 32)
    cell='[0-9.]+ \([0-9.]+, [0-9.]+\)'
    # qwen3_moe, layer 0 dense: 3 MoE layers, mean rows a rank at TP 2, S 64 = 64 · 2 · 3 / 2 = 192
    "$mpirun_sh" -np 2 "$b" target --arch qwen3_moe "${tiny_size[@]}" --intermediate 128 --mlp-only-layers 0 \
      | tee "$out/log"
    has "experts in 3 of 4 layers: 6 experts, top 2, width 32"
    grep -Eq "^\| 2 \| 64 \| 2,2 \| [0-9]+ \| .* \| — \| $cell \| $cell \| .* \| 3,3 \| [0-9]+ / 192 \([0-9.]+\) \| [0-9]+% \|$" \
      "$out/log" || fail "no qwen3_moe TP 2 row with experts 3,3 and 192 mean rows"
    grep -Eq "^\| 1 \| 64 \| 4 \| .* \| 6 \| 384 / 384 \(1.00\) \| [0-9]+% \|$" "$out/log" ||
      fail "no qwen3_moe TP 1 row with all 384 rows on one rank"
    # qwen3_5_moe: experts in all 4 layers, mean rows at TP 2, S 64 = 64 · 2 · 4 / 2 = 256
    "$mpirun_sh" -np 2 "$b" target --arch qwen3_5_moe "${tiny_size[@]}" --linear-k-heads 2 --linear-v-heads 4 \
      --linear-k-dim 16 --linear-v-dim 16 --shared-intermediate 64 | tee "$out/log"
    has "experts in 4 of 4 layers: 6 experts, top 2, width 32 (renormalised), shared expert 64"
    grep -Eq "^\| 2 \| 64 \| 2,2 \| [0-9]+ \| .* \| $cell \| $cell \| $cell \| .* \| 3,3 \| [0-9]+ / 256 \([0-9.]+\) \| [0-9]+% \|$" \
      "$out/log" || fail "no qwen3_5_moe TP 2 row with experts 3,3 and 256 mean rows"
    echo "PASS (bench)"
    ;;
  *) fail "unknown case" ;;
esac
