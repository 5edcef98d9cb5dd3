"""The ARFF read at one rank, split into its parts by wrapping the reader's functions.

Run by ``mpikmeans bench read`` as a file, in a process of its own, with
``PYTHONPATH`` naming the package version to measure: so it imports only
absolutely (``mpikmeans.io...`` is whichever version that is), and this code is
the current version's whatever the version measured::

    python -c "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')" \\
        readphases.py FILE THREADS REPEATS WARM_FILE OUT_JSON

Parts: ``read_file`` (file reads), ``cut_lines`` (finding line ends), ``parse``,
``min_max``, ``header``, ``memory_check``, ``span_other`` (copies, allocation,
Python between the kernels of a span) and ``other`` (the rest of the total).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time


def phases(path: str, threads: int, repeats: int, warm_file: str) -> dict:
    """The read of ``path`` at one rank in parts, best of ``repeats``.

    Parameters
    ----------
    path : str
        The ARFF file.
    threads : int
        Parse threads.
    repeats : int
    warm_file : str
        A small ARFF file read first, so no timing includes compiling or loading kernels.

    Returns
    -------
    dict
        ``total_s``, ``cpu_s`` (process time), ``parts_s`` (seconds per part), ``MB_per_s``.
    """
    import numba
    import numpy as np

    import mpikmeans.io.arff as A
    import mpikmeans.io.rowparse as R
    from mpikmeans.comm import SerialComm

    try:  # the memory check moved out of the reader into io.split; older versions keep it in io.arff
        import mpikmeans.io.split as S
    except ImportError:
        S = A
    owners = [m for m in (R, S) if m is not A] + [A]

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    spent: dict = {}

    def add(label, t0):
        spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

    def wrap(mod, name, label):
        f = getattr(mod, name, None)
        if f is None:  # another version may not have this part
            return

        @functools.wraps(f)
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                add(label, t0)

        setattr(mod, name, timed)

    for name, label in [("line_cuts", "cut_lines"), ("last_newline", "cut_lines"), ("parse_parallel", "parse"),
                        ("column_min_max", "min_max"), ("_parse_span", "span"), ("_read_into", "read_file"),
                        ("read_header", "header"), ("check_memory", "memory_check")]:
        wrap(next((m for m in owners if hasattr(m, name)), A), name, label)
    wrap(os, "pread", "read_file")
    flatnonzero = np.flatnonzero
    A.np = type(np)("numpy_wrapped")  # an older reader found newlines with np.flatnonzero: time it too
    A.np.__dict__.update(np.__dict__)

    def timed_flatnonzero(*a):
        t0 = time.perf_counter()
        try:
            return flatnonzero(*a)
        finally:
            add("cut_lines", t0)

    A.np.flatnonzero = timed_flatnonzero
    comm = SerialComm()
    A.read_arff(warm_file, comm, threads=threads)  # compile / load the kernels
    best = None
    for _ in range(repeats):
        spent.clear()
        c0, t0 = time.process_time(), time.perf_counter()
        header = A.shared_header(path, comm)
        (S if hasattr(S, "check_memory") else A).check_memory(path, header, comm)
        data = A.read_arff(path, comm, header=header, threads=threads)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        del data
        parts = dict(spent)
        inside = sum(parts.get(k, 0.0) for k in ("read_file", "cut_lines", "parse"))
        parts["span_other"] = parts.pop("span", 0.0) - inside
        parts["other"] = total - sum(v for k, v in parts.items())
        if best is None or total < best["total_s"]:
            best = {"total_s": total, "cpu_s": cpu, "parts_s": parts}
    best["MB_per_s"] = os.path.getsize(path) / 1e6 / best["total_s"]
    return best


if __name__ == "__main__":
    _, FILE, THREADS, REPEATS, WARM, OUT = sys.argv
    with open(OUT, "w") as out:
        json.dump(phases(FILE, int(THREADS), int(REPEATS), WARM), out)
