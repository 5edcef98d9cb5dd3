# shellcheck shell=bash
# The functions every job template shares (Torque, PBS Pro, Slurm): `mpikmeans template` writes
# them into each script (see mpikmeans/jobs/__init__.py), so no script sources this file.
#
# A template sets the scheduler's resources in its #PBS/#SBATCH lines, works out
# the rank count from the allocation, then calls, in order:
#   mk_settings               run settings (qsub -v / sbatch --export) with defaults
#   mk_plan_nodefile ...      ranks from a PBS node file   (PBS templates), or
#   MK_NP=...                 ranks from the Slurm variables (Slurm template)
#   mk_launch_mpirun / mk_launch_srun    the launcher's command line
#   mk_run                    print what runs, run it, explain the exit code, exit with it
#
# Settings, all optional (qsub -v NAME=VALUE,... / sbatch --export=ALL,NAME=VALUE,...):
#   DATA         input ARFF file, relative to the submit directory  [data/sample.arff, and then K=2]
#   K            number of clusters (or give k in CONFIG)
#   CONFIG       YAML settings file for `mpikmeans run --config`
#   OUT          output directory  [DATA without extension + .<job id>.mpikmeans]
#   ARGS         more `mpikmeans run` options, split on blanks, e.g. "--init range --seed 3 -v"
#   BACKEND      cpu | gpu | auto  [the template's: cpu for CPU jobs, gpu for GPU jobs]
#   NP           number of MPI ranks  [from the allocation]
#   MPIRUN       the launcher  [mpirun found on PATH]
#   MPIRUN_ARGS  more launcher options, split on blanks, e.g. "--mca btl self,vader,tcp"
#                (note: qsub -v splits its list on commas; put such values in the script or
#                in the environment as OMPI_MCA_btl=... instead)
#   VENV         a Python virtual environment holding mpikmeans: $VENV/bin goes first on PATH
#   MPIKMEANS    the mpikmeans command  [mpikmeans found on PATH]
#   INFO=1       run `mpikmeans info` first (ranks, hosts, node-local rank -> GPU)
#   CKPT         checkpoint file  [DATA without extension + .k<K>.<hash of ARGS and CONFIG>.checkpoint.npz]
#   RESUME       auto: go on from CKPT when it exists; 0: remove CKPT and start afresh  [auto]
#
# Exit status of the job: mpikmeans's own (0 success, 1 runtime failure, 2 usage error,
# 3 bad input data, 75 stopped by a signal with its state in CKPT: submit again to go on),
# 4 when the template itself finds a problem after a "successful" run (wrong number of
# ranks), 127 when mpirun/srun/mpikmeans is not found, and 128+N when the run was killed
# by signal N before it could save anything (walltime limit, qdel/scancel, out of memory).
# The code is rank 0's own, which it writes to a status file as it ends (with the rank count
# it saw): after a signal mpirun's own code is 1 whatever the ranks did (Open MPI 4.1 and 5).
# Requires bash 4.2 or later (CentOS 7's is 4.2: empty arrays are expanded with the
# ${a[@]+"${a[@]}"} form for it).

# ---------------------------------------------------------------------------- output

mk_say() { printf 'mpikmeans-job: %s\n' "$*"; }
mk_err() { printf 'mpikmeans-job: error: %s\n' "$*" >&2; }

# ---------------------------------------------------------------------------- settings

# A directory name for this job: the numeric part of the scheduler's job id.
mk_job_tag() {
    local id=${SLURM_JOB_ID:-${PBS_JOBID:-local}}
    id=${id%%.*}                       # 1090.pbs.cluster -> 1090
    printf '%s' "${id//[^A-Za-z0-9_-]/_}"   # array jobs: 1090[3] -> 1090_3_
}

