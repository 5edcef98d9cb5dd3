"""``mpikmeans gen-data`` and ``mpikmeans convert``: make an input, or a binary copy of one."""

from __future__ import annotations

import json
import os
import time

import click

from ..config import MISSING_POLICIES
from ..errors import UsageError
from .app import _guarded, main, plural

#: Above this many bytes, what a command is about to write or read is said first (seconds of work).
_BIG = 1_000_000_000


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_to_replace(outputs: list, inputs: list, overwrite: bool) -> None:
    """Check, before any work, that no output would write over an input or, without ``overwrite``, a file.

    Parameters
    ----------
    outputs : list of (str, str)
        (what, path) of each file the command writes; None paths are skipped.
    inputs : list of (str, str)
        (what, path) of each file it reads.
    overwrite : bool

    Raises
    ------
    UsageError
        Naming every output that is in the way.
    """
    outputs = [(what, path) for what, path in outputs if path]
    for what, path in outputs:
        for in_what, in_path in inputs:
            if _same_file(path, in_path):
                raise UsageError(f"{path}: {what} is the command's input ({in_what}): choose another name "
                                 "(an input is never written over)")
        if os.path.isdir(path):
            raise UsageError(f"{path}: {what} is a directory")
    taken = [path for _, path in outputs if os.path.lexists(path)]
    if taken and not overwrite:
        raise UsageError(f"{', '.join(taken)}: already exist{'s' if len(taken) == 1 else ''}; pass --overwrite to "
                         "replace, or choose another name")


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


@main.command("gen-data")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("-n", "n", type=click.IntRange(min=1), required=True, help="Rows.")
@click.option("-m", "m", type=click.IntRange(min=1), required=True, help="Attributes.")
@click.option("-k", "k", type=click.IntRange(min=1), required=True, help="Blobs.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--spread", type=float, default=1.0, show_default=True, help="Standard deviation of each blob.")
@click.option("--decimals", type=click.IntRange(0, 14), default=10, show_default=True,
              help="Digits after the decimal point.")
@click.option("--report", type=click.Path(dir_okay=False),
              help="Also write the figures as JSON here: bytes, write_s, startup_s, ranks (for benchmarks).")
@click.option("--overwrite", is_flag=True, help="Replace OUT (and the --report file) if they exist.")
@click.option("-v", "--verbose", count=True)
@click.option("-q", "--quiet", is_flag=True)
def gen_data(out, n, m, k, seed, spread, decimals, report, overwrite, verbose, quiet):
    """Write a synthetic ARFF file of Gaussian blobs (in parallel under mpirun).

    An existing OUT is never replaced without --overwrite.
    """
    from ..io.gen import GenSpec, prepare, write_blobs
    from ..io.output import write_atomic

    def body(comm):
        spec = GenSpec(n=n, m=m, k=k, seed=seed, spread=spread, decimals=decimals)
        try:
            spec.validate()
        except ValueError as exc:
            raise UsageError(str(exc), collective=True) from None
        if report and os.path.abspath(report) == os.path.abspath(out):
            raise UsageError(f"--report {report}: the same file as OUT", collective=True)
        comm.from_root(lambda: refuse_to_replace([("OUT", out), ("--report", report)], [], overwrite))
        # a value takes its digits, the point, a sign, up to two integer digits and a separator
        estimate = n * (m * (decimals + 4.5) + 1)
        if comm.rank == 0 and not quiet and estimate > _BIG:
            click.echo(f"gen-data: writing about {_gb(estimate)} to {out} ({plural(n, 'row')} x "
                       f"{plural(m, 'attribute')})", err=True)
        # the one-time start-up (Numba, the formatter's cached kernels) is timed apart from the writing
        t0 = time.perf_counter()
        prepare(comm)
        t_ready = time.perf_counter()
        size = write_blobs(spec, out, comm)
        dt = time.perf_counter() - t_ready
        if report and comm.rank == 0:
            # the benchmarks read these figures here, never from the line printed below
            figures = {"path": os.path.abspath(out), "bytes": size, "write_s": dt, "startup_s": t_ready - t0,
                       "ranks": comm.size, "n": n, "m": m, "k": k, "seed": seed, "decimals": decimals}
            write_atomic(report, (json.dumps(figures, indent=1) + "\n").encode())
        if comm.rank == 0 and not quiet:
            click.echo(f"wrote {out}: {plural(n, 'row')} x {plural(m, 'attribute')}, {plural(k, 'blob')}, "
                       f"{size / 1e6:.1f} MB in {dt:.2f} s ({size / 1e6 / dt:.0f} MB/s, {plural(comm.size, 'rank')}, "
                       f"start-up {t_ready - t0:.2f} s)")
        return 0

    _guarded(verbose, quiet, body)


