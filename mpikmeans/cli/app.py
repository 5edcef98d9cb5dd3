"""The command group, the guarded start of MPI and the error reporting every command shares.

Exit codes: 0 success, 1 runtime failure, 2 usage error, 3 bad input (4: the
job templates' independent copies, 75: stopped by a signal, resumable).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

import click

from .. import __version__
from ..errors import MpikmeansError

log = logging.getLogger("mpikmeans")


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 iteration``, ``2 iterations``: a count with its noun."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def _launcher_rank() -> int:
    """This process's rank as the launcher announces it, before MPI starts.

    Used only to keep option errors (found before MPI is initialised) from
    being printed once per rank.
    """
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK"):
        value = os.environ.get(var)
        if value and value.isdigit():
            return int(value)
    return 0


def _setup_logging(comm, verbose: int, quiet: bool) -> None:
    """Warnings, notices and ``-v``'s progress lines go to stderr: stdout holds results alone."""
    from ..config import NOTICE

    logging.addLevelName(NOTICE, "NOTICE")
    root = logging.getLogger("mpikmeans")
    root.handlers.clear()
    root.propagate = False
    if comm.rank == 0:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        level = logging.ERROR if quiet else (logging.INFO if verbose else NOTICE)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[rank {comm.rank}] %(message)s"))
        # warnings about the global result are the same on every rank: rank 0 says them
        level = logging.DEBUG if verbose > 1 else logging.ERROR
    root.addHandler(handler)
    root.setLevel(level)


def _traceback_hint() -> str:
    """How the running command shows a traceback: its ``-v`` where it has one."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and any("-v" in p.opts for p in ctx.command.params):
        return "run with -v for the traceback"
    return f"set {TRACEBACK_VARIABLE}=1 for the traceback"


#: Set to 1, any command prints the traceback of an internal error (for commands without -v).
TRACEBACK_VARIABLE = "MPIKMEANS_TRACEBACK"


def _reporter(comm, verbose: int):
    verbose = verbose or os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0")
    hint = _traceback_hint()

    def report(exc, fatal: bool) -> None:
        if isinstance(exc, MpikmeansError):
            if fatal or comm.rank == 0:
                where = f" (rank {comm.rank} on {comm.host})" if fatal and comm.size > 1 else ""
                click.echo(f"mpikmeans: error{where}: {exc.message}", err=True)
            return
        where = f" on rank {comm.rank} ({comm.host})" if comm.size > 1 else ""
        if isinstance(exc, MemoryError):
            click.echo(f"mpikmeans: out of memory{where}: MemoryError: {exc}; use more ranks on more nodes "
                       "(mpikmeans run --dry-run shows the memory each rank needs)", err=True)
        else:
            click.echo(f"mpikmeans: internal error{where}: {type(exc).__name__}: {exc}", err=True)
        if verbose:
            traceback.print_exc()
        else:
            click.echo(f"mpikmeans: {hint}", err=True)
        if comm.size > 1:
            click.echo("mpikmeans: aborting all ranks", err=True)
        sys.stderr.flush()

    return report


#: A file rank 0 writes its exit code and the job's rank count into as it ends (``"75 4"``): the job
#: templates read it, since mpirun's own code after a signal is not the ranks' (see
#: :mod:`mpikmeans.interrupt`), and a count that is not the job's means independent copies ran.
STATUS_VARIABLE = "MPIKMEANS_STATUS_FILE"


def _write_status(path: str | None, comm, code: int) -> None:
    if not path or comm.rank != 0:
        return
    try:
        with open(path, "w") as f:
            f.write(f"{code} {comm.size}\n")
    except OSError as exc:
        click.echo(f"mpikmeans: warning: {STATUS_VARIABLE}={path}: cannot write: {exc.strerror}", err=True)


def _guarded(verbose: int, quiet: bool, body) -> None:
    """Start MPI, run ``body(comm)`` so that no rank can hang, exit with its code."""
    from ..comm import run_guarded, world

    # this process's alone: the processes it starts (compile helpers) must not write it
    status = os.environ.pop(STATUS_VARIABLE, None)
    comm = world()
    _setup_logging(comm, verbose, quiet)
    code = run_guarded(comm, lambda: body(comm), _reporter(comm, verbose))
    _write_status(status, comm, code)
    sys.stdout.flush()
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mpikmeans")
def main():
    """k-means clustering of large ARFF or CSV files over MPI ranks, on GPUs or CPUs.

    \b
    Examples:
      mpikmeans gen-data data.arff -n 1000000 -m 20 -k 16
      mpirun -np 4 mpikmeans run data.arff -k 16
    """


def entry() -> None:
    """Console-script entry point: click's usage errors printed by one rank only."""
    try:
        main.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        if _launcher_rank() == 0:
            exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
