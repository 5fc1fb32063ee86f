#!/usr/bin/env bash
# The sbatch scripts on a real slurm: a private cluster (tests/integration/slurm/cluster.sh: munged, slurmctld, two
# slurmd on this host) runs mpi_launch/slurm/single_node.sbatch and multi_node.sbatch, submitted with sbatch by a
# plain user from a copy of the repository's layout (mpi_launch/ and build/apps/dflash_mpi), on the tiny target and
# data with 2 ranks a job (layout.target_tp 1, drafter_dp 1: the cluster has this machine's cores only). The cases
# run at the same time, each its own job(s), each checked against what the scripts' headers promise:
#   finished      a run to completion: COMPLETED, never requeued, status.json finished (the short reference run)
#   reference     the long reference run, uninterrupted (for timelimit)
#   timelimit     --time=1 --signal=USR1@50 (to the ranks): each attempt checkpoints at the signal and requeues
#                 itself; after >= 2 requeues it finishes with drafter_final.safetensors byte-identical to the
#                 reference's and the same per-step losses (metrics.jsonl one contiguous series)
#   timelimit_b_mpirun   the same with DFLASH_LAUNCHER=mpirun and --signal=B:USR1@50 (to the batch shell, which
#                 forwards it to mpirun, which forwards it to the ranks): >= 1 requeue, then == reference
#   usr1_srun     scancel --signal=USR1 --batch, twice (what --signal=B:USR1, the scripts' default, sends) with
#                 srun: the script forwards it, the ranks checkpoint, the job requeues itself once, finishes == finished;
#                 before the signal, each rank's CPU binding (--cpus-per-task cores, disjoint) and OMP_NUM_THREADS
#   usr1_mpirun   the same with DFLASH_LAUNCHER=mpirun (--map-by slot:PE=<cpus-per-task> --bind-to core; the
#                 script's warning that the time-limit signal must be B: in this mode)
#   requeue       scontrol requeue from outside, mid-run: slurm ends the attempt (SIGTERM: a checkpoint, status.json
#                 "requeue": false, the script does not requeue it a second time), requeues it, it finishes == finished
#   scancel       scancel mid-run: CANCELLED, not requeued, the newest checkpoint from before kept, status.json
#                 stopped by SIGTERM with "requeue": false
#   multi_node    multi_node.sbatch over dn1 and dn2 (one rank each, checked from the ranks' SLURMD_NODENAME), a
#                 USR1 to the batch shell, one requeue, finishes == finished
# Exit 77 (ctest SKIP) with "skipped: <reason>" when this machine cannot run slurm (not installed, not root).
#   slurm_real.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -uo pipefail
build="$1" src="$2" work="$3"
t0=$SECONDS
source "$src/tests/integration/slurm/cluster.sh"

# The plain user must reach the state (munge's socket) and the jobs' folders: where the build folder is not
# reachable by it (a checkout under /root), both go to a folder under /tmp, removed at the end
mkdir -p "$work"
tmp_area=""
if [[ $(id -u) -eq 0 ]] && command -v runuser >/dev/null && ! runuser -u "$cluster_user" -- test -x "$work/."; then
  tmp_area=$(mktemp -d /tmp/dflash_slurm_real.XXXXXX) && chmod 755 "$tmp_area"
  echo "slurm_real: $work is not reachable by user $cluster_user: the cluster and its jobs in $tmp_area"
  work="$tmp_area"
fi

pids=()   # the cases, each a background subshell of this script
# whatever ends this script (a failure, ctest's timeout with SIGTERM, ^C): the cases' shells go, then the cluster
on_exit() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  cluster_stop
  [[ -z "$tmp_area" ]] || rm -rf "$tmp_area"
}
trap on_exit EXIT
trap 'exit 1' INT TERM
cluster_start "$work/state" || exit $?   # also stops what an earlier, killed run left
echo "slurm_real: cluster up in $((SECONDS - t0)) s"

