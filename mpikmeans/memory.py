"""What memory this node can give the job: the figure the reader checks a share of the data against, and
the CPU backend its optional scratch."""

from __future__ import annotations

import os


def available_memory() -> int | None:
    """Bytes of memory this node can give the job, if known.

    The smallest of: ``MemAvailable``; the cgroup's limit (a batch system
    often confines a job below the node's memory, and ``MemAvailable`` does
    not show it); ``MPIKMEANS_MEMORY_LIMIT`` (bytes, set by the user).
    """
    limits = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit() and int(text) < 1 << 60:
                limits.append(int(text))
        except OSError:
            pass
    user = os.environ.get("MPIKMEANS_MEMORY_LIMIT", "")
    if user.isdigit():
        limits.append(int(user))
    return min(limits) if limits else None

