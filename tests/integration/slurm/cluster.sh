#!/usr/bin/env bash
# A private slurm cluster on this machine for tests/integration/slurm/slurm_real.sh: its own munged, slurmctld and
# two slurmd (nodes dn1 and dn2 on this one host: Debian builds slurmd with several per host allowed), every file
# (key, sockets, state, spool, logs, pid files) under one folder, on TCP ports the kernel reports free, jobs run as
# a plain user. Debian's slurm-wlm and munge (mpi_launch/install_deps.sh) provide the daemons. Sourced; the caller
# traps EXIT to call cluster_stop.
#   cluster_start STATE_DIR   0: up, both nodes idle, SLURM_CONF exported; 77: this machine cannot run it (the
#                             reason printed as "skipped: ..."); 1: a daemon did not start (its log printed)
#   cluster_stop              cancels the cluster's jobs, then stops the daemons it started (by their pid files)
#   as_user COMMAND...        runs COMMAND as the cluster's plain user ($cluster_user), SLURM_CONF in its env
# Settings a real cluster would not use, for a short test (slurm.conf below):
#   cred_expire=5 (AuthInfo) and sched_interval=1 (SchedulerParameters): a requeued job may start again 6 s after
#   its requeue instead of ~2 minutes (slurm holds a requeued job for cred_expire, 120 s by default, plus the wait
#   for the next scheduling pass). The time-limit signal (--signal) is sent on slurmctld's 30 s tick: not tunable.
#   CPUs = this machine's cores on each node (they share them; OverSubscribe lets jobs share cores), so that
#   --cpu-bind and mpirun's binding map to real cores.

cluster_state="" cluster_user=nobody

cluster_skip() { echo "skipped: $*"; return 77; }

# free_ports N: N TCP ports nobody listens on (bound to port 0, so the kernel picks them; released at once)
free_ports() {
  python3 -c 'import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"
}

as_user() { runuser -u "$cluster_user" -- env "SLURM_CONF=$SLURM_CONF" "$@"; }

