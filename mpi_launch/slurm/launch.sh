#!/usr/bin/env bash
# Sourced by the sbatch scripts: runs an attempt's launcher (srun or mpirun) in the background, so that the batch
# shell lives through the signals slurm sends it and waits for the ranks.
#   dflash_launch COMMAND [ARGS...]   sets dflash_rc (the launcher's exit code) and dflash_terminated ("SIGTERM" when
#                                     this shell was sent SIGTERM while the launcher ran, else empty)
# SIGUSR1 to this shell (--signal=B:USR1@N, the scripts' default; scancel --signal=USR1 --batch or --full) is
#   forwarded to the launcher: srun and mpirun both pass it on to every rank, which finish the step, write a
#   checkpoint and exit 0 (a rank that also got it from slurm directly, as with --full, stops the same way).
#   Without this a SIGUSR1 to the batch shell would kill it and end the job FAILED, with nothing requeued.
# SIGTERM to this shell (scancel, the time limit reached): slurm signals the ranks itself; this shell notes it and
#   keeps waiting (within slurm's KillWait) so that the ranks' checkpoint and status.json are written before the
#   job ends; the caller then does not requeue.
dflash_launcher_pid=""
dflash_forward_usr1() {
  echo "dflash: SIGUSR1: forwarded to the launcher (pid ${dflash_launcher_pid:-not started yet})"
  [[ -n "$dflash_launcher_pid" ]] && kill -USR1 "$dflash_launcher_pid" 2>/dev/null
}
dflash_launch() {
  dflash_terminated="" dflash_rc=0
  trap dflash_forward_usr1 USR1
  trap 'dflash_terminated=SIGTERM; echo "dflash: SIGTERM: slurm is ending the job; waiting for the ranks"' TERM
  "$@" &
  dflash_launcher_pid=$!
  # a trapped signal ends `wait` early (status > 128) while the launcher still runs, once per signal (slurm and a
  # user may send several): wait again until the launcher itself has ended
  while :; do
    wait "$dflash_launcher_pid"; dflash_rc=$?
    kill -0 "$dflash_launcher_pid" 2>/dev/null || break
  done
  # a signal trapped just as the launcher ended leaves 128 + signal: its own status is still there to be waited for
  if ((dflash_rc > 128)); then
    local r
    wait "$dflash_launcher_pid" 2>/dev/null; r=$?
    ((r != 127)) && dflash_rc=$r
  fi
  trap '' USR1   # the ranks are done: a late SIGUSR1 has nothing left to stop
  dflash_launcher_pid=""
}
