#!/usr/bin/env bash
# Sourced by the sbatch scripts (and tests/integration/slurm_requeue.sh): what to do after an attempt ends.
#   dflash_attempt_outcome OUT_DIR EXIT_CODE  ->  prints one word:
#     failed    non-zero exit: an error (a requeue would only repeat it), no requeue
#     finished | stopped | terminated | partial   exit 0: the "outcome" of <out_dir>/status.json, which dflash_mpi's
#               world rank 0 writes when every rank is done (docs/running.md): stopped = SIGUSR1 (the time-limit
#               signal) ended the attempt after a checkpoint, "requeue": true (requeue: it resumes with
#               ckpt.resume=auto); terminated = SIGTERM (scancel, slurm ending the job) ended it after a checkpoint,
#               "requeue": false; finished = every step trained; partial = stopped where asked (--stop-after-steps);
#               none but stopped is requeued
#     unknown   exit 0 without a final status (no status.json, or "running"): not requeued, reported
dflash_attempt_outcome() {
  local out_dir="$1" rc="$2" status="$1/status.json" outcome
  if [[ "$rc" -ne 0 ]]; then echo failed; return; fi
  # status.json is ours: nlohmann's dump(2), one "key": value per line
  outcome=$(sed -n 's/^ *"outcome": "\([a-z]*\)",\{0,1\}$/\1/p' "$status" 2>/dev/null | head -n 1)
  if [[ "$outcome" == stopped ]] && grep -q '^ *"requeue": false,\{0,1\}$' "$status"; then outcome=terminated; fi
  case "$outcome" in
    finished | stopped | terminated | partial) echo "$outcome" ;;
    *) echo unknown ;;
  esac
}
