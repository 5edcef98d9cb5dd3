"""Command line: ``mpikmeans run | gen-data | convert | info | bench``.

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
from .config import (BACKENDS, DTYPES, EMPTY_POLICIES, MISSING_POLICIES, NORMALIZE_METHODS, build_config,
                     load_yaml)
from .errors import MpikmeansError, UsageError

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

_RUN_KEYS = ("k", "init", "seed", "max_iter", "tol", "backend", "dtype", "empty_cluster", "output_dir",
             "threads", "share_gpus", "chunk_rows", "checkpoint", "checkpoint_every", "resume", "overwrite",
             "ignore", "missing", "n_init", "normalize", "write_arff")


@main.command()
@click.argument("data", type=click.Path(dir_okay=False))
@click.option("-k", "k", type=int, help="Number of clusters (required, here or in --config).")
@click.option("--init", help="k-means++ | k-means|| | range | sample | FILE.csv of k x m centres  "
              "[default: k-means++]")
@click.option("--n-init", type=int, help="Initialisations to run; the lowest SSE is kept  [default: 1]")
@click.option("--normalize", type=click.Choice(NORMALIZE_METHODS), help="Attribute scaling  [default: none]")
@click.option("--write-arff", is_flag=True, default=None,
              help="Also write clustered.arff: the rows with a nominal cluster attribute (Weka's AddCluster).")
@click.option("--seed", type=int, help="Seed of the initialisation  [default: 0]")
@click.option("--max-iter", type=int, help="Most Lloyd iterations  [default: 300]")
@click.option("--tol", type=float, help="Stop when no centre moves more than this; 0 = until labels are stable  [default: 0]")
@click.option("--backend", type=click.Choice(BACKENDS), help="[default: auto]")
@click.option("--dtype", type=click.Choice(DTYPES), help="Precision of the data on the GPU  [default: float64]")
@click.option("--empty-cluster", type=click.Choice(EMPTY_POLICIES), help="Empty-cluster policy  [default: keep]")
@click.option("--ignore", help="Numeric attributes not to cluster: names, first, last, 1-based indices, ranges.")
@click.option("--missing", type=click.Choice(MISSING_POLICIES), help="Missing values '?'  [default: error]")
@click.option("--output-dir", "-o", help="Default: DATA's stem + .mpikmeans/")
@click.option("--overwrite", is_flag=True, default=None, help="Replace results already in the output directory.")
@click.option("--threads", type=int, help="CPU threads per rank, for parsing and the CPU backend  [default: the "
              "rank's share of its node's CPUs, lowered by OMP_NUM_THREADS; mpikmeans info shows it]")
@click.option("--share-gpus", is_flag=True, default=None, help="Allow more ranks per node than GPUs.")
@click.option("--chunk-rows", type=int, help="GPU: stream the data in chunks of this many rows.")
@click.option("--checkpoint", help="Save the loop state here periodically and on SIGTERM/SIGUSR1.")
@click.option("--checkpoint-every", type=int, help="Checkpoint every N iterations  [default: at most every 60 s]")
@click.option("--resume", help="Go on from a checkpoint.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML file of settings (keys = option names).")
@click.option("--dry-run", is_flag=True, help="Print per-rank rows, bytes and memory estimates, then exit.")
@click.option("-v", "--verbose", count=True, help="One line per iteration (-vv: more).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@click.pass_context
def run(ctx, data, config_path, dry_run, verbose, quiet, **options):
    """Cluster DATA (an ARFF file) into K clusters."""
    given = {key: options[key] for key in _RUN_KEYS
             if ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE and options[key] is not None}

    def body(comm):
        from .interrupt import EXIT_CHECKPOINTED
        from .runner import dry_run as plan_ranks
        from .runner import run_job

        try:
            cfg = build_config(load_yaml(config_path) if config_path else {}, given)
        except UsageError as exc:
            exc.collective = True  # same arguments and files on every rank
            raise
        if dry_run:
            plans = plan_ranks(comm, data, cfg)
            if comm.rank == 0:
                _print_plan(plans, cfg)
            return 0
        outcome = run_job(comm, data, cfg)
        if comm.rank == 0 and outcome.interrupted_by:
            s = outcome.summary
            click.echo(f"mpikmeans: stopped by {outcome.interrupted_by} after iteration {s['iterations']}; "
                       f"state saved to {outcome.checkpoint}", err=True)
            click.echo(f"mpikmeans: go on with: mpikmeans run {data} --resume {outcome.checkpoint} "
                       "(and the same settings)", err=True)
        elif comm.rank == 0 and not quiet:
            _print_summary(outcome.summary, outcome.out_dir)
            _print_centroids(outcome)
        return EXIT_CHECKPOINTED if outcome.interrupted_by else 0

    _guarded(verbose, quiet, body)


def _print_plan(plans: list, cfg) -> None:
    gib = 2.0**30
    click.echo(f"dry run: {len(plans)} rank(s), m = {plans[0]['m']}, k = {cfg.k}, dtype {cfg.dtype} on a GPU")
    click.echo(f"{'rank':>4} {'host':<18} {'bytes':>14} {'rows (est.)':>12} {'host GiB':>9} {'GPU GiB':>8} "
               f"{'avail GiB':>9}")
    for p in plans:
        avail = "?" if p["available_bytes"] is None else f"{p['available_bytes'] / gib:.1f}"
        click.echo(f"{p['rank']:>4} {p['host']:<18} {p['bytes']:>14} {p['rows']:>12} "
                   f"{p['host_bytes'] / gib:>9.2f} {p['device_bytes'] / gib:>8.2f} {avail:>9}")
    click.echo(f"total: {sum(p['bytes'] for p in plans)} bytes, about {sum(p['rows'] for p in plans)} rows")


#: Larger centroid tables are left to centers.csv.
_TABLE_CELLS = 400


def _print_centroids(outcome) -> None:
    """A centroid table like Weka's SimpleKMeans: Full Data column, then one per cluster."""
    s, c = outcome.summary, outcome.centres
    k, m = c.shape
    if k * m > _TABLE_CELLS:
        click.echo(f"({k} x {m} centroids: see centers.csv)")
        return
    names = s["attributes"]
    heads = ["Full Data"] + [str(j) for j in range(k)]
    sizes = [f"({s['n']}.0)"] + [f"({v}.0)" for v in s["sizes"]]
    cols = [[f"{v:.4f}" for v in outcome.full_means]] + [[f"{v:.4f}" for v in c[j]] for j in range(k)]
    widths = [max(len(h), len(z), *(len(v) for v in col)) for h, z, col in zip(heads, sizes, cols)]
    name_w = max(len("Attribute"), *(len(n) for n in names))
    click.echo("\nFinal cluster centroids:")
    click.echo(" " * name_w + "  " + " ".join(f"{'Cluster#' if j == 1 else '':>{w}}" for j, w in enumerate(widths)))
    click.echo(f"{'Attribute':<{name_w}}  " + " ".join(f"{h:>{w}}" for h, w in zip(heads, widths)))
    click.echo(" " * name_w + "  " + " ".join(f"{z:>{w}}" for z, w in zip(sizes, widths)))
    click.echo("=" * (name_w + 2 + sum(widths) + len(widths) - 1))
    for i, name in enumerate(names):
        click.echo(f"{name:<{name_w}}  " + " ".join(f"{col[i]:>{w}}" for col, w in zip(cols, widths)))
    units = "" if s["inertia_units"] == "data" else f" (in {s['inertia_units']} units)"
    click.echo(f"\nWithin cluster sum of squared errors{units}: {s['inertia']:.10g}")
    click.echo("per cluster: " + " ".join(f"{v:.6g}" for v in s["cluster_sse"]))


