"""Batch job scripts: self-contained PBS/Torque, PBS Pro and Slurm templates from one source.

Each template in this directory is a scheduler's header, its settings and the
few lines that plan the ranks; the shell functions every template shares
(``common.sh``: settings with defaults, the rank count from a node file, the
launcher's command line, running and explaining the exit code) are written
into it where it says ``# @MPIKMEANS_JOB_FUNCTIONS@``.  The result sources
nothing, so it runs from the scheduler's spool directory, from any directory,
and without a checkout.  The repository's ``pbs/`` files are these renderings
(a test checks), and ``mpikmeans template KIND`` writes them.
"""

from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_MARK = "# @MPIKMEANS_JOB_FUNCTIONS@\n"

#: kind -> (template file, what it is for)
KINDS = {
    "pbs": ("mpi_run.pbs", "PBS/Torque, CPU ranks (nodes=N:ppn=P)"),
    "pbs-gpu": ("mpi_gpu_run.pbs", "PBS/Torque, one rank per GPU (nodes=N:ppn=P:gpus=G)"),
    "pbspro": ("mpi_run_pbspro.pbs", "PBS Pro / OpenPBS (select=N:ncpus=C:mpiprocs=P[:ngpus=G])"),
    "slurm": ("slurm_run.sbatch", "Slurm, srun --mpi=pmix (or LAUNCHER=mpirun), CPU or GPU"),
}


def _read(name: str) -> str:
    with open(os.path.join(_HERE, name), encoding="utf-8") as f:
        return f.read()


def render(kind: str) -> str:
    """The self-contained job script of ``kind`` (one of :data:`KINDS`).

    Raises
    ------
    KeyError
        An unknown kind.
    """
    name = KINDS[kind][0]
    head = _read(name)
    functions = _read("common.sh")
    # the functions' file starts with a directive for shellcheck run on it alone; in the script
    # the shebang says bash already
    functions = functions.split("\n", 1)[1] if functions.startswith("# shellcheck shell=bash") else functions
    block = ("# ==== the job functions (written in by `mpikmeans template`; edit the settings, not these) ====\n"
             + functions.rstrip("\n") + "\n"
             + "# ==== end of the job functions ====\n")
    if head.count(_MARK) != 1:
        raise ValueError(f"{name}: expected one {_MARK.strip()} line")
    # before the first command, so for the whole file: each script calls only some of the functions
    first = "set -euo pipefail\n"
    if head.count(first) != 1:
        raise ValueError(f"{name}: expected one {first.strip()!r} line")
    head = head.replace(first, "# shellcheck disable=SC2329  # functions this kind of job does not call\n" + first)
    return head.replace(_MARK, block)


def file_name(kind: str) -> str:
    """The file name the repository's ``pbs/`` gives ``kind``'s script."""
    return KINDS[kind][0]
