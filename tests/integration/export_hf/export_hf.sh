#!/usr/bin/env bash
# The one export (docs/export.md), one case per ctest test:
#   cli           dflash_mpi --export and dflash_data export are one command: a run folder exports its newest complete
#                 checkpoint (an interrupted newer save skipped), --best its ckpt/best, a step folder and an exported
#                 folder themselves; both commands write byte-identical folders and print the same messages; the
#                 target facts come from the checkpoint or the options; OUT_DIR holding anything but a previous
#                 export is refused naming it, and nothing in it changes; clear messages for every wrong SOURCE.
#   transformers  the export loads with AutoModel.from_pretrained(dir, trust_remote_code=True) and computes the C++
#                 forward (test_export_hf.py lists what it asserts and the bounds). Needs a Python with torch +
#                 transformers: DFLASH_EXPORT_HF_PYTHON, else data/prep/.venv-serve (bash mpi_launch/install_prep.sh
#                 --serve, which mpi_launch/test.sh runs); exit 77 (skipped) only when neither exists.
# No training: drafter_forward_dump make-runs writes the run folders (random drafters).
#   export_hf.sh BUILD_DIR SOURCE_DIR WORK_DIR CASE
set -euo pipefail
build="$1" src="$2" work="$3" case="$4"
mpi="$build/apps/dflash_mpi"
data="$build/apps/dflash_data"
dump="$build/tests/integration/drafter_forward_dump"
compare="$build/tests/integration/safetensors_compare"
out="$work/$case"
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

fail() { echo "FAIL ($case): $*" >&2; exit 1; }

# expect_error PATTERN CMD...: CMD fails with a message matching PATTERN; the message (without the program's
# "PROGRAM: error: " prefix, the program's name as EXPORT) is left in $out/message
expect_error() {
  local pattern="$1"; shift
  local rc=0
  "$@" >"$out/log" 2>&1 || rc=$?
  cat "$out/log"
  [[ $rc -ne 0 ]] || fail "'$*' exited 0, expected an error matching '$pattern'"
  grep -q -- "$pattern" "$out/log" || fail "'$*': no message matching '$pattern'"
  ! grep -q '\.\(cpp\|h\):[0-9]' "$out/log" || fail "'$*': the message carries a source location"
  sed 's/^dflash_mpi --export: error: //; s/^dflash_data export: error: //; s/dflash_mpi --export/EXPORT/g;
       s/dflash_data export/EXPORT/g' "$out/log" >"$out/message"
}

# both_fail PATTERN ARGS...: dflash_mpi --export ARGS and dflash_data export ARGS fail with the same message
both_fail() {
  local pattern="$1"; shift
  expect_error "$pattern" "$mpi" --export "$@"
  cp "$out/message" "$out/message.mpi"
  expect_error "$pattern" "$data" export "$@"
  cmp -s "$out/message" "$out/message.mpi" || fail "the two commands word the error differently"
}

same_weights() { "$compare" "$1/model.safetensors" "$2/model.safetensors" --rtol 0 >/dev/null; }
same_folder() {
  for f in model.safetensors config.json modeling_dflash.py; do
    cmp -s "$1/$f" "$2/$f" || fail "$1/$f and $2/$f differ"
  done
  [[ $(ls "$1" | wc -l) -eq 3 ]] || fail "$1 holds more than the three files: $(ls "$1")"
}

"$dump" make-runs "$out" >/dev/null
run="$out/run"

