"""Command line: ``mpikmeans run | gen-data | convert | info | bench``.

Thin: parse options, call the library, print on rank 0.  The only package that
prints: this module holds the group, the guarded start of MPI and the error
reporting; each command lives in a module of its own (:mod:`.run`, :mod:`.data`,
:mod:`.info`, :mod:`.bench`).  Exit codes: 0 success, 1 runtime failure, 2 usage
error, 3 bad input.
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
    root = logging.getLogger("mpikmeans")
    root.handlers.clear()
    root.propagate = False
    if comm.rank == 0:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        level = logging.ERROR if quiet else (logging.INFO if verbose else logging.WARNING)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[rank {comm.rank}] %(message)s"))
        # warnings about the global result are the same on every rank: rank 0 says them
        level = logging.DEBUG if verbose > 1 else logging.ERROR
    root.addHandler(handler)
    root.setLevel(level)


def _reporter(comm, verbose: int):
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
            click.echo("mpikmeans: run with -v for the traceback", err=True)
        if comm.size > 1:
            click.echo("mpikmeans: aborting all ranks", err=True)
        sys.stderr.flush()

    return report


def _guarded(verbose: int, quiet: bool, body) -> None:
    """Start MPI, run ``body(comm)`` so that no rank can hang, exit with its code."""
    from ..comm import run_guarded, world

    comm = world()
    _setup_logging(comm, verbose, quiet)
    code = run_guarded(comm, lambda: body(comm), _reporter(comm, verbose))
    sys.stdout.flush()
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mpikmeans")
def main():
    """k-means clustering of large ARFF files over MPI ranks, on GPUs or CPUs.

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


# the commands register themselves on ``main`` when imported
from . import bench, data, fullstep, info, run, template, warmup  # noqa: E402

COMMANDS = (bench, data, fullstep, info, run, template, warmup)

if __name__ == "__main__":  # pragma: no cover
    entry()
