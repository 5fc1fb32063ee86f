#!/usr/bin/env bash
# Sourced by the sbatch scripts (and tests/integration/slurm_requeue.sh): what to do after an attempt ends.
#   dflash_attempt_outcome OUT_DIR EXIT_CODE  ->  prints one word:
#     failed    non-zero exit: an error (a requeue would only repeat it), no requeue
#     finished | stopped | partial   exit 0: the "outcome" of <out_dir>/status.json, which dflash_mpi's world rank 0
#               writes when every rank is done (docs/running.md): stopped = a stop signal ended the attempt after a
#               checkpoint (requeue: it resumes with ckpt.resume=auto); finished = every step trained; partial =
#               stopped where asked (--stop-after-steps); neither of the last two is requeued
#     unknown   exit 0 without a final status (no status.json, or "running"): not requeued, reported
dflash_attempt_outcome() {
  local out_dir="$1" rc="$2" status="$1/status.json" outcome
  if [[ "$rc" -ne 0 ]]; then echo failed; return; fi
  # status.json is ours: nlohmann's dump(2), one "key": value per line
  outcome=$(sed -n 's/^ *"outcome": "\([a-z]*\)",\{0,1\}$/\1/p' "$status" 2>/dev/null | head -n 1)
  case "$outcome" in
    finished | stopped | partial) echo "$outcome" ;;
    *) echo unknown ;;
  esac
}