def _print_summary(s: dict, out_dir: str) -> None:
    t = s["timings"]
    mb = s["bytes_read"] / 1e6
    per = f"{s['threads_per_rank']} thread{'s' if s['threads_per_rank'] != 1 else ''}/rank" if s["backend"] == "cpu" \
        else ", ".join(s["devices"])
    click.echo(f"mpikmeans {s['version']}: {s['n']} rows x {s['m']} attributes, k={s['k']}, "
               f"{s['ranks']} rank{'s' if s['ranks'] != 1 else ''}, backend {s['backend']} ({per}), {s['dtype']}")
    state = "converged" if s["converged"] else "stopped"
    resumed = f", resumed at iteration {s['resumed_at_iteration']}" if s.get("resumed_from") else ""
    units = "" if s["inertia_units"] == "data" else f" ({s['inertia_units']} units)"
    restarts = f", best of {s['n_init']} restarts (#{s['best_restart']})" if s["n_init"] > 1 else ""
    click.echo(f"{state} after {s['iterations']} iterations ({s['stop_reason']}{resumed}{restarts}); "
               f"SSE{units} {s['inertia']:.10g}")
    sizes = s["sizes"]
    shown = " ".join(str(v) for v in sizes[:20]) + (" ..." if len(sizes) > 20 else "")
    click.echo(f"cluster sizes: {shown}")
    rate = f"{mb / t['read_s']:.0f} MB/s, " if t["read_s"] > 0 else ""
    click.echo(f"timings: read {t['read_s']:.3f} s ({rate}start-up {t['startup_s']:.3f} s), "
               f"backend set-up {t['setup_s']:.3f} s, "
               f"init {t['init_s']:.3f} s, "
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
@click.option("--decimals", type=click.IntRange(0, 14), default=10, show_default=True,
              help="Digits after the decimal point.")
@click.option("-v", "--verbose", count=True)
@click.option("-q", "--quiet", is_flag=True)
def gen_data(out, n, m, k, seed, spread, decimals, verbose, quiet):
    """Write a synthetic ARFF file of Gaussian blobs (in parallel under mpirun)."""
    from .io.gen import GenSpec, prepare, write_blobs

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
        if comm.rank == 0 and not quiet:
            click.echo(f"wrote {out}: {n} rows x {m} attributes, {k} blobs, {size / 1e6:.1f} MB "
                       f"in {dt:.2f} s ({size / 1e6 / dt:.0f} MB/s, {comm.size} rank{'s' if comm.size != 1 else ''}, "
                       f"start-up {t_ready - t0:.2f} s)")
        return 0

    _guarded(verbose, quiet, body)


# --------------------------------------------------------------------------- convert

@main.command()
@click.argument("source", type=click.Path(dir_okay=False))
@click.argument("target", type=click.Path(dir_okay=False))
@click.option("--ignore", help="Numeric attributes to leave out (as for run).")
@click.option("--missing", type=click.Choice(MISSING_POLICIES), default="error", show_default=True)
@click.option("-q", "--quiet", is_flag=True)
def convert(source, target, ignore, missing, quiet):
    """Parse SOURCE (ARFF) once and write TARGET (.npy) for fast repeated runs."""
    from .io.binary import convert as convert_file

    def body(comm):
        if not target.endswith(".npy"):
            raise UsageError(f"{target}: the target must end in .npy", collective=True)
        t0 = time.perf_counter()
        local = convert_file(comm, source, target, ignore=ignore, missing=missing)
        dt = time.perf_counter() - t0
        if comm.rank == 0 and not quiet:
            click.echo(f"wrote {target}: {local.n} rows x {local.m} attributes in {dt:.2f} s "
                       f"(names in {target}.json); run it with: mpikmeans run {target} -k K")
        return 0

    _guarded(0, quiet, body)


# --------------------------------------------------------------------------- info

@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def info(as_json):
    """Show every rank: host, node-local rank, GPUs, MPI library, chosen backend."""

    def body(comm):
        from .runner import gpu_possible, rank_threads

        gpus, auto = [], "cpu"
        try:
            if gpu_possible():  # else skip importing numba-cuda (slow) on a CPU node
                from .backends.gpu import device_descriptions, gpu_available

                if gpu_available():
                    gpus = device_descriptions()
                    auto = "gpu"
        except ImportError:
            pass
        mine = {"rank": comm.rank, "host": comm.host, "node_rank": comm.node_rank, "node_size": comm.node_size,
                "cpus": os.cpu_count(), "threads": rank_threads(comm), "gpus": gpus,
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
                        gpu = f"{g['index']}: {g['name']} ({g['total_memory'] / 2**30:.0f} GiB)"
                    click.echo(f"{r['rank']:>4} {r['host']:<20} {r['node_rank']:>5}/{r['node_size']:<3} "
                               f"{r['cpus']:>5} {r['threads']:>7} {r['auto_backend']:>5}  {gpu}")
        return 0

    _guarded(0, False, body)


# --------------------------------------------------------------------------- bench

def _bench_failed(exc: MpikmeansError) -> None:
    click.echo(f"mpikmeans bench: error: {exc.message}", err=True)
    sys.exit(exc.exit_code)


@main.group()
def bench():
    """Benchmark sweeps through the real tool, with plots (see BENCHMARKS.md).

    \b
    Not run under mpirun: it starts `mpirun -np P mpikmeans run ...` itself.
      mpikmeans bench run --quick -o bench/quick        # seconds, CPU only
      mpikmeans bench run -o bench/h100 --sweeps n,m,k  # full sizes, on a GPU machine
      mpikmeans bench plot bench/h100                   # redraw from the CSVs
    """


@bench.command("run")
@click.option("--quick", "mode", flag_value="quick", help="Tiny sizes (CI): the whole thing in about a minute.")
@click.option("--full", "mode", flag_value="full", default=True, help="The sizes of BENCHMARKS.md  [default]")
@click.option("--sweeps", default=",".join(("procs", "n", "m", "k")), show_default=True,
              help="Comma list of procs, n, m, k.")
@click.option("--output-dir", "-o", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Where the CSVs, meta.json and plots go.")
@click.option("--iterations", type=click.IntRange(min=1), default=5, show_default=True,
              help="Lloyd iterations per run (tol 0, the same initial centres for every series).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs per point; the median is plotted, min-max as error bars.")
@click.option("--dtype", type=click.Choice(DTYPES), default="float64", show_default=True,
              help="Data precision on the GPU (and of the PyTorch reference).")
@click.option("--no-cpu", is_flag=True, help="Leave out the CPU series.")
@click.option("--no-gpu", is_flag=True, help="Leave out the GPU series (left out anyway without a GPU).")
@click.option("--no-references", is_flag=True, help="Leave out scikit-learn and PyTorch.")
@click.option("--gpus", type=click.IntRange(min=0), help="GPUs to use  [default: all that nvidia-smi lists]")
@click.option("--cores", type=click.IntRange(min=1), help="Cores to use  [default: all]")
@click.option("--launcher", help="MPI launcher command  [default: mpirun --bind-to none]")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Keep generated inputs here (reused next time).")
@click.option("--timeout", "timeout_s", type=float, default=1800, show_default=True,
              help="Seconds allowed for any one run.")
@click.option("--no-plots", is_flag=True, help="Write the CSVs only.")
def bench_run(mode, sweeps, out_dir, iterations, repeats, dtype, no_cpu, no_gpu, no_references, gpus, cores,
              launcher, data_dir, timeout_s, no_plots):
    """Run the sweeps; write one CSV per sweep, meta.json, and PNG/SVG plots."""
    import shlex

    from .bench import BenchSettings, run_benchmarks

    settings = BenchSettings(out_dir=out_dir, iterations=iterations, repeats=repeats, dtype=dtype,
                             cpu=not no_cpu, gpu=not no_gpu, references=not no_references,
                             launcher=shlex.split(launcher) if launcher else [], timeout_s=timeout_s,
                             data_dir=data_dir)
    command = "mpikmeans " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        result = run_benchmarks(mode, [s.strip() for s in sweeps.split(",") if s.strip()], settings, gpus=gpus,
                                cores=cores, command=command, progress=click.echo)
    except MpikmeansError as exc:
        _bench_failed(exc)
    click.echo(f"wrote {', '.join(f'{s}.csv' for s in result['rows'])} and meta.json in {out_dir}")
    if not no_plots:
        _draw(out_dir)


def _draw(out_dir: str) -> None:
    from .plots import plot_all

    try:
        files = plot_all(out_dir)
    except ImportError:
        click.echo("matplotlib is not installed (pip install 'mpikmeans[plots]'): plots not drawn; "
                   f"draw them later with: mpikmeans bench plot {out_dir}", err=True)
        return
    except FileNotFoundError as exc:
        _bench_failed(UsageError(f"{out_dir}: no benchmark results there ({exc.filename} is missing)"))
    click.echo("plots: " + ", ".join(os.path.basename(f) for f in files))


@bench.command("plot")
@click.argument("out_dir", type=click.Path(file_okay=False, exists=True))
def bench_plot(out_dir):
    """Draw the plots of a finished `bench run` from its CSVs and meta.json."""
    _draw(out_dir)


@bench.command("reference", hidden=True)
@click.argument("tool", type=click.Choice(["sklearn", "torch"]))
@click.option("--data", required=True, type=click.Path(dir_okay=False, exists=True), help=".npy (n, m) float64")
@click.option("--init", "init_path", required=True, type=click.Path(dir_okay=False, exists=True),
              help=".npy (k, m) float64")
@click.option("--iterations", type=click.IntRange(min=1), default=5)
@click.option("--repeats", type=click.IntRange(min=1), default=3)
@click.option("--dtype", type=click.Choice(DTYPES), default="float64")
@click.option("--device", type=click.IntRange(min=0), default=0)
def bench_reference(tool, data, init_path, iterations, repeats, dtype, device):
    """One reference timing as a JSON line (the bench driver runs this in its own process)."""
    import numpy as np

    from .references import sklearn_lloyd, torch_lloyd

    x, init = np.load(data), np.load(init_path)
    try:
        if tool == "sklearn":
            out = sklearn_lloyd(x, init, iterations, repeats)
            out["threads"] = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
        else:
            out = torch_lloyd(x, init, iterations, repeats, dtype, device)
    except ImportError as exc:
        out = {"error": f"{exc.name or exc} is not installed"}
    click.echo(json.dumps(out))


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