rm -rf "$work/repo" "$work/data" "$work"/*.result "$work"/{finished,reference,timelimit,timelimit_b_mpirun,usr1_srun,usr1_mpirun,requeue,scancel,multi_node,calibrate}
# ---- a repository layout the plain user can read: the scripts and the program as a user would deploy them ----
repo="$work/repo"
mkdir -p "$repo/build/apps" "$work/data"
cp -r "$src/mpi_launch" "$repo/"
cp "$build/apps/dflash_mpi" "$repo/build/apps/"
cp -r "$build/tests/integration/tiny_data/target" "$build/tests/integration/tiny_data/train.h5" "$work/data/"
chown -R "$cluster_user" "$repo"
chmod 755 "$work"

cores=$(nproc)
cpt=$(( cores >= 4 ? 2 : 1 ))   # cpus-per-task of the binding cases: 2 ranks x cpt cores must fit this machine
tiny=(mpi_launch/configs/tiny.yaml --set "target.path=$work/data/target" --set "data.path=$work/data/train.h5"
      --set layout.target_tp=1 --set layout.target_groups=1 --set layout.drafter_dp=1 --set log.every=1
      --set ckpt.every=25)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# ---- how many steps: the short runs ~5 s alone; the long ones (~40 s alone) long enough for >= 2 time-limit requeues (each
# attempt gets its signal 10-40 s after it starts) even on a faster machine: measured here, with mpirun ----
calib="$work/calibrate"
mkdir -p "$calib"
"$src/tests/integration/mpirun.sh" -np 2 "$repo/build/apps/dflash_mpi" "$repo/${tiny[0]}" "${tiny[@]:1}" \
  --set "run.out_dir=$calib/run" --set run.steps=60 >"$calib/log" 2>&1 || { cat "$calib/log"; echo "FAIL: calibration run"; exit 1; }
step_ms=$(python3 -c 'import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if "\"loss\"" in l]
print(max(1, int(1000 * (r[-1]["elapsed_s"] - r[19]["elapsed_s"]) / (len(r) - 20))))' "$calib/run/metrics.jsonl")
short_steps=$(( 5000 / step_ms )); ((short_steps < 150)) && short_steps=150
long_steps=$(( 40000 / step_ms )); ((long_steps < 600)) && long_steps=600
echo "slurm_real: $step_ms ms a step alone: short runs $short_steps steps, long runs $long_steps steps"

# submit NAME SCRIPT SBATCH_OPTION... -- SCRIPT_ARG...: sbatch as the plain user from the repository root; the job id
submit() {
  local name="$1" script="$2" opts=() id; shift 2
  while [[ $# -gt 0 && "$1" != -- ]]; do opts+=("$1"); shift; done
  shift
  id=$(cd "$repo" && as_user sbatch --parsable -J "$name" --mem=2G "${opts[@]}" "mpi_launch/slurm/$script" "$@") ||
    return 1
  echo "${id%%;*}"
}
# field ID KEY: one field of scontrol show job
field() { scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
terminal() { [[ $(field "$1" JobState) =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)$ ]]; }
# wait_done ID SECONDS: until the job is over for good (not requeued); its state
wait_done() { wait_for "$2" terminal "$1"; field "$1" JobState; }
# steps_done RUN: training records in RUN/metrics.jsonl (one a step: log.every 1)
steps_done() { grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null || echo 0; }
wait_steps() { wait_for "$3" bash -c "[[ \$(grep -c '\"loss\"' '$1/metrics.jsonl' 2>/dev/null) -ge $2 ]]"; }
# rank_pids RUN: world rank 0's and 1's pids of the current attempt (the last attempt header of each rank's log)
rank_pids() {
  local r
  for r in 00 01; do
    sed -n 's/.*===== attempt: host .*, pid \([0-9]*\), .*/\1/p' "$1/logs/rank_$r.log" 2>/dev/null | tail -n 1
  done
}
losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1/metrics.jsonl"; }
status_of() { tr -d ' \n' <"$1/status.json"; }

# same_as REF RUN: final weights byte for byte and the per-step loss series (one record per step, no gap, no repeat)
same_as() {
  local ref="$1" run="$2"
  cmp -s "$ref/drafter_final.safetensors" "$run/drafter_final.safetensors" ||
    { echo "drafter_final.safetensors differs from $(basename "$ref")'s"; return 1; }
  diff -q <(losses "$ref") <(losses "$run") >/dev/null ||
    { echo "the losses in metrics.jsonl differ from $(basename "$ref")'s ($(losses "$run" | wc -l) vs $(losses "$ref" | wc -l) records)"; return 1; }
  echo "final weights byte-identical and the same $(losses "$run" | wc -l) per-step losses as $(basename "$ref")"
}

