#!/usr/bin/env bash
# The slurm scripts without slurm: the requeue decision (mpi_launch/slurm/requeue.sh) on prepared run folders,
# then mpi_launch/slurm/single_node.sbatch run as a plain script with stub srun (-> mpirun) and scontrol (records
# its arguments): a finished run is not requeued; a run stopped by SIGUSR1 (what --signal sends) requeues itself.
#   slurm_requeue.sh BUILD_DIR SOURCE_DIR WORK_DIR CASE     CASE: decision | finished | signal | signal_twice
set -euo pipefail
build="$1" src="$2" work="$3" case="$4"
out="$work/$case"
rm -rf "$out" && mkdir -p "$out"
fail() { echo "FAIL ($case): $*" >&2; exit 1; }
source "$src/mpi_launch/slurm/requeue.sh"
tiny="$build/tests/integration/tiny_data"

header() { echo "2026-11-29 12:00:00.000 [rank 5 | drafter | 0] info  ===== attempt: host h, pid $1, no batch job ====="; }
line() { echo "2026-11-29 12:00:01.000 [rank 5 | drafter | 0] $1"; }

# a stub slurm: srun runs the command under mpirun (its own flags dropped), scontrol records what it was asked
make_stubs() {
  mkdir -p "$out/bin"
  cat >"$out/bin/srun" <<STUB
#!/usr/bin/env bash
while [[ \$# -gt 0 && "\$1" == -* ]]; do shift; done
exec "$src/tests/integration/mpirun.sh" -np "\${SLURM_NTASKS:-8}" "\$@"
STUB
  printf '#!/usr/bin/env bash\necho "$*" >>"%s/scontrol.log"\n' "$out" >"$out/bin/scontrol"
  chmod +x "$out/bin/srun" "$out/bin/scontrol"
}
sbatch_env=(env "PATH=$out/bin:$PATH" SLURM_JOB_ID=42 SLURM_NTASKS=8 SLURM_CPUS_PER_TASK=1 "DFLASH_ROOT=$src"
            "DFLASH_BIN=$build/apps/dflash_mpi")
common=("$src/mpi_launch/configs/tiny.yaml" --set "target.path=$tiny/target" --set "data.path=$tiny/train.h5"
        --set "run.out_dir=$out/run")

case "$case" in
  decision)
    d="$out/d" && mkdir -p "$d"
    status() { printf '{\n  "outcome": "%s",\n  "step": 10,\n  "total_steps": 20,\n  "requeue": %s\n}\n' "$1" "$2" >"$d/status.json"; }
    [[ $(dflash_attempt_outcome "$d" 0) == unknown ]] || fail "exit 0 without status.json: expected unknown"
    status running false
    [[ $(dflash_attempt_outcome "$d" 0) == unknown ]] || fail "exit 0, status still running: expected unknown"
    [[ $(dflash_attempt_outcome "$d" 1) == failed ]] || fail "exit 1: expected failed"
    status partial false
    [[ $(dflash_attempt_outcome "$d" 0) == partial ]] || fail "partial: expected partial"
    status stopped true
    [[ $(dflash_attempt_outcome "$d" 0) == stopped ]] || fail "status stopped: expected stopped"
    [[ $(dflash_attempt_outcome "$d" 137) == failed ]] || fail "killed: expected failed"
    status finished false
    [[ $(dflash_attempt_outcome "$d" 0) == finished ]] || fail "status finished: expected finished"
    echo "PASS (decision)"
    ;;
  finished)
    make_stubs
    rc=0
    "${sbatch_env[@]}" bash "$src/mpi_launch/slurm/single_node.sbatch" "${common[@]}" --set run.steps=2 \
      >"$out/job.out" 2>&1 || rc=$?
    cat "$out/job.out" | grep "^dflash:" || true
    [[ $rc -eq 0 ]] || fail "exit $rc"
    grep -q "dflash: attempt ended with exit 0: finished" "$out/job.out" || fail "not reported finished"
    [[ ! -f "$out/scontrol.log" ]] || fail "a finished job was requeued: $(cat "$out/scontrol.log")"
    grep -q '"outcome": "finished"' "$out/run/status.json" || fail "status.json: $(cat "$out/run/status.json")"
    grep -q '"step": 2,' "$out/run/status.json" || fail "status.json step: $(cat "$out/run/status.json")"
    echo "PASS (finished)"
    ;;
  signal)
    make_stubs
    "${sbatch_env[@]}" bash "$src/mpi_launch/slurm/single_node.sbatch" "${common[@]}" --set run.steps=100000 \
      --set log.every=1 >"$out/job.out" 2>&1 &
    job=$!
    for _ in $(seq 1 300); do
      [[ -f "$out/run/metrics.jsonl" && $(wc -l <"$out/run/metrics.jsonl") -ge 2 ]] && break
      sleep 0.1
    done
    # what slurm's --signal=USR1@600 does: SIGUSR1 to every task
    pids=$(sed -n 's/.*===== attempt: host .*, pid \([0-9]*\), .*/\1/p' "$out"/run/logs/rank_0*.log)
    [[ -n "$pids" ]] || fail "no rank pids"
    kill -USR1 $pids
    rc=0
    timeout 60 tail --pid=$job -f /dev/null || fail "the job did not end within 60 s of SIGUSR1"
    wait $job || rc=$?
    grep "^dflash:" "$out/job.out" || true
    [[ $rc -eq 0 ]] || fail "exit $rc"
    grep -q "dflash: attempt ended with exit 0: stopped" "$out/job.out" || fail "not reported stopped"
    [[ "$(cat "$out/scontrol.log")" == "requeue 42" ]] || fail "no 'scontrol requeue 42'"
    ls -d "$out"/run/ckpt/step_*/DONE >/dev/null || fail "no complete checkpoint to resume from"
    grep -q '"outcome": "stopped"' "$out/run/status.json" || fail "status.json: $(cat "$out/run/status.json")"
    grep -q '"requeue": true' "$out/run/status.json" || fail "status.json requeue: $(cat "$out/run/status.json")"
    grep -q '"signal": "SIGUSR1"' "$out/run/status.json" || fail "status.json signal: $(cat "$out/run/status.json")"
    echo "PASS (signal): checkpoint written, scontrol requeue 42"
    ;;
  signal_twice)
    # DFLASH_LAUNCHER=mpirun, two SIGUSR1 in quick succession to the batch script (as --signal=B:USR1 and a user
    # might): the script waits for mpirun through both, the ranks stop with a checkpoint, the job requeues
    make_stubs
    real_mpirun=$(command -v mpirun)
    root_flag=""
    [[ $(id -u) -eq 0 ]] && root_flag="--allow-run-as-root"
    cat >"$out/bin/mpirun" <<STUB
