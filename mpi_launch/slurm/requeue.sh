#!/usr/bin/env bash
# Sourced by the sbatch scripts (and tests/integration/slurm_requeue.sh): what to do after an attempt ends.
#   dflash_attempt_outcome OUT_DIR EXIT_CODE  ->  prints one word:
#     finished  exit 0 and <out_dir>/drafter_final.safetensors exists: done, no requeue
#     stopped   exit 0 and the latest attempt of a rank log says "stopping after step N on SIGUSR1|SIGTERM": the
#               signal before the time limit stopped it after a checkpoint: requeue (it resumes with ckpt.resume=auto)
#     partial   exit 0 otherwise (e.g. --stop-after-steps): done as asked, no requeue
#     failed    non-zero exit: an error (a requeue would only repeat it), no requeue

# The lines of a rank log after its last "===== attempt:" header (logs append across attempts).
dflash_latest_attempt() {
  awk '/ ===== attempt: / { n = 0 } { lines[n++] = $0 } END { for (i = 0; i < n; ++i) print lines[i] }' "$1"
}

dflash_attempt_outcome() {
  local out_dir="$1" rc="$2" log
  if [[ "$rc" -ne 0 ]]; then echo failed; return; fi
  for log in "$out_dir"/logs/rank_*.log; do
    [[ -f "$log" ]] || continue
    if dflash_latest_attempt "$log" | grep -q "stopping after step [0-9]* on SIG"; then
      echo stopped
      return
    fi
  done
  if [[ -f "$out_dir/drafter_final.safetensors" ]]; then echo finished; else echo partial; fi
}
