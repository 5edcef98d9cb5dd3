"""How many threads a process should run: the CPUs it may use, and its share of them.

Pure functions of the process's affinity mask, its cgroup's CPU quota and the
``OMP_NUM_THREADS`` / ``NUMBA_NUM_THREADS`` variables; no MPI.  The rank-aware
decision (the node's ranks sharing a mask) is
:func:`mpikmeans.comm.default_threads`, which builds on these; a process on its
own (a library user's :class:`~mpikmeans.backends.cpu.CPUBackend`) gets
:func:`process_threads`, the same decision for one process per node.
"""

from __future__ import annotations

import os

#: Variables by which a batch system or the user says how many threads a process may run.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")


def usable_cpus() -> frozenset:
    """The CPUs this process may run on (its affinity mask: what a launcher's binding or a cpuset left it)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return frozenset(range(os.cpu_count() or 1))


def cgroup_cpu_limit(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs' worth of time this process's cgroup may use (a CPU quota), or None when unlimited.

    A container or a batch job can be given a quota (cgroup v2 ``cpu.max``,
    v1 ``cpu.cfs_quota_us``) on a machine whose every core stays in the
    affinity mask; threads beyond the quota only take turns.  The process's
    own cgroup (from ``proc_cgroup``) and the root of ``root`` are looked at;
    the smallest quota wins.
    """
    own = {}
    try:
        with open(proc_cgroup) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    own[c] = path.lstrip("/")
    except OSError:
        pass
    limits = []

    def read(path: str) -> str | None:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return None

    for base in {os.path.join(root, own.get("", "")), root}:
        text = read(os.path.join(base, "cpu.max"))
        if text:
            quota, _, period = text.partition(" ")
            if quota.isdigit() and period.isdigit() and int(period) > 0:
                limits.append(int(quota) / int(period))
    for base in {os.path.join(root, "cpu", own.get("cpu", "")), os.path.join(root, "cpu")}:
        quota, period = read(os.path.join(base, "cpu.cfs_quota_us")), read(os.path.join(base, "cpu.cfs_period_us"))
        if quota and period and quota.isdigit() and period.isdigit() and int(period) > 0:
            limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def cpus_per_rank(mine: frozenset, node_sets: list, node_size: int, quota: float | None) -> int:
    """This rank's share of its node's CPUs.

    Parameters
    ----------
    mine : frozenset of int
        This rank's affinity mask.
    node_sets : list of frozenset
        The masks of all ranks on the node (this one's included).
    node_size : int
        Ranks on the node.
    quota : float or None
        The cgroup's CPU quota (shared by the node's ranks), if any.

    Returns
    -------
    int
        ``len(mine)`` divided by the number of ranks whose mask overlaps it (a
        rank bound to its own cores keeps them; unbound ranks share them all),
        and at most the quota divided by the node's ranks; at least 1.
    """
    sharing = max(1, sum(1 for s in node_sets if s & mine))
    share = len(mine) // sharing
    if quota is not None:
        share = min(share, int(quota // max(1, node_size)))
    return max(1, share)


def env_thread_limit() -> int | None:
    """The smallest positive count in ``OMP_NUM_THREADS`` / ``NUMBA_NUM_THREADS``, or None when neither sets one.

    ``OMP_NUM_THREADS`` may list nested levels (``"4,2"``): the outer one
    counts.  Empty, zero, negative or non-numeric values are ignored.
    """
    limits = []
    for var in THREAD_VARIABLES:
        value = os.environ.get(var, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            limits.append(int(value))
    return min(limits) if limits else None


def threads_for_share(share: int) -> int:
    """Threads for a process whose share of its node's CPUs is ``share``.

    The share, lowered to :func:`env_thread_limit` when that is set (a batch
    system or the user says how many threads each process may run).  The
    variables only lower it: a batch system may set ``OMP_NUM_THREADS`` to a
    chunk's CPUs for each of the several ranks sharing them.  An explicit
    thread count (``--threads``) is the way to ask for more.

    Parameters
    ----------
    share : int
        CPUs of the node this process may use (:func:`cpus_per_rank`).

    Returns
    -------
    int
        At least 1.
    """
    limit = env_thread_limit()
    return max(1, share if limit is None else min(share, limit))


def own_share() -> int:
    """This process's share of its node's CPUs when it is the node's only rank: its affinity mask, within the quota."""
    mine = usable_cpus()
    return cpus_per_rank(mine, [mine], 1, cgroup_cpu_limit())


def process_threads() -> int:
    """Threads for this process on its own (no communicator): :func:`threads_for_share` of :func:`own_share`.

    What :func:`mpikmeans.comm.default_threads` gives a one-process run, so a
    :class:`~mpikmeans.backends.cpu.CPUBackend` made without a thread count
    runs as many threads as ``mpikmeans run`` would with one rank.
    """
    return threads_for_share(own_share())
