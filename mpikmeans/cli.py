"""Command line: ``mpikmeans run | gen-data | info``.

Thin: parse options, call the library, print on rank 0.  The only module that
prints.  Exit codes: 0 success, 1 runtime failure, 2 usage error, 3 bad input.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback

import click
from click.core import ParameterSource

from . import __version__
from .config import BACKENDS, DTYPES, EMPTY_POLICIES, build_config, load_yaml
from .errors import MpikmeansError, RunError, UsageError

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
        level = logging.DEBUG if verbose > 1 else logging.WARNING
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
    from .comm import run_guarded, world

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


# --------------------------------------------------------------------------- run

_RUN_KEYS = ("k", "init", "seed", "max_iter", "tol", "backend", "dtype", "empty_cluster",
             "output_dir", "threads", "share_gpus", "chunk_rows")


@main.command()
@click.argument("data", type=click.Path(dir_okay=False))
@click.option("-k", "k", type=int, help="Number of clusters (required, here or in --config).")
@click.option("--init", help="range | sample | FILE.csv of k x m centres  [default: sample]")
@click.option("--seed", type=int, help="Seed of the initialisation  [default: 0]")
@click.option("--max-iter", type=int, help="Most Lloyd iterations  [default: 300]")
@click.option("--tol", type=float, help="Stop when no centre moves more than this; 0 = until labels are stable  [default: 0]")
@click.option("--backend", type=click.Choice(BACKENDS), help="[default: auto]")
@click.option("--dtype", type=click.Choice(DTYPES), help="Precision of the data on the GPU  [default: float64]")
@click.option("--empty-cluster", type=click.Choice(EMPTY_POLICIES), help="Empty-cluster policy  [default: keep]")
@click.option("--output-dir", "-o", help="Default: DATA's stem + .mpikmeans/")
@click.option("--threads", type=int, help="CPU threads per rank  [default: cores / ranks on the node]")
@click.option("--share-gpus", is_flag=True, default=None, help="Allow more ranks per node than GPUs.")
@click.option("--chunk-rows", type=int, help="GPU: stream the data in chunks of this many rows.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML file of settings (keys = option names).")
@click.option("-v", "--verbose", count=True, help="One line per iteration (-vv: more).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@click.pass_context
def run(ctx, data, config_path, verbose, quiet, **options):
    """Cluster DATA (an ARFF file) into K clusters."""
    given = {key: options[key] for key in _RUN_KEYS
             if ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE and options[key] is not None}

    def body(comm):
        try:
            cfg = build_config(load_yaml(config_path) if config_path else {}, given)
        except UsageError as exc:
            exc.collective = True  # same arguments and files on every rank
            raise
        return _run(comm, data, cfg, quiet)

    _guarded(verbose, quiet, body)


def _default_output_dir(data: str) -> str:
    stem, _ = os.path.splitext(data)
    return stem + ".mpikmeans"


def _run(comm, data: str, cfg, quiet: bool) -> int:
    import numpy as np

    from .arff import read_arff
    from .faults import fault_point
    from .backends import BackendUnavailable
    from .backends.cpu import default_threads
    from .kmeans import check_centres, init_range, init_sample, lloyd
    from .output import read_centres_csv, write_arrays, write_summary

    t0 = time.perf_counter()
    fault_point(comm.rank, "read")
    local = read_arff(data, comm)
    t_read = time.perf_counter()

    threads = cfg.threads or default_threads(comm.node_size)
    backend, error = None, None
    try:
        backend = _make_backend(comm, cfg, threads)
        backend.load(local.x)
    except (BackendUnavailable, MpikmeansError) as exc:
        error = RunError(str(exc))
    comm.agree(error)

    k, m = cfg.k, local.m
    if cfg.init == "range":
        centres = init_range(k, local.mins, local.maxs, cfg.seed)
    elif cfg.init == "sample":
        try:
            centres = init_sample(comm, k, local.x, local.row_offset, local.n, cfg.seed)
        except UsageError as exc:  # k > n: found before any collective, on every rank
            exc.collective = True
            raise
    else:
        centres, message = None, None
        if comm.rank == 0:
            try:
                centres = check_centres(read_centres_csv(cfg.init)[0], k, m, cfg.init)
            except (ValueError, OSError) as exc:
                message = f"--init {cfg.init}: {exc}"
            except MpikmeansError as exc:
                message = exc.message
        centres, message = comm.bcast((centres, message), root=0)
        if message is not None:
            raise UsageError(message, collective=True)
    t_init = time.perf_counter()

    result = lloyd(comm, backend, local.x, local.row_offset, centres, max_iter=cfg.max_iter,
                   tol=cfg.tol, empty_cluster=cfg.empty_cluster)
    t_compute = time.perf_counter()

    info = backend.info()
    devices = [d for per_rank in comm.allgather(info.devices) for d in per_rank]
    hosts = sorted(set(comm.allgather(comm.host)))
    bytes_read = int(comm.allreduce(np.array([local.bytes_read], dtype=np.int64), "sum")[0])
    out_dir = cfg.output_dir or _default_output_dir(data)
    summary = {
        "version": __version__,
        "data": os.path.abspath(data),
        "relation": local.header.relation,
        "k": k,
        "n": local.n,
        "m": m,
        "attributes": local.header.names,
        "iterations": result.iterations,
        "converged": result.converged,
        "stop_reason": result.stop_reason,
        "inertia": result.inertia,
        "sizes": [int(s) for s in result.sizes],
        "ranks": comm.size,
        "hosts": hosts,
        "rows_per_rank": local.counts,
        "backend": info.name,
        "devices": devices,
        "threads_per_rank": info.threads,
        "dtype": info.dtype,
        "init": cfg.init,
        "seed": cfg.seed,
        "tol": cfg.tol,
        "max_iter": cfg.max_iter,
        "empty_cluster": cfg.empty_cluster,
        "empty_relocations": result.relocated,
        "mpi_library": comm.library(),
        "bytes_read": bytes_read,
        "timings": {},
        "history": result.history,
    }
    fault_point(comm.rank, "write")
    write_arrays(comm, out_dir, result.centres, local.header.names, result.labels)
    t_written = time.perf_counter()
    summary["timings"] = {
        "read_s": t_read - t0,
        "init_s": t_init - t_read,
        "compute_s": t_compute - t_init,
        "write_s": t_written - t_compute,
        "total_s": t_written - t0,
        "per_iteration_s": (t_compute - t_init) / max(1, result.iterations),
    }
    write_summary(comm, out_dir, summary)
    backend.close()
    if comm.rank == 0 and not quiet:
        _print_summary(summary, out_dir)
    return 0


def _make_backend(comm, cfg, threads):
    from .backends import make_backend

    options = {"threads": threads, "dtype": cfg.dtype, "chunk_rows": cfg.chunk_rows}
    if cfg.backend in ("gpu", "auto"):
        try:
            from .backends.gpu import gpu_available, select_device_for
        except ImportError:
            gpu_available = None
        if gpu_available is not None and (cfg.backend == "gpu" or gpu_available()):
            options["device"] = select_device_for(comm.node_rank, comm.node_size, cfg.share_gpus)
    return make_backend(cfg.backend, **options)


def _print_summary(s: dict, out_dir: str) -> None:
    t = s["timings"]
    mb = s["bytes_read"] / 1e6
    per = f"{s['threads_per_rank']} thread{'s' if s['threads_per_rank'] != 1 else ''}/rank" if s["backend"] == "cpu" \
        else ", ".join(s["devices"])
    click.echo(f"mpikmeans {s['version']}: {s['n']} rows x {s['m']} attributes, k={s['k']}, "
               f"{s['ranks']} rank{'s' if s['ranks'] != 1 else ''}, backend {s['backend']} ({per}), {s['dtype']}")
    state = "converged" if s["converged"] else "stopped"
    click.echo(f"{state} after {s['iterations']} iterations ({s['stop_reason']}); SSE {s['inertia']:.10g}")
    sizes = s["sizes"]
    shown = " ".join(str(v) for v in sizes[:20]) + (" ..." if len(sizes) > 20 else "")
    click.echo(f"cluster sizes: {shown}")
    rate = f" ({mb / t['read_s']:.0f} MB/s)" if t["read_s"] > 0 else ""
    click.echo(f"timings: read {t['read_s']:.3f} s{rate}, init {t['init_s']:.3f} s, "
               f"compute {t['compute_s']:.3f} s ({1e3 * t['per_iteration_s']:.2f} ms/iteration), "
               f"write {t['write_s']:.3f} s, total {t['total_s']:.3f} s")
    click.echo(f"results: {out_dir}/ (centers.csv, labels.txt, summary.json)")


# --------------------------------------------------------------------------- gen-data

@main.command("gen-data")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("-n", "n", type=click.IntRange(min=1), required=True, help="Rows.")
@click.option("-m", "m", type=click.IntRange(min=1), required=True, help="Attributes.")
@click.option("-k", "k", type=click.IntRange(min=1), required=True, help="Blobs.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--spread", type=float, default=1.0, show_default=True, help="Standard deviation of each blob.")
@click.option("--decimals", type=click.IntRange(0, 15), default=10, show_default=True,
              help="Digits after the decimal point.")
@click.option("-v", "--verbose", count=True)
@click.option("-q", "--quiet", is_flag=True)
def gen_data(out, n, m, k, seed, spread, decimals, verbose, quiet):
    """Write a synthetic ARFF file of Gaussian blobs (in parallel under mpirun)."""
    from .gen import GenSpec, write_blobs

    def body(comm):
        spec = GenSpec(n=n, m=m, k=k, seed=seed, spread=spread, decimals=decimals)
        try:
            spec.validate()
        except ValueError as exc:
            raise UsageError(str(exc), collective=True) from None
        t0 = time.perf_counter()
        size = write_blobs(spec, out, comm)
        dt = time.perf_counter() - t0
        if comm.rank == 0 and not quiet:
            click.echo(f"wrote {out}: {n} rows x {m} attributes, {k} blobs, {size / 1e6:.1f} MB "
                       f"in {dt:.2f} s ({size / 1e6 / dt:.0f} MB/s, {comm.size} rank{'s' if comm.size != 1 else ''})")
        return 0

    _guarded(verbose, quiet, body)


# --------------------------------------------------------------------------- info

@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def info(as_json):
    """Show every rank: host, node-local rank, GPUs, MPI library, chosen backend."""

    def body(comm):
        from .backends.cpu import default_threads

        gpus, auto = [], "cpu"
        try:
            from .backends.gpu import device_descriptions, gpu_available

            if gpu_available():
                gpus = device_descriptions()
                auto = "gpu"
        except ImportError:
            pass
        mine = {"rank": comm.rank, "host": comm.host, "node_rank": comm.node_rank, "node_size": comm.node_size,
                "cpus": os.cpu_count(), "threads": default_threads(comm.node_size), "gpus": gpus,
                "auto_backend": auto,
                "gpu_for_rank": (comm.node_rank % len(gpus)) if gpus else None}
        rows = comm.allgather(mine)
        if comm.rank == 0:
            if as_json:
                click.echo(json.dumps({"mpi_library": comm.library(), "ranks": rows}, indent=2))
            else:
                click.echo(f"MPI library: {comm.library()}")
                click.echo(f"{'rank':>4} {'host':<20} {'node rank':>9} {'cpus':>5} {'threads':>7} {'auto':>5}  gpu")
                for r in rows:
                    gpu = "-"
                    if r["gpus"]:
                        g = r["gpus"][r["gpu_for_rank"]]
                        gpu = f"{g['index']}: {g['name']} ({g['memory'] / 2**30:.0f} GiB)"
                    click.echo(f"{r['rank']:>4} {r['host']:<20} {r['node_rank']:>5}/{r['node_size']:<3} "
                               f"{r['cpus']:>5} {r['threads']:>7} {r['auto_backend']:>5}  {gpu}")
        return 0

    _guarded(0, False, body)


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


if __name__ == "__main__":  # pragma: no cover
    entry()