# check_binding RUN CPUS: each rank of the current attempt is bound to CPUS cores, the two ranks to different ones,
# and runs CPUS OpenMP threads
check_binding() {
  local run="$1" want="$2" pid list n omp seen="" out=""
  for pid in $(rank_pids "$run"); do
    list=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "/proc/$pid/status" 2>/dev/null)
    [[ -n "$list" ]] || { echo "rank pid $pid: no /proc entry"; return 1; }
    n=$(python3 -c 'import sys
n = 0
for part in sys.argv[1].split(","):
    a, _, b = part.partition("-"); n += int(b or a) - int(a) + 1
print(n)' "$list")
    [[ "$n" -eq "$want" ]] || { echo "rank pid $pid is bound to cores $list ($n), not to $want"; return 1; }
    [[ " $seen " != *" $list "* ]] || { echo "two ranks bound to the same cores $list"; return 1; }
    omp=$(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^OMP_NUM_THREADS=//p')
    [[ "$omp" == "$want" ]] || { echo "rank pid $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-60)): OMP_NUM_THREADS is '$omp', not $want"; return 1; }
    seen+=" $list" out+=" {$list}"
  done
  echo "bound to$out, OMP_NUM_THREADS=$want"
}

# result CASE PASS|FAIL MESSAGE
result() { echo "$2 ($1, $(( SECONDS - case_t0 )) s): $3" | tee "$work/$1.result"; }

case_finished() {
  local id run="$work/finished/run" st
  mkdir -p "$work/finished" && chown "$cluster_user" "$work/finished"
  id=$(submit finished single_node.sbatch --ntasks=2 --cpus-per-task=1 -- "${tiny[@]}" --set "run.out_dir=$run" \
       --set "run.steps=$short_steps") || { result finished FAIL "sbatch refused the job"; return; }
  st=$(wait_done "$id" 240)
  [[ "$st" == COMPLETED ]] || { result finished FAIL "job $id ended $st (its output: $repo/finished_$id.out)"; return; }
  [[ $(field "$id" Restarts) == 0 ]] || { result finished FAIL "requeued $(field "$id" Restarts) times"; return; }
  [[ $(status_of "$run") == *'"outcome":"finished","step":'"$short_steps"* ]] || { result finished FAIL "status.json: $(status_of "$run")"; return; }
  grep -q "dflash: attempt ended with exit 0: finished" "$repo/finished_$id.out" || { result finished FAIL "no 'finished' line in the job's output"; return; }
  result finished PASS "COMPLETED, not requeued, status.json finished at step $short_steps"
}

case_reference() {
  local id run="$work/reference/run" st
  mkdir -p "$work/reference" && chown "$cluster_user" "$work/reference"
  id=$(submit reference single_node.sbatch --ntasks=2 --cpus-per-task=1 -- "${tiny[@]}" --set "run.out_dir=$run" \
       --set "run.steps=$long_steps") || { result reference FAIL "sbatch refused the job"; return; }
  st=$(wait_done "$id" 400)
  [[ "$st" == COMPLETED && $(field "$id" Restarts) == 0 ]] || { result reference FAIL "job $id ended $st"; return; }
  result reference PASS "COMPLETED uninterrupted ($long_steps steps)"
}

# timelimit CASE LAUNCHER SIGNAL MIN_REQUEUES: --time=1 --signal=SIGNAL; each signal a checkpoint and a self-requeue
timelimit() {
  local c="$1" launcher="$2" signal="$3" least="$4" id run="$work/$1/run" st n same
  mkdir -p "$work/$c" && chown "$cluster_user" "$work/$c"
  id=$(DFLASH_LAUNCHER=$launcher submit "$c" single_node.sbatch --ntasks=2 --cpus-per-task=1 --time=1 \
       --signal="$signal" -- "${tiny[@]}" --set "run.out_dir=$run" --set "run.steps=$long_steps") ||
    { result "$c" FAIL "sbatch refused the job"; return; }
  st=$(wait_done "$id" 420)
  n=$(field "$id" Restarts)
  [[ "$st" == COMPLETED ]] || { result "$c" FAIL "job $id ended $st after $n requeues"; return; }
  ((n >= least)) || { result "$c" FAIL "finished after $n requeues (< $least): the run was too short"; return; }
  [[ $(grep -c "attempt ended with exit 0: stopped" "$repo/${c}_$id.out") -eq $n ]] ||
    { result "$c" FAIL "$n requeues but $(grep -c "exit 0: stopped" "$repo/${c}_$id.out") stopped attempts"; return; }
  wait_for 420 test -f "$work/reference.result"
  grep -q ^PASS "$work/reference.result" || { result "$c" FAIL "no reference run to compare with"; return; }
  same=$(same_as "$work/reference/run" "$run") || { result "$c" FAIL "$same"; return; }
  result "$c" PASS "$launcher, --signal=$signal: $n time-limit signals, each a checkpoint and a self-requeue, then COMPLETED: $same"
}

# usr1_batch CASE LAUNCHER: a SIGUSR1 to the batch shell mid-run, binding checked before it
usr1_batch() {
  local c="$1" launcher="$2" id run="$work/$1/run" st bind same
  mkdir -p "$work/$c" && chown "$cluster_user" "$work/$c"
  id=$(DFLASH_LAUNCHER=$launcher submit "$c" single_node.sbatch --ntasks=2 --cpus-per-task="$cpt" -- "${tiny[@]}" \
       --set "run.out_dir=$run" --set "run.steps=$short_steps") || { result "$c" FAIL "sbatch refused the job"; return; }
  wait_steps "$run" 5 120 || { result "$c" FAIL "no training step within 120 s ($(field "$id" JobState))"; return; }
  bind=$(check_binding "$run" "$cpt") || { result "$c" FAIL "$bind"; return; }
  # two in quick succession (a user and slurm may both send one): one stop, one checkpoint, one requeue
  scancel --signal=USR1 --batch "$id"
  sleep 0.1
  scancel --signal=USR1 --batch "$id"
  st=$(wait_done "$id" 300)
  [[ "$st" == COMPLETED && $(field "$id" Restarts) == 1 ]] ||
    { result "$c" FAIL "job $id ended $st after $(field "$id" Restarts) requeues, not COMPLETED after 1"; return; }
  grep -q "dflash: SIGUSR1: forwarded to the launcher" "$repo/${c}_$id.out" || { result "$c" FAIL "the script did not forward SIGUSR1"; return; }
  if [[ $launcher == mpirun ]] && ! grep -q "the time-limit signal must be sent to this script (--signal=B:USR1" "$repo/${c}_$id.out"; then
    result "$c" FAIL "no warning about --signal=B: in mpirun mode"; return
  fi
  wait_for 300 test -f "$work/finished.result"
  same=$(same_as "$work/finished/run" "$run") || { result "$c" FAIL "$same"; return; }
  result "$c" PASS "ranks $bind; two SIGUSR1 to the batch shell: one checkpoint, 1 self-requeue, COMPLETED: $same"
}

case_requeue() {
  local id run="$work/requeue/run" st same
  mkdir -p "$work/requeue" && chown "$cluster_user" "$work/requeue"
  id=$(submit requeue single_node.sbatch --ntasks=2 --cpus-per-task=1 -- "${tiny[@]}" --set "run.out_dir=$run" \
       --set "run.steps=$short_steps") || { result requeue FAIL "sbatch refused the job"; return; }
  wait_steps "$run" 30 120 || { result requeue FAIL "no 30 training steps within 120 s"; return; }
  as_user scontrol requeue "$id" || { result requeue FAIL "scontrol requeue $id refused"; return; }
  st=$(wait_done "$id" 300)
  [[ "$st" == COMPLETED && $(field "$id" Restarts) == 1 ]] ||
    { result requeue FAIL "job $id ended $st after $(field "$id" Restarts) requeues, not COMPLETED after 1"; return; }
  grep -q "attempt ended with exit 0: terminated" "$repo/requeue_$id.out" ||
    { result requeue FAIL "the first attempt did not end 'terminated' (SIGTERM, checkpoint, no self-requeue)"; return; }
  wait_for 300 test -f "$work/finished.result"
  same=$(same_as "$work/finished/run" "$run") || { result requeue FAIL "$same"; return; }
  result requeue PASS "scontrol requeue: the attempt checkpointed on SIGTERM, slurm requeued it once, COMPLETED: $same"
}

case_scancel() {
  local id run="$work/scancel/run" st before after
  mkdir -p "$work/scancel" && chown "$cluster_user" "$work/scancel"
  id=$(submit scancel single_node.sbatch --ntasks=2 --cpus-per-task=1 -- "${tiny[@]}" --set "run.out_dir=$run" \
       --set "run.steps=$long_steps") || { result scancel FAIL "sbatch refused the job"; return; }
  wait_for 180 bash -c "ls -d '$run'/ckpt/step_*/DONE" || { result scancel FAIL "no checkpoint within 180 s"; return; }
  before=$(ls -d "$run"/ckpt/step_*/DONE | tail -n 1)
  as_user scancel "$id"
  st=$(wait_done "$id" 120)
  [[ "$st" == CANCELLED ]] || { result scancel FAIL "job $id ended $st, not CANCELLED"; return; }
  sleep 10   # a requeue would show by now (cred_expire 5 s)
  [[ $(field "$id" JobState) == CANCELLED && $(field "$id" Restarts) == 0 ]] ||
    { result scancel FAIL "after scancel: $(field "$id" JobState), $(field "$id" Restarts) requeues"; return; }
  [[ -f "$before" ]] || { result scancel FAIL "the newest checkpoint before scancel ($before) is gone"; return; }
  after=$(ls -d "$run"/ckpt/step_*/DONE | tail -n 1)
  [[ $(status_of "$run") == *'"outcome":"stopped"'*'"requeue":false,"signal":"SIGTERM"'* ]] ||
    { result scancel FAIL "status.json after scancel: $(status_of "$run")"; return; }
  result scancel PASS "CANCELLED, not requeued; $(basename "$(dirname "$before")") kept, $(basename "$(dirname "$after")") written on SIGTERM; status.json stopped, requeue false"
}

case_multi_node() {
  local id run="$work/multi_node/run" st pid nodes="" same
  mkdir -p "$work/multi_node" && chown "$cluster_user" "$work/multi_node"
  id=$(submit multi_node multi_node.sbatch --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=1 -- \
       "${tiny[@]}" --set "run.out_dir=$run" --set "run.steps=$short_steps") || { result multi_node FAIL "sbatch refused the job"; return; }
  wait_steps "$run" 5 120 || { result multi_node FAIL "no training step within 120 s ($(field "$id" JobState))"; return; }
  for pid in $(rank_pids "$run"); do
    nodes+=" $(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^SLURMD_NODENAME=//p')"
  done
  [[ "$nodes" == " dn1 dn2" ]] || { result multi_node FAIL "world ranks 0 and 1 ran on '$nodes', not dn1 and dn2"; return; }
  scancel --signal=USR1 --batch "$id"
  st=$(wait_done "$id" 300)
  [[ "$st" == COMPLETED && $(field "$id" Restarts) == 1 ]] ||
    { result multi_node FAIL "job $id ended $st after $(field "$id" Restarts) requeues, not COMPLETED after 1"; return; }
  wait_for 300 test -f "$work/finished.result"
  same=$(same_as "$work/finished/run" "$run") || { result multi_node FAIL "$same"; return; }
  result multi_node PASS "ranks on dn1 and dn2; SIGUSR1 to the batch shell, 1 self-requeue, COMPLETED: $same"
}

cases=(finished reference timelimit timelimit_b_mpirun usr1_srun usr1_mpirun requeue scancel multi_node)
for c in "${cases[@]}"; do
  case_t0=$SECONDS
  case "$c" in
    timelimit) timelimit timelimit srun USR1@50 2 & ;;
    timelimit_b_mpirun) timelimit timelimit_b_mpirun mpirun B:USR1@50 1 & ;;
    usr1_srun) usr1_batch usr1_srun srun & ;;
    usr1_mpirun) usr1_batch usr1_mpirun mpirun & ;;
    *) "case_$c" & ;;
  esac
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

fail=0
echo "---- slurm_real: $((SECONDS - t0)) s in all"
for c in "${cases[@]}"; do
  if [[ -f "$work/$c.result" ]]; then cat "$work/$c.result"; else echo "FAIL ($c): no result"; fi
  grep -q ^PASS "$work/$c.result" 2>/dev/null || fail=1
done
if ((fail)); then
  echo "---- job outputs and daemon logs: $repo/*.out, $work/state/log/"
  squeue -o "%i %j %T %r" 2>/dev/null
  for f in "$repo"/*.out "$repo"/*.err; do echo "== $f"; tail -n 15 "$f"; done
fi
exit $fail