# DATA's path without its extension (as os.path.splitext), + .TAG.mpikmeans
mk_default_out() {
    local data=$1 tag=$2 dir='' base stem
    base=${data##*/}
    [[ $data == */* ]] && dir=${data%/*}/
    stem=${base%.*}
    [[ -z $stem ]] && stem=$base
    printf '%s%s.%s.mpikmeans' "$dir" "$stem" "$tag"
}

# Reads the settings, fills MK_TOOL (the mpikmeans command line) and checks the tools.
# $1: the template's default backend (cpu | gpu | auto).
mk_settings() {
    local default_backend=${1:-auto}
    if [[ -z ${DATA:-} ]]; then
        DATA=data/sample.arff          # the specification's example (appendix 2): 10 rows, k = 2
        K=${K:-2}
    fi
    K=${K:-}
    CONFIG=${CONFIG:-}
    ARGS=${ARGS:-}
    BACKEND=${BACKEND:-$default_backend}
    MPIRUN=${MPIRUN:-mpirun}
    MPIRUN_ARGS=${MPIRUN_ARGS:-}
    MPIKMEANS=${MPIKMEANS:-mpikmeans}
    INFO=${INFO:-0}
    OUT=${OUT:-$(mk_default_out "$DATA" "$(mk_job_tag)")}
    if [[ -n ${VENV:-} ]]; then
        PATH="$VENV/bin:$PATH"
        export PATH
    fi

    if [[ -n $K && ! $K =~ ^[1-9][0-9]*$ ]]; then
        mk_err "K must be a positive integer, not '$K'"
        exit 2
    fi
    if [[ -z $K && -z $CONFIG ]]; then
        mk_err "no K: pass K=... (qsub -v K=50 / sbatch --export=ALL,K=50) or a CONFIG file that sets k"
        exit 2
    fi
    case $BACKEND in
        cpu | gpu | auto) ;;
        *) mk_err "BACKEND must be cpu, gpu or auto, not '$BACKEND'"; exit 2 ;;
    esac
    if ! command -v "$MPIKMEANS" >/dev/null 2>&1; then
        mk_err "'$MPIKMEANS' not found on PATH ($PATH): activate the virtual environment" \
               "that has mpikmeans in the template (or pass VENV=/path/to/venv)"
        exit 127
    fi

    local extra=()
    read -r -a extra <<<"$ARGS"
    MK_TOOL=("$MPIKMEANS" run "$DATA" --output-dir "$OUT" --backend "$BACKEND")
    [[ -n $K ]] && MK_TOOL+=(-k "$K")
    [[ -n $CONFIG ]] && MK_TOOL+=(--config "$CONFIG")
    MK_TOOL+=(${extra[@]+"${extra[@]}"})

    # Checkpoint and resume across walltime: the ranks save their state when the
    # scheduler's SIGTERM (or an earlier SIGUSR1) arrives; a resubmitted job with the
    # same DATA, K, ARGS and CONFIG finds the file and goes on from it (RESUME=0 starts
    # afresh). The name holds a hash of ARGS and CONFIG's content, so a job with other
    # settings never picks up this one's state (and mpikmeans refuses a checkpoint made
    # under other settings, naming the difference).
    CKPT=${CKPT:-${DATA%.*}.k${K:-cfg}.$(mk_settings_hash).checkpoint.npz}
    MK_TOOL+=(--checkpoint "$CKPT")
    if [[ -f $CKPT ]]; then
        if [[ ${RESUME:-auto} == 0 ]]; then
            mk_say "RESUME=0: removing the checkpoint $CKPT and starting afresh"
            rm -f -- "$CKPT"
        else
            mk_say "resuming from $CKPT"
            MK_TOOL+=(--resume "$CKPT")
        fi
    fi
    return 0
}

# Eight hex digits from ARGS and the CONFIG file's content: the settings a checkpoint's name
# depends on besides DATA and K.
mk_settings_hash() {
    {
        printf '%s\n' "$ARGS"
        if [[ -n $CONFIG && -r $CONFIG ]]; then cat -- "$CONFIG"; fi
    } | cksum | awk '{ printf "%08x", $1 }'
}

# ---------------------------------------------------------------------------- allocation

# From a PBS node file (one line per slot): MK_HOSTFILE, MK_NODES, MK_SLOTS, MK_NP and
# MK_PER_NODE (ranks per node when fixed, else empty).
# $1: node file; $2: GPUs per node (0 for a CPU job: one rank per slot).
mk_plan_nodefile() {
    local nodefile=$1 gpus=${2:-0}
    if [[ -z $nodefile || ! -r $nodefile ]]; then
        mk_err "no readable node file ('$nodefile'): is this running inside a PBS job?"
        exit 2
    fi
    MK_HOSTFILE=$nodefile
    MK_SLOTS=$(grep -c . "$nodefile" || true)
    MK_NODES=$(grep . "$nodefile" | sort -u | wc -l)
    MK_NODES=${MK_NODES//[[:space:]]/}
    MK_PER_NODE=
    if [[ $gpus -gt 0 ]]; then
        MK_PER_NODE=$gpus
        MK_NP=${NP:-$((MK_NODES * gpus))}
    else
        MK_NP=${NP:-${PBS_NP:-$MK_SLOTS}}
    fi
    if [[ ! $MK_NP =~ ^[1-9][0-9]*$ ]]; then
        mk_err "cannot tell the number of ranks (NP='$MK_NP')"
        exit 2
    fi
}

# One line per node: "host:slots ..." in node-file order.
mk_hosts_summary() {
    awk 'NF { if (!($1 in c)) o[++n] = $1; c[$1]++ }
         END { for (i = 1; i <= n; i++) printf "%s%s:%d", (i > 1 ? " " : ""), o[i], c[o[i]] }' "$1"
}

# ---------------------------------------------------------------------------- launchers

# openmpi | mpich | intel | unknown, from `$MPIRUN --version`.
mk_mpi_flavor() {
    local v
    v=$("$MPIRUN" --version 2>&1 | head -n 20) || true
    case $v in
        *"Open MPI"* | *OpenRTE* | *PRRTE*) echo openmpi ;;
        *"Intel(R) MPI"*) echo intel ;;
        *HYDRA* | *MPICH* | *MVAPICH*) echo mpich ;;
        *) echo unknown ;;
    esac
}

# True when this Open MPI can launch through PBS's TM interface (plm component "tm").
# Open MPI 4 lists it in ompi_info; Open MPI 5 moved launching to PRRTE, listed by prte_info.
mk_ompi_has_tm() {
    local dir tool
    dir=$(dirname -- "$(command -v "$MPIRUN")")
    for tool in "$dir/prte_info" "$dir/ompi_info" prte_info ompi_info; do
        if command -v "$tool" >/dev/null 2>&1; then
            if "$tool" 2>/dev/null | grep -Eq 'MCA plm:[[:space:]]+tm[[:space:]]'; then
                return 0
            fi
        fi
    done
    return 1
}

# True when MPIRUN_ARGS already has option $1 (then the template does not add its own).
mk_has_opt() {
    case " $MPIRUN_ARGS " in
        *" $1 "* | *" $1="* | *" ${1#-} "*) return 0 ;;
        *) return 1 ;;
    esac
}

# MK_LAUNCH: the mpirun command line (without the program), for MK_NP ranks,
# MK_PER_NODE ranks per node when set, on the hosts of MK_HOSTFILE when set.
# $1: binding for Open MPI (core for one rank per core, none for GPU ranks).
mk_launch_mpirun() {
    local bind=${1:-} extra=()
    if ! command -v "$MPIRUN" >/dev/null 2>&1; then
        mk_err "'$MPIRUN' not found on PATH: load the MPI module mpi4py was built with"
        exit 127
    fi
    MK_FLAVOR=$(mk_mpi_flavor)
    MK_TM=no
    MK_LAUNCH=("$MPIRUN" -np "$MK_NP")
    case $MK_FLAVOR in
        openmpi)
            # With tm support mpirun takes hosts and slots from PBS itself and starts the
            # remote daemons through it (no ssh); without, it needs the node file.
            if [[ -n ${MK_HOSTFILE:-} ]]; then
                if mk_ompi_has_tm; then
                    MK_TM=yes
                else
                    MK_LAUNCH+=(--hostfile "$MK_HOSTFILE")
                fi
            fi
            if [[ -n ${MK_PER_NODE:-} ]] && ! mk_has_opt --map-by; then
                MK_LAUNCH+=(--map-by "ppr:$MK_PER_NODE:node")
            fi
            if [[ -n $bind ]] && ! mk_has_opt --bind-to; then
                MK_LAUNCH+=(--bind-to "$bind")
            fi
            # rank 0's status file (mk_run), wherever rank 0 runs: Open MPI passes a variable
            # to other nodes only when told
            MK_LAUNCH+=(-x MPIKMEANS_STATUS_FILE)
            # An error on one rank ends the job: Open MPI aborts the whole job when a
            # rank exits non-zero or calls MPI_Abort by default (Open MPI 4's
            # orte_abort_on_non_zero_status and PRRTE's prte_ equivalent are on by
            # default), so no option is needed here.
            ;;
        mpich | intel)
            # Hydra (MPICH, MVAPICH, Intel MPI) also reads PBS_NODEFILE by itself;
            # -ppn fixes the ranks per node (one per GPU).
            [[ -n ${MK_HOSTFILE:-} ]] && MK_LAUNCH+=(-f "$MK_HOSTFILE")
            [[ -n ${MK_PER_NODE:-} ]] && MK_LAUNCH+=(-ppn "$MK_PER_NODE")
            ;;
        *)
            [[ -n ${MK_HOSTFILE:-} ]] && MK_LAUNCH+=(-machinefile "$MK_HOSTFILE")
            ;;
    esac
    read -r -a extra <<<"$MPIRUN_ARGS"
    MK_LAUNCH+=(${extra[@]+"${extra[@]}"})
    return 0
}

# MK_LAUNCH for Slurm's srun: MK_NP tasks over the allocation; one task failing ends
# the step. SRUN_MPI: the PMI plugin (pmix for Open MPI 5 and recent MPICH;
# pmi2 for Intel MPI with I_MPI_PMI_LIBRARY set).
mk_launch_srun() {
    local extra=()
    MK_FLAVOR="srun --mpi=${SRUN_MPI:-pmix}"
    MK_TM=n/a
    if ! command -v srun >/dev/null 2>&1; then
        mk_err "srun not found on PATH"
        exit 127
    fi
    # --cpus-per-task is passed on explicitly: srun of Slurm 22.05-23.02 no longer
    # inherits it from the job.
    MK_LAUNCH=(srun "--mpi=${SRUN_MPI:-pmix}" "--ntasks=$MK_NP" "--cpus-per-task=${SLURM_CPUS_PER_TASK:-1}"
               --kill-on-bad-exit=1)
    read -r -a extra <<<"${SRUN_ARGS:-}"
    MK_LAUNCH+=(${extra[@]+"${extra[@]}"})
    return 0
}

# ---------------------------------------------------------------------------- run

mk_explain() {
    local rc=$1
    case $rc in
        0) local where=$OUT
           [[ $where != /* ]] && where=$PWD/$where
           mk_say "finished: results in $where/ (centers.csv, labels.txt, summary.json)" ;;
        1) mk_say "exit 1: runtime failure (see the mpikmeans error above; a crash on one rank aborts all ranks)" ;;
        2) mk_say "exit 2: usage error (options, K, the CONFIG file)" ;;
        3) mk_say "exit 3: bad input data or an unreadable DATA file (the message above names the file, line, attribute)" ;;
        4) mk_say "exit 4: the run did not use the ranks it was given (see above)" ;;
        75) if [[ ${MK_CKPT_FRESH:-0} == 1 ]]; then
                mk_say "exit 75: stopped before the walltime with the state saved in $CKPT;" \
                       "submit the same job again (same DATA, K, ARGS and CONFIG) and it resumes from there"
            else
                mk_say "exit 75: stopped by a signal before there was a state to save;" \
                       "submit the same job again and it starts afresh"
            fi ;;
        127) mk_say "exit 127: a command was not found (MPI module or virtual environment not loaded?)" ;;
        137) mk_say "exit 137: killed (SIGKILL): walltime or memory limit exceeded, or the job was deleted" ;;
        130) mk_say "exit 130: interrupted (SIGINT)" ;;
        138) mk_say "exit 138: stopped on SIGUSR1 (a pre-timeout signal, e.g. sbatch --signal=B:USR1@60)" ;;
        143) mk_say "exit 143: terminated (SIGTERM): walltime limit reached, or qdel/scancel" ;;
        *) if [[ $rc -gt 128 ]]; then
               mk_say "exit $rc: killed by signal $((rc - 128))"
           else
               mk_say "exit $rc: the launcher failed (MPI not matching mpi4py's, hosts unreachable, ...)"
           fi ;;
    esac
}

# The signal the launcher gets when the job script is told to stop. SIGTERM or SIGINT make
# Open MPI's mpirun (4.1 and 5) kill the ranks within 0.5-2 s, drop their output and exit 1;
# SIGUSR2 it passes on as it is (Open MPI 4.1 swallows SIGUSR1), as srun does: the ranks finish
# their iteration, save the checkpoint and exit 75, and mpirun with them.
mk_stop_signal() {
    case ${MK_FLAVOR:-} in
        openmpi | srun*) echo USR2 ;;
        *) echo "$1" ;;
    esac
}

_mk_on_signal() {
    MK_SIGNAL=$1
    mk_say "received SIG$1 (walltime limit, qdel or scancel): stopping the ranks"
    if [[ -n ${MK_PID:-} ]]; then
        kill -s "$(mk_stop_signal "$1")" "$MK_PID" 2>/dev/null || true
    fi
}

# Check that the result was computed by MK_NP ranks: a launcher that does not
# match the MPI of mpi4py starts NP independent one-rank runs instead of one job.
mk_check_ranks() {
    local summary=$OUT/summary.json ranks
    if [[ ! -r $summary ]]; then
        mk_err "$summary missing after a successful run"
        return 4
    fi
    ranks=$(grep -Eo '"ranks": *[0-9]+' "$summary" | grep -Eo '[0-9]+$' || true)
    if [[ $ranks != "$MK_NP" ]]; then
        mk_err "summary.json says ranks=${ranks:-?} but the job started $MK_NP: the launcher" \
               "ran independent copies (mpi4py built for another MPI, or the wrong srun --mpi plugin)"
        return 4
    fi
    return 0
}

# Prints what will run, runs it (mpikmeans info first when INFO=1), passes SIGTERM/SIGINT
# on to the launcher, explains the exit code and exits with it.
mk_run() {
    local cmd=("${MK_LAUNCH[@]}" "${MK_TOOL[@]}") rc=0
    mk_say "job ${SLURM_JOB_ID:-${PBS_JOBID:-(none)}} '${SLURM_JOB_NAME:-${PBS_JOBNAME:-}}' on $(hostname), started $(date '+%F %T')"
    mk_say "directory: $PWD"
    if [[ -n ${MK_HOSTFILE:-} ]]; then
        mk_say "nodes: $(mk_hosts_summary "$MK_HOSTFILE")  (host:slots)"
    elif [[ -n ${SLURM_JOB_NODELIST:-} ]]; then
        mk_say "nodes: $SLURM_JOB_NODELIST (${SLURM_NNODES:-?} node(s), tasks per node ${SLURM_TASKS_PER_NODE:-?})"
    fi
    mk_say "ranks: $MK_NP${MK_PER_NODE:+ ($MK_PER_NODE per node)}, backend $BACKEND, launcher $MK_FLAVOR (tm: $MK_TM)"
    mk_say "mpikmeans: $(command -v "$MPIKMEANS")"
    mk_say "command: $(printf '%q ' "${cmd[@]}")"

    MK_SIGNAL=
    MK_PID=
    trap '_mk_on_signal TERM' TERM
    trap '_mk_on_signal INT' INT
    trap '_mk_on_signal USR1' USR1

    # rank 0 writes its exit code here as it ends; in the submit directory, which every node sees
    MK_STATUS=$PWD/.mpikmeans-status.$(mk_job_tag).$$
    export MPIKMEANS_STATUS_FILE=$MK_STATUS

    if [[ $INFO == 1 ]]; then
        "${MK_LAUNCH[@]}" "$MPIKMEANS" info || mk_say "mpikmeans info failed (exit $?); running anyway"
    fi

    SECONDS=0
    local started status ranks
    started=$(mktemp "${TMPDIR:-/tmp}/mpikmeans-start.XXXXXX")
    rm -f -- "$MK_STATUS"
    # In the background so that a signal reaches the trap at once (bash runs traps only
    # between commands); the launcher's exit status comes back through wait.
    "${cmd[@]}" &
    MK_PID=$!
    while :; do
        rc=0
        wait "$MK_PID" || rc=$?
        # wait returns early (>128) when a trapped signal arrives while the launcher runs
        if [[ $rc -gt 128 ]] && kill -0 "$MK_PID" 2>/dev/null; then
            continue
        fi
        break
    done
    MK_PID=
    MK_CKPT_FRESH=0
    [[ -f $CKPT && $CKPT -nt $started ]] && MK_CKPT_FRESH=1
    status=
    ranks=
    [[ -r $MK_STATUS ]] && read -r status ranks _ <"$MK_STATUS"
    if [[ $ranks =~ ^[0-9]+$ && $ranks != "$MK_NP" ]]; then
        mk_err "mpikmeans's status says ranks=$ranks but the job started $MK_NP: the launcher" \
               "ran independent copies (mpi4py built for another MPI, or the wrong srun --mpi plugin)"
        rc=4
    elif [[ $status =~ ^[0-9]+$ ]]; then
        rc=$status   # rank 0's own code: after a signal mpirun's says only that it was signalled
    elif [[ -n $MK_SIGNAL && $MK_CKPT_FRESH == 1 ]]; then
        rc=75   # killed after saving their state: a distinct code, so a wrapper can resubmit
    elif [[ -n $MK_SIGNAL ]]; then
        rc=$((128 + $(kill -l "$MK_SIGNAL")))   # the launcher's own code would hide why it stopped
    fi
    rm -f -- "$started" "$MK_STATUS"
    if [[ $rc -eq 0 ]]; then
        mk_check_ranks || rc=$?
        [[ $rc -eq 0 ]] && rm -f "$CKPT"   # finished: a later job must start afresh
    fi
    mk_explain "$rc"
    mk_say "elapsed ${SECONDS} s, exit $rc"
    exit "$rc"
}
