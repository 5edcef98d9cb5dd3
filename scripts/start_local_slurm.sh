#!/usr/bin/env bash
# A one-node Slurm on this machine, for testing pbs/slurm_run.sbatch with a real sbatch.
#
#   scripts/start_local_slurm.sh start [DIR]   # writes DIR/slurm.conf, starts slurmctld + slurmd
#   export SLURM_CONF=DIR/slurm.conf           # what `start` prints; then sbatch/squeue/srun work
#   scripts/start_local_slurm.sh stop [DIR]    # stops the two daemons started for DIR
#
# DIR defaults to /tmp/mpikmeans-slurm. Needs root (slurmd starts jobs as their user) and
# Debian's packages:
#   apt-get install --no-install-recommends slurmctld slurmd slurm-client libpmix-dev
# (libpmix-dev: Slurm's mpi/pmix plugin loads the unversioned libpmix.so, which only the
# -dev package ships; without it `srun --mpi=pmix` fails and only LAUNCHER=mpirun works.)
# No systemd, munge or database: auth/none, one node named after this host at 127.0.0.1,
# no cgroups (proctrack/pgid), no accounting. Ports: SLURMCTLD_PORT (16817) and
# SLURMD_PORT (16818), away from a real Slurm's 6817/6818.
# `start` writes DIR/pmix_ok when `srun --mpi=pmix` works.

set -euo pipefail
PATH=$PATH:/usr/sbin:/sbin   # slurmctld and slurmd live there, not always on a user's PATH

action=${1:-}
dir=${2:-/tmp/mpikmeans-slurm}
ctld_port=${SLURMCTLD_PORT:-16817}
slurmd_port=${SLURMD_PORT:-16818}

die() { echo "start_local_slurm: $*" >&2; exit 1; }

stop() {
    local name pidfile pid
    # end this cluster's jobs first, so that no job step outlives its slurmd
    if [[ -r $dir/slurm.conf && -r $dir/slurmctld.pid ]]; then
        SLURM_CONF=$dir/slurm.conf timeout 10 scancel --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 1 25); do
            [[ -z $(SLURM_CONF=$dir/slurm.conf timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
            sleep 0.2
        done
    fi
    for name in slurmd slurmctld; do
        pidfile=$dir/$name.pid
        [[ -r $pidfile ]] || continue
        pid=$(cat "$pidfile")
        if [[ -n $pid ]] && kill "$pid" 2>/dev/null; then
            for _ in $(seq 1 50); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            if kill -0 "$pid" 2>/dev/null; then
                echo "start_local_slurm: $name ($pid) did not stop within 5 s" >&2
            fi
        fi
        rm -f "$pidfile"
    done
}

start() {
    local bin node host state
    [[ $(id -u) -eq 0 ]] || die "must run as root (slurmd launches jobs as their owner)"
    for bin in slurmctld slurmd sbatch sinfo; do
        command -v "$bin" >/dev/null 2>&1 || \
            die "$bin not found: apt-get install --no-install-recommends slurmctld slurmd slurm-client libpmix-dev"
    done
    [[ -r $dir/slurmctld.pid ]] && stop
    rm -rf "$dir/state" "$dir/spool"
    mkdir -p "$dir/state" "$dir/spool" "$dir/log"
    rm -f "$dir/pmix_ok"

    host=$(hostname -s)
    # This machine's CPUs, sockets and memory as slurmd sees them; a node whose slurm.conf
    # line asks for more than it has is drained.
    node=$(slurmd -C | head -n 1)
    [[ $node == NodeName=* ]] || die "slurmd -C gave '$node'"
    node="${node/NodeName=* CPUs=/NodeName=$host NodeAddr=127.0.0.1 CPUs=}"

    cat >"$dir/slurm.conf" <<EOF
# Written by scripts/start_local_slurm.sh: a one-node test cluster, no security.
ClusterName=mpikmeans-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=60
$node State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -f "$SLURM_CONF" || die "slurmctld failed: $(tail -n 5 "$dir/log/slurmctld.log" 2>/dev/null)"
    slurmd -f "$SLURM_CONF" || die "slurmd failed: $(tail -n 5 "$dir/log/slurmd.log" 2>/dev/null)"

    state=
    for _ in $(seq 1 100); do
        state=$(sinfo -h -o %t 2>/dev/null | head -n 1 || true)
        [[ $state == idle ]] && break
        sleep 0.2
    done
    if [[ $state != idle ]]; then
        tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
        stop
        die "the node did not become idle within 20 s (state '$state')"
    fi
    if timeout 30 srun --mpi=pmix --ntasks=1 true >/dev/null 2>&1; then
        touch "$dir/pmix_ok"
    else
        echo "start_local_slurm: srun --mpi=pmix does not work here (libpmix-dev missing?):" \
             "only LAUNCHER=mpirun can be used" >&2
    fi
    echo "export SLURM_CONF=$SLURM_CONF"
}

case $action in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac
