#!/usr/bin/env bash
# Served as trained: vLLM (its CPU build, data/prep/.venv-vllm: bash mpi_launch/install_prep.sh --vllm) serves our
# export with the tiny target, offline, and decodes and accepts exactly as dflash_eval does (docs/export.md "vLLM",
# docs/eval.md "Checking a serving engine").
#   engine_vllm.sh BUILD_DIR SOURCE_DIR WORK_DIR
# 1. a random Qwen3 target at head_dim 32 (vLLM's CPU attention has no head_dim 16), prompts, the target's greedy
#    continuations (dflash_data regenerate: training data, and the reference of the lossless check);
# 2. two drafters trained by dflash_mpi (engine_tiny.yaml): one on 48 sequences (400 steps), and the serving gate:
#    one sequence overfit for 300 steps, which the engine must accept in full blocks;
# 3. exports (f32 and bf16; the gate bf16), dflash_eval on each (--check-greedy, its per-prompt record); z-lab's
#    dflash package loads them (and a random drafter with a sliding layer) and computes our forward (zlab_check.py);
# 4. test_engine_vllm.py: one vLLM process serves the exports (f32 unpatched and patched, bf16 patched) and asserts
#    tokens == dflash_eval's == regenerate's and, per prompt and verify, acceptance == dflash_eval's;
#    then `dflash-prep serve-check --engine vllm` (the user's command) on the gate's export.
# vLLM's CPU DFlash has a defect (layer 0's k_norm on every layer's context keys): the comparisons that must agree
# run with serve-check's --patch-vllm-k-norm, and the unpatched run must disagree (it shows the defect is still in
# the pinned vLLM; when a vLLM without it is pinned, that assertion says to drop the patch).
# Skipped (exit 77) only when an environment is missing: data/prep/.venv (dflash-prep) or the vLLM one.
set -euo pipefail
build="$1" src="$2" work="$3"
fail() { echo "FAIL (engine_vllm): $*" >&2; exit 1; }
prep_py="${DFLASH_PREP_VENV:-$src/data/prep/.venv}/bin/python"
vllm_py="${DFLASH_ENGINE_VLLM_PYTHON:-${DFLASH_PREP_VLLM_VENV:-$src/data/prep/.venv-vllm}/bin/python}"
for py in "$prep_py" "$vllm_py"; do
  if [[ ! -x "$py" ]]; then
    echo "skipped: $py is missing: make the environments with 'bash mpi_launch/install_prep.sh --vllm'" \
         "(mpi_launch/test.sh does; DFLASH_PREP_VLLM=0 leaves vLLM out)"
    exit 77
  fi
done
data="$build/apps/dflash_data"
eval_bin="$build/apps/dflash_eval"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
start=$SECONDS

# 1. target, prompts, greedy continuations (training data keeps the mask token 511 out, as make_tiny.sh does; the
#    reference of the engine comparison does not: vLLM may pick any id, so dflash_eval runs with --vocab-limit 512)
"$data" make-target --out target --hidden 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --intermediate 128 \
  --vocab 512 --seed 3 >/dev/null
"$data" make-prompts --out prompts.h5 --vocab 512 --reserve 1 --count 48 --min-len 16 --max-len 40 --seed 3 >/dev/null
"$data" regenerate --target target --prompts prompts.h5 --out train.h5 --max-new-tokens 48 --vocab-limit 511 >/dev/null
"$data" regenerate --target target --prompts prompts.h5 --out reference.h5 --max-new-tokens 40 >/dev/null
"$data" make-prompts --out gate_prompt.h5 --vocab 512 --reserve 1 --count 1 --min-len 24 --max-len 24 --seed 11 \
  >/dev/null
"$data" regenerate --target target --prompts gate_prompt.h5 --out gate.h5 --max-new-tokens 96 --vocab-limit 511 \
  >/dev/null
"$data" regenerate --target target --prompts gate_prompt.h5 --out gate_reference.h5 --max-new-tokens 96 >/dev/null

# 2. the two drafters
train() {  # train OUT DATA STEPS [--set ...]
  local out="$1" d="$2" steps="$3"
  shift 3
  "$src/tests/integration/mpirun.sh" -np 2 "$build/apps/dflash_mpi" "$src/tests/integration/engine/engine_tiny.yaml" \
    --set "target.path=$work/target" --set "data.path=$work/$d" --set "run.out_dir=$work/$out" \
    --set "run.steps=$steps" --set "ckpt.every=$steps" "$@" >"$out.log" 2>&1 ||
    { tail -20 "$out.log"; fail "training $out failed"; }
}
train run train.h5 400
train gate_run gate.h5 300 --set optim.micro_batches=1
echo "engine_vllm: data and two trainings in $((SECONDS - start)) s"

# 3. exports and dflash_eval (its per_prompt record: kept tokens per verify, tokens)
"$data" export run f32 --dtype f32 >/dev/null
"$data" export run bf16 --dtype bf16 >/dev/null
"$data" export gate_run gate --dtype bf16 >/dev/null
for e in f32 bf16; do
  "$eval_bin" --target target --drafter $e --prompts prompts.h5 --limit 12 --max-new-tokens 40 --vocab-limit 512 \
    --check-greedy --out eval_$e.json | tail -1
done
"$eval_bin" --target target --drafter gate --prompts gate_prompt.h5 --max-new-tokens 96 --vocab-limit 512 \
  --check-greedy --out eval_gate.json | tail -1

# 3b. z-lab's dflash package loads the exports and computes our forward; a random drafter with a sliding layer
#     (drafter_forward_dump's run: full, sliding, full) checks the window convention vLLM's CPU build cannot serve
"$build/tests/integration/drafter_forward_dump" make-runs random >/dev/null
"$data" export random/run sliding --dtype f32 >/dev/null
HF_MODULES_CACHE="$work/hf_modules" HF_HUB_OFFLINE=1 "$vllm_py" "$src/tests/integration/engine/zlab_check.py" \
  sliding f32 bf16 2>&1 | grep -v "Loading weights"

# 4. the engine
PYTHONPATH="$src/data/prep" "$prep_py" "$src/tests/integration/engine/test_engine_vllm.py" --work "$work" \
  --vllm-python "$vllm_py" --src "$src"
echo "engine_vllm: $((SECONDS - start)) s in all"
echo "PASS (engine_vllm)"
