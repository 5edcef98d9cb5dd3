"""``mpikmeans gen-data`` and ``mpikmeans convert``: make an input, or a binary copy of one."""

from __future__ import annotations

import json
import os
import time

import click

from ..config import MISSING_POLICIES
from ..errors import UsageError
from . import _guarded, main


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
@click.option("-v", "--verbose", count=True)
@click.option("-q", "--quiet", is_flag=True)
def gen_data(out, n, m, k, seed, spread, decimals, report, verbose, quiet):
    """Write a synthetic ARFF file of Gaussian blobs (in parallel under mpirun)."""
    from ..io.gen import GenSpec, prepare, write_blobs
    from ..io.output import write_atomic

    def body(comm):
        spec = GenSpec(n=n, m=m, k=k, seed=seed, spread=spread, decimals=decimals)
        try:
            spec.validate()
        except ValueError as exc:
            raise UsageError(str(exc), collective=True) from None
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
            click.echo(f"wrote {out}: {n} rows x {m} attributes, {k} blobs, {size / 1e6:.1f} MB "
                       f"in {dt:.2f} s ({size / 1e6 / dt:.0f} MB/s, {comm.size} rank{'s' if comm.size != 1 else ''}, "
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
@click.option("-q", "--quiet", is_flag=True)
def convert(source, target, ignore, missing, report, quiet):
    """Parse SOURCE (ARFF) once and write TARGET (.npy) for fast repeated runs."""
    from ..io.binary import convert as convert_file
    from ..io.output import write_atomic

    def body(comm):
        if not target.endswith(".npy"):
            raise UsageError(f"{target}: the target must end in .npy", collective=True)
        from ..runner import prepare_read, rank_threads

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
            click.echo(f"wrote {target}: {local.n} rows x {local.m} attributes in {dt:.2f} s "
                       f"(start-up {t_ready - t0:.2f} s) "
                       f"(names in {target}.json); run it with: mpikmeans run {target} -k K")
        return 0

    _guarded(0, quiet, body)
