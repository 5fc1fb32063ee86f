#!/usr/bin/env bash
# Throughput of the whole job (8 ranks: 5 target TP + 3 drafter DP) on this machine, for two CPU configs:
#   tiny   the quickstart (mpi_launch/configs/tiny.yaml on data/make_tiny.sh's target and data)
#   larger target H 256, 8 layers, 16/8 heads, I 768, vocab 8192; drafter 2 layers, B 16; 48 random
#          sequences of 256 tokens (32-token prompt unscored), 32 anchors per sequence
# Prints drafter tokens/s, target tokens/s and the drafter's share of time waiting for features.
#   usage: mpi_launch/bench_trainer.sh [BUILD_DIR] [WORK_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}" work="${2:-$root/runs/bench}"
data_bin="$build/apps/dflash_data"
mkdir -p "$work"
[[ -f "$work/tiny_data/train.h5" ]] || bash "$root/data/make_tiny.sh" "$build" "$work/tiny_data" >/dev/null
if [[ ! -f "$work/larger/train.h5" ]]; then
  "$data_bin" make-target --out "$work/larger/target" --hidden 256 --layers 8 --heads 16 --kv-heads 8 \
    --head-dim 16 --intermediate 768 --vocab 8192 --seed 2 >/dev/null
  awk 'BEGIN { srand(7); for (s = 0; s < 48; ++s) { printf "{\"input_ids\": ["; for (i = 0; i < 256; ++i)
         printf "%s%d", (i ? ", " : ""), int(rand() * 8191); printf "], \"loss_mask\": [";
         for (i = 0; i < 256; ++i) printf "%s%d", (i ? ", " : ""), (i >= 32); print "]}" } }' >"$work/larger/train.jsonl"
  "$data_bin" import-jsonl "$work/larger/train.jsonl" "$work/larger/train.h5" --vocab 8192 >/dev/null
fi

run() {  # name, extra --set args...
  local name="$1"; shift
  rm -rf "$work/$name/run"
  DFLASH_BIN="$build/apps/dflash_mpi" bash "$root/mpi_launch/run_local.sh" -np 8 "$root/mpi_launch/configs/tiny.yaml" \
    --set "run.out_dir=$work/$name/run" "$@" >"$work/$name/run.log" 2>&1
  local last target_tps
  last=$(tail -n 1 "$work/$name/run/metrics.jsonl")
  target_tps=$(grep -h "tok/s" "$work/$name/run/logs/rank_00.log" | tail -n 1 | sed 's/.*| \([0-9]*\) tok\/s.*/\1/')
  echo "$name | $(sed 's/.*"tokens_per_s":\([0-9.e+-]*\).*/\1/' <<<"$last" | cut -d. -f1) | $target_tps |" \
       "$(sed 's/.*"wait_share":\([0-9.e+-]*\).*/\1/' <<<"$last" | awk '{printf "%.0f%%", 100 * $1}') |" \
       "$(sed 's/.*"compute_share":\([0-9.e+-]*\).*/\1/' <<<"$last" | awk '{printf "%.0f%%", 100 * $1}')"
}

echo "config | drafter tok/s (all 3 ranks) | target tok/s (one TP group) | drafter waiting | drafter computing"
run tiny_data --set "target.path=$work/tiny_data/target" --set "data.path=$work/tiny_data/train.h5" \
  --set run.steps=120 --set log.every=60
run larger --set "target.path=$work/larger/target" --set "data.path=$work/larger/train.h5" --set run.steps=16 \
  --set log.every=8 --set drafter.block_size=16 --set drafter.mask_token_id=8191 --set loss.anchors_per_seq=32 \
  --set drafter.heads=8 --set drafter.kv_heads=4 --set drafter.head_dim=32 --set drafter.intermediate=768 \
  --set data.epochs=1 --set optim.micro_batches=1
