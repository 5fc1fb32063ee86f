#!/usr/bin/env bash
# The tiny recipe: a random Qwen3 target and target-regenerated training data for it, small enough for a laptop
# (about 13 s on 2 cores). Usage: data/make_tiny.sh BUILD_DIR OUT_DIR
#   OUT_DIR/target/     random Qwen3 target: H 64, 8 layers, 16 Q / 8 KV heads × 16, intermediate 128, vocab 512,
#                       f32, untied, seed 1 (TP 5 splits its 8 KV groups [2,2,2,1,1])
#   OUT_DIR/prompts.h5  64 random prompts, 16–48 tokens, ids in [0, 511) (511 = the drafter's mask token)
#   OUT_DIR/train.h5    each prompt (loss_mask 0) + 48 greedy target tokens (loss_mask 1), ids < 511
# Drafter config to match: vocab 512, hidden 64, mask_token_id 511, num_target_layers 8, with 5 taps the default
# target_layer_ids round(1 + i*(8-4)/4) = [1, 2, 3, 4, 5].
# DFLASH_TINY_LAUNCH="tests/integration/mpirun.sh -np 5" (for example) runs regenerate as one TP group of 5 ranks.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
build="$1" out="$2"
bin="$build/apps/dflash_data"
[[ -x "$bin" ]] || { echo "$0: $bin not found; build first: cmake --build $build --target dflash_data" >&2; exit 1; }
mkdir -p "$out"
read -r -a launch <<<"${DFLASH_TINY_LAUNCH:-}"
# tiny GEMMs: more threads than one only add synchronisation
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

start=$SECONDS
"$bin" make-target --out "$out/target" --hidden 64 --layers 8 --heads 16 --kv-heads 8 --head-dim 16 \
  --intermediate 128 --vocab 512 --seed 1
"$bin" make-prompts --out "$out/prompts.h5" --vocab 512 --reserve 1 --count 64 --min-len 16 --max-len 48 --seed 1
"${launch[@]}" "$bin" regenerate --target "$out/target" --prompts "$out/prompts.h5" --out "$out/train.h5" \
  --max-new-tokens 48 --vocab-limit 511
"$bin" inspect "$out/train.h5" --vocab 511
echo "tiny data ready in $out ($((SECONDS - start)) s): target/ and train.h5 (mask_token_id 511, vocab 512)"