@main.command()
@click.argument("source", type=click.Path(dir_okay=False))
@click.argument("target", type=click.Path(dir_okay=False))
@click.option("--ignore", help="Numeric attributes to leave out (as for run).")
@click.option("--missing", type=click.Choice(MISSING_POLICIES), default="error", show_default=True)
@click.option("--report", type=click.Path(dir_okay=False),
              help="Also write the figures as JSON here: bytes read and written, convert_s (read_s + write_s "
                   "on rank 0), startup_s, ranks.")
@click.option("--overwrite", is_flag=True, help="Replace TARGET, TARGET.json (and the --report file) if they exist.")
@click.option("-q", "--quiet", is_flag=True)
def convert(source, target, ignore, missing, report, overwrite, quiet):
    """Parse SOURCE (ARFF or CSV) once and write TARGET (.npy) for fast repeated runs.

    The attribute names go to TARGET.json.  Existing files are never replaced
    without --overwrite, and SOURCE never.
    """
    from ..io.formats import check_convert_target, convert as convert_file
    from ..io.output import write_atomic

    def body(comm):
        npy, names = check_convert_target(target)
        outputs = [("TARGET", npy), ("TARGET's names", names), ("--report", report)]
        if report and os.path.abspath(report) in (os.path.abspath(npy), os.path.abspath(names)):
            raise UsageError(f"--report {report}: the same file as TARGET or its names", collective=True)
        comm.from_root(lambda: refuse_to_replace(outputs, [("SOURCE", source)], overwrite))
        if comm.rank == 0 and not quiet:
            try:
                size = os.path.getsize(source)
            except OSError:
                size = 0
            if size > _BIG:
                click.echo(f"convert: parsing {source} ({_gb(size)}) on {plural(comm.size, 'rank')}", err=True)
        from ..faults import fault_point
        from ..startup import prepare_read, rank_threads

        fault_point(comm.rank, "read")

        t0 = time.perf_counter()
        threads = rank_threads(comm)
        prepare_read(comm, source, threads)  # the reader's one-time start-up, reported apart
        t_ready = time.perf_counter()
        phases = {}
        local = convert_file(comm, source, target, ignore=ignore, missing=missing, threads=threads, timings=phases)
        dt = time.perf_counter() - t_ready
        if report and comm.rank == 0:
            figures = {"source": os.path.abspath(source), "target": os.path.abspath(target),
                       "source_bytes": os.path.getsize(source), "target_bytes": os.path.getsize(target),
                       "convert_s": dt, "startup_s": t_ready - t0, "ranks": comm.size, "n": local.n, "m": local.m,
                       **phases}
            write_atomic(report, (json.dumps(figures, indent=1) + "\n").encode())
        if comm.rank == 0 and not quiet:
            click.echo(f"wrote {target}: {plural(local.n, 'row')} x {plural(local.m, 'attribute')} in {dt:.2f} s "
                       f"(start-up {t_ready - t0:.2f} s) "
                       f"(names in {names}); run it with: mpikmeans run {target} -k K")
        return 0

    _guarded(0, quiet, body)