#!/usr/bin/env bash
# the script's mpirun flags (-np N, --bind-to X, -x VAR) give way to the ones this machine needs
while [[ \$# -gt 0 ]]; do case "\$1" in -np|--bind-to|-x) shift 2 ;; *) break ;; esac; done
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
exec "$real_mpirun" --oversubscribe --bind-to none $root_flag -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS \
  -np "\${SLURM_NTASKS:-8}" "\$@"
STUB
    chmod +x "$out/bin/mpirun"
    "${sbatch_env[@]}" DFLASH_LAUNCHER=mpirun bash "$src/mpi_launch/slurm/single_node.sbatch" "${common[@]}" \
      --set run.steps=100000 --set log.every=1 >"$out/job.out" 2>&1 &
    job=$!
    for _ in $(seq 1 300); do
      [[ -f "$out/run/metrics.jsonl" && $(wc -l <"$out/run/metrics.jsonl") -ge 2 ]] && break
      sleep 0.1
    done
    [[ -f "$out/run/metrics.jsonl" ]] || { cat "$out/job.out"; fail "the job did not start"; }
    kill -USR1 $job
    sleep 0.05
    kill -USR1 $job
    rc=0
    timeout 60 tail --pid=$job -f /dev/null || fail "the job did not end within 60 s of SIGUSR1"
    wait $job || rc=$?
    grep "^dflash:" "$out/job.out" || true
    [[ $rc -eq 0 ]] || { tail -20 "$out/job.out"; fail "exit $rc"; }
    grep -q "dflash: attempt ended with exit 0: stopped" "$out/job.out" || fail "not reported stopped"
    [[ "$(cat "$out/scontrol.log")" == "requeue 42" ]] || fail "no 'scontrol requeue 42'"
    ls -d "$out"/run/ckpt/step_*/DONE >/dev/null || fail "no complete checkpoint to resume from"
    echo "PASS (signal_twice): two SIGUSR1, one stop with a checkpoint, scontrol requeue 42"
    ;;
  *) fail "unknown case" ;;
esac