# wait_for SECONDS COMMAND...: polls COMMAND every 0.2 s until it succeeds; 1 after SECONDS
wait_for() {
  local limit=$(( $1 * 5 )) i; shift
  for ((i = 0; i < limit; ++i)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

cluster_start() {
  cluster_state="$1"
  local t
  for t in munged slurmctld slurmd sbatch scontrol squeue sinfo scancel srun python3 runuser; do
    command -v "$t" >/dev/null || { cluster_skip "no '$t' on this machine (bash mpi_launch/install_deps.sh --test installs slurm-wlm and munge)"; return; }
  done
  [[ $(id -u) -eq 0 ]] || { cluster_skip "starting slurmd, which runs jobs as another user, needs root (CI runs the tests as root)"; return; }
  id -u "$cluster_user" >/dev/null 2>&1 || { cluster_skip "no user '$cluster_user' to submit jobs as"; return; }
  [[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so || -n "$(find /usr/lib -name mpi_pmix.so 2>/dev/null | head -n 1)" ]] ||
    { cluster_skip "slurm has no PMIx plugin (mpi_pmix.so), which the sbatch scripts' srun --mpi=pmix needs"; return; }

  local s="$cluster_state" host cores mem_mb ctld_port p1 p2
  # daemons of an earlier run of this test that was killed before its cleanup (ctest's timeout) go first
  if [[ -f "$s/slurm.conf" ]]; then SLURM_CONF="$s/slurm.conf" cluster_stop; fi
  rm -rf "$s" && mkdir -p "$s/munge" "$s/munge_socket" "$s/ctld" "$s/spool/dn1" "$s/spool/dn2" "$s/log" \
    "$s/tmp/dn1" "$s/tmp/dn2"
  chmod 1777 "$s/tmp/dn1" "$s/tmp/dn2"   # each node's TmpFS: the PMIx plugin's per-step folders go there
  chmod 700 "$s/munge"        # munged: its key and seed readable by it only
  chmod 755 "$s" "$s/munge_socket"   # ... and its socket reachable by every user (the jobs' scontrol)
  dd if=/dev/urandom of="$s/munge/munge.key" bs=1024 count=1 status=none && chmod 400 "$s/munge/munge.key"
  # --force: the build folder's parents may be writable by a group, which munged refuses for its own folders
  munged --force --key-file="$s/munge/munge.key" --socket="$s/munge_socket/munge.socket" \
    --log-file="$s/log/munged.log" --pid-file="$s/munge/munged.pid" --seed-file="$s/munge/munged.seed" ||
    { cat "$s/log/munged.log" 2>/dev/null; echo "FAIL: munged did not start" >&2; return 1; }
  wait_for 10 test -S "$s/munge_socket/munge.socket" || { cat "$s/log/munged.log"; echo "FAIL: no munge socket" >&2; return 1; }

  host=$(hostname -s)
  cores=$(nproc)
  mem_mb=$(( $(sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo) / 1024 * 9 / 10 ))   # below what slurmd reports
  read -r ctld_port p1 p2 < <(free_ports 3)
  cat >"$s/slurm.conf" <<CONF
# written by tests/integration/slurm/cluster.sh; the state of this test only
ClusterName=dflashtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$s/munge_socket/munge.socket,cred_expire=5
StateSaveLocation=$s/ctld
SlurmdSpoolDir=$s/spool/%n
TmpFS=$s/tmp/%n
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd_%n.pid
SlurmctldLogFile=$s/log/slurmctld.log
SlurmdLogFile=$s/log/slurmd_%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
InactiveLimit=0
KillWait=30
MinJobAge=3600
NodeName=dn1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p1 CPUs=$cores RealMemory=$mem_mb
NodeName=dn2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p2 CPUs=$cores RealMemory=$mem_mb
PartitionName=test Nodes=dn1,dn2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
  export SLURM_CONF="$s/slurm.conf"
  slurmctld -f "$SLURM_CONF" -i || { cat "$s/log/slurmctld.log"; echo "FAIL: slurmctld did not start" >&2; return 1; }
  for n in dn1 dn2; do
    slurmd -f "$SLURM_CONF" -N "$n" || { cat "$s/log/slurmd_$n.log"; echo "FAIL: slurmd $n did not start" >&2; return 1; }
  done
  if ! wait_for 30 bash -c '[[ $(sinfo -h -N -o "%N %t" | grep -c " idle$") -eq 2 ]]'; then
    sinfo -N; tail -n 20 "$s"/log/*.log
    echo "FAIL: the two nodes did not come up idle within 30 s" >&2
    return 1
  fi
  echo "cluster: slurmctld :$ctld_port, slurmd dn1 :$p1 and dn2 :$p2 ($cores CPUs each), state in $s"
}

# the pids of the jobs' processes (shells, launchers, ranks): the cluster user's, with this cluster's slurm.conf in
# their environment
cluster_job_pids() {
  local f uid
  uid=$(id -u "$cluster_user")
  for f in /proc/[0-9]*/environ; do
    [[ $(stat -c %u "${f%/environ}" 2>/dev/null) == "$uid" ]] || continue
    grep -qzxF "SLURM_CONF=$SLURM_CONF" "$f" 2>/dev/null && { f=${f#/proc/}; echo "${f%/environ}"; }
  done
}

cluster_stop() {
  local s="$cluster_state" f pid left
  [[ -n "$s" && -f "$s/slurm.conf" ]] || return 0
  if [[ -f "$s/slurmctld.pid" ]]; then
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null
    wait_for 40 bash -c '[[ -z $(squeue -h -t R,CG,S -o %i 2>/dev/null) ]]' ||
      echo "cluster: jobs still running 40 s after scancel" >&2
  fi
  for f in "$s"/slurmd_dn1.pid "$s"/slurmd_dn2.pid "$s/slurmctld.pid" "$s/munge/munged.pid"; do
    [[ -f "$f" ]] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null && wait_for 10 bash -c "! kill -0 $pid" || kill -KILL "$pid" 2>/dev/null
  done
  left=$(cluster_job_pids | tr '\n' ' ')
  if [[ -n "$left" ]]; then
    echo "cluster: killing what the jobs left behind: $left" >&2
    kill -KILL $left 2>/dev/null
  fi
  rm -f "$s/slurmctld.pid"
}