case "$case" in
  cli)
    # a run folder: its newest complete checkpoint (step 5; step 9 has no DONE), from both commands alike
    "$mpi" --export "$run" "$out/e_mpi" --dtype f32 | tee "$out/log.mpi"
    grep -q "newest complete checkpoint .*step_00000005, step 5" "$out/log.mpi" || fail "the run folder did not export step 5"
    "$data" export "$run" "$out/e_data" --dtype f32 | tee "$out/log.data"
    same_folder "$out/e_mpi" "$out/e_data"
    diff <(sed "s#e_mpi#OUT#g" "$out/log.mpi") <(sed "s#e_data#OUT#g" "$out/log.data") ||
      fail "the two commands print different summaries"
    same_weights "$out/e_mpi" "$run/ckpt/step_00000005" || fail "the run folder's export is not step 5's weights"
    ! same_weights "$out/e_mpi" "$run/ckpt/step_00000002" || fail "step 2 and step 5 have the same weights"
    grep -q '"AutoModel": "modeling_dflash.DFlashDraftModel"' "$out/e_mpi/config.json" || fail "config.json lacks auto_map"
    grep -q '"architectures"' "$out/e_mpi/config.json" || fail "config.json lacks architectures"
    cmp -s "$out/e_mpi/modeling_dflash.py" "$src/lib/model/modeling_dflash.py" ||
      fail "modeling_dflash.py is not lib/model/modeling_dflash.py"
    echo "ok: run folder -> step 5, both commands byte-identical"

    # --best: ckpt/best (step 3); a step folder (the README's form); an exported folder re-exported as bf16 equals
    # the bf16 export of its source
    "$mpi" --export "$run" "$out/best" --best --dtype f32 | grep -q "best checkpoint, step 3" || fail "--best"
    same_weights "$out/best" "$run/ckpt/best" || fail "--best did not export ckpt/best"
    "$data" export "$run" "$out/best_data" --best --dtype f32 >/dev/null
    same_folder "$out/best" "$out/best_data"
    "$mpi" --export "$run/ckpt/step_00000002" "$out/step2" --dtype f32 | grep -q "(step 2)" || fail "step folder"
    same_weights "$out/step2" "$run/ckpt/step_00000002" || fail "the step folder's export is not its weights"
    "$mpi" --export "$run" "$out/bf16" >/dev/null  # bf16 is the default
    grep -q '"dtype": "bfloat16"' "$out/bf16/config.json" || fail "the default dtype is not bf16"
    "$data" export "$out/e_mpi" "$out/re_bf16" | grep -q "the exported drafter" || fail "exported folder as SOURCE"
    same_folder "$out/bf16" "$out/re_bf16"
    echo "ok: --best, step folder, exported folder"

    # the target facts: a checkpoint without them needs the options; options override recorded ones
    both_fail "num_target_layers must be positive.*--target-layer-ids" "$out/legacy" "$out/legacy_e"
    [[ ! -e "$out/legacy_e" ]] || fail "a refused export left $out/legacy_e"
    "$mpi" --export "$out/legacy" "$out/legacy_e" --target-layer-ids 1,4,6 --num-target-layers 8 \
      --max-position-embeddings 4096 | grep -q "target layers \[1, 4, 6\] of 8" || fail "the options as facts"
    "$data" export "$run" "$out/over" --num-target-layers 12 | grep -q "target layers \[1, 4, 6\] of 12" ||
      fail "--num-target-layers does not override the recorded value"
    both_fail "target_layer_ids \[1, 2\] for a drafter with n_taps=3" "$run" "$out/bad_ids" --target-layer-ids 1,2
    both_fail "'1,x' is not a comma-separated list" "$run" "$out/bad_ids" --target-layer-ids 1,x
    echo "ok: target facts from the checkpoint, the options, or refused"

    # SOURCE: no complete checkpoint, --best without ckpt/best, not a drafter folder, missing
    both_fail "a run folder without a complete checkpoint: .*step_00000004 without DONE" "$out/no_ckpt" "$out/x"
    both_fail "ckpt/best does not exist" "$out/legacy" "$out/x" --best
    both_fail "--best takes a run folder" "$run/ckpt/step_00000005" "$out/x" --best
    mkdir -p "$out/not_a_run"
    both_fail "not a run folder (no ckpt/), a checkpoint step folder" "$out/not_a_run" "$out/x"
    both_fail "not a directory" "$out/missing" "$out/x"
    both_fail "step_00000009: a checkpoint without DONE" "$run/ckpt/step_00000009" "$out/x"
    [[ ! -e "$out/x" ]] || fail "a refused export created OUT_DIR"
    echo "ok: wrong SOURCE folders, each with its message"

    # OUT_DIR: a previous export is replaced; anything else is refused naming it, and left as it was
    "$mpi" --export "$run/ckpt/step_00000002" "$out/e_mpi" --dtype f32 >/dev/null
    same_weights "$out/e_mpi" "$run/ckpt/step_00000002" || fail "a previous export was not replaced"
    mkdir -p "$out/foreign"
    echo "notes" >"$out/foreign/notes.txt"
    both_fail "OUT_DIR $out/foreign holds notes.txt, which an export did not write" "$run" "$out/foreign"
    [[ $(ls "$out/foreign") == notes.txt && $(cat "$out/foreign/notes.txt") == notes ]] || fail "foreign/ changed"
    mkdir -p "$out/target_like"
    echo '{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 32}' >"$out/target_like/config.json"
    cp "$run/ckpt/step_00000002/model.safetensors" "$out/target_like/"
    both_fail 'config.json (architectures is not \["DFlashDraftModel"\])' "$run" "$out/target_like"
    grep -q Qwen3ForCausalLM "$out/target_like/config.json" || fail "target_like/config.json changed"
    mkdir -p "$out/extra_key"
    sed 's/"block_size"/"my_note": 1, "block_size"/' "$out/best/config.json" >"$out/extra_key/config.json"
    both_fail "key 'my_note' is not one an export writes" "$run" "$out/extra_key"
    mkdir -p "$out/weights_only"
    cp "$run/ckpt/step_00000002/model.safetensors" "$out/weights_only/"
    both_fail "model.safetensors (no config.json or modeling_dflash.py of an export beside it)" "$run" "$out/weights_only"
    mkdir -p "$out/sub/ckpt"
    both_fail "holds ckpt/" "$run" "$out/sub"
    both_fail "is .*step_00000005 or inside it" "$run" "$run/ckpt/step_00000005/export"
    both_fail "OUT_DIR $out/e_mpi is $out/e_mpi or inside it" "$out/e_mpi" "$out/e_mpi"
    touch "$out/a_file"
    both_fail "exists and is not a directory" "$run" "$out/a_file"
    # an interrupted export (modeling file and weights, no config.json yet) is ours: a new export replaces it
    mkdir -p "$out/interrupted"
    cp "$out/best/modeling_dflash.py" "$out/best/model.safetensors" "$out/interrupted/"
    "$data" export "$run" "$out/interrupted" --dtype f32 >/dev/null
    same_folder "$out/interrupted" "$out/e_data"
    echo "ok: OUT_DIR guard"

    # usage: the same options and messages
    both_fail "expected SOURCE and OUT_DIR" "$run"
    both_fail "dtype" "$run" "$out/x" --dtype f16
    echo "PASS (export_hf cli)"
    ;;

  transformers)
    py="${DFLASH_EXPORT_HF_PYTHON:-$src/data/prep/.venv-serve/bin/python}"
    if [[ ! -x "$py" ]]; then
      echo "skipped: no Python with torch + transformers: $py is missing (make it with" \
           "'bash mpi_launch/install_prep.sh --serve', or set DFLASH_EXPORT_HF_PYTHON)"
      exit 77
    fi
    "$py" -c "import torch, transformers, safetensors" || fail "$py exists but cannot import torch, transformers, safetensors"
    # transformers copies modeling_dflash.py into its modules cache: keep it in the test's folder, and offline
    export HF_MODULES_CACHE="$out/hf_modules" HF_HOME="$out/hf_home" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    "$mpi" --export "$run" "$out/f32" --dtype f32 >/dev/null
    "$data" export "$run" "$out/bf16" --dtype bf16 >/dev/null
    "$dump" dump "$out/f32" "$out/f32_dump.safetensors"
    "$dump" dump "$out/bf16" "$out/bf16_dump.safetensors"
    "$py" "$src/tests/integration/export_hf/test_export_hf.py" --f32 "$out/f32" --f32-dump "$out/f32_dump.safetensors" \
      --bf16 "$out/bf16" --bf16-dump "$out/bf16_dump.safetensors"
    # loading wrote nothing into the export: it can be exported over again
    [[ $(ls "$out/f32" | wc -l) -eq 3 ]] || fail "loading left files in the export: $(ls "$out/f32")"
    "$mpi" --export "$run" "$out/f32" --dtype f32 >/dev/null
    echo "PASS (export_hf transformers)"
    ;;

  *) fail "unknown case" ;;
esac
