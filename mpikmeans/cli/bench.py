"""``mpikmeans bench``: what a user runs to measure the tool on their own machine or cluster.

Thin: each subcommand parses its options, calls :mod:`mpikmeans.bench` (which
times, makes the data and returns results), prints, and writes the result in the
common JSON format (:func:`mpikmeans.bench.harness.result_document`).
"""

from __future__ import annotations

import json
import os
import shlex
import sys

import click

from ..config import BACKENDS, DTYPES, INIT_METHODS
from ..errors import MpikmeansError, UsageError
from .app import main


def _bench_failed(exc: MpikmeansError) -> None:
    click.echo(f"mpikmeans bench: error: {exc.message}", err=True)
    sys.exit(exc.exit_code)


def _command() -> str:
    """This command line, as a user would type it again."""
    return "mpikmeans " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@main.group()
def bench():
    """Measure the tool on this machine, beside scikit-learn (and PyTorch on a GPU); see BENCHMARKS.md.

    \b
    Not run under mpirun: each starts `mpikmeans ...` (or `mpirun -np P mpikmeans ...`) itself.
      mpikmeans bench run --quick -o /tmp/sweeps      # the specification's sweeps, tiny: seconds
      mpikmeans bench run -o bench/mine               # full sizes: time against processes, N, M, K
      mpikmeans bench plot bench/mine                 # redraw the plots from the CSVs
      mpikmeans bench runs -o runs.json               # whole runs, phase by phase, empty and warm caches
      mpikmeans bench runs --sweep 2:64 -o sweep.json # one run per K on the specification's example
    """


# -- bench run and plot: the specification's measurements (§5.7) ------------------------------


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
    """Compute time against processes, rows, attributes and clusters, and read time against processes.

    One CSV per sweep, meta.json, and PNG/SVG plots (the specification's §5.7).
    """
    from ..bench.sweeps import BenchSettings, run_benchmarks

    settings = BenchSettings(out_dir=out_dir, iterations=iterations, repeats=repeats, dtype=dtype,
                             cpu=not no_cpu, gpu=not no_gpu, references=not no_references,
                             launcher=shlex.split(launcher) if launcher else [], timeout_s=timeout_s,
                             data_dir=data_dir)
    try:
        result = run_benchmarks(mode, [s.strip() for s in sweeps.split(",") if s.strip()], settings, gpus=gpus,
                                cores=cores, command=_command(), progress=click.echo)
    except MpikmeansError as exc:
        _bench_failed(exc)
    click.echo(f"wrote {', '.join(f'{s}.csv' for s in result['rows'])} and meta.json in {out_dir}")
    if not no_plots:
        _draw(out_dir)


def _draw(target: str) -> None:
    from ..bench.plots import plot_all, plot_runs

    try:
        files = plot_all(target) if os.path.isdir(target) else plot_runs(target)
    except ImportError:
        click.echo("matplotlib is not installed (pip install 'mpikmeans[plots]'): plots not drawn; "
                   f"draw them later with: mpikmeans bench plot {target}", err=True)
        return
    except FileNotFoundError as exc:
        _bench_failed(UsageError(f"{target}: no benchmark results there ({exc.filename} is missing)"))
    except MpikmeansError as exc:
        _bench_failed(exc)
    click.echo("plots: " + ", ".join(os.path.basename(f) for f in files))


@bench.command("plot")
@click.argument("target", type=click.Path(exists=True))
def bench_plot(target):
    """Draw the plots of a finished `bench run` (its directory) or `bench runs` (its JSON file)."""
    _draw(target)


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
    """One reference timing as a JSON line (`bench run` runs this in its own process)."""
    import numpy as np

    from ..bench.references import sklearn_lloyd, torch_lloyd

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


# -- bench runs: whole runs as a user types them ----------------------------------------------


def _choices(allowed: tuple, empty_ok: bool = False):
    """A click callback: a comma list of values from ``allowed``, as a tuple."""
    def parse(ctx, param, value):
        if value is None:
            return None
        out = tuple(v.strip() for v in str(value).split(",") if v.strip())
        bad = [v for v in out if v not in allowed]
        if bad or (not out and not empty_ok):
            raise click.BadParameter(f"{value!r}: choose among {', '.join(allowed)}, comma-separated")
        return out
    return parse


def _sweep(ctx, param, value):
    """``"2:64"`` to (2, 64)."""
    if value is None:
        return None
    try:
        k0, k1 = (int(v) for v in value.split(":"))
    except ValueError:
        raise click.BadParameter(f"{value!r}: give K0:K1, as 2:64") from None
    if not 1 <= k0 <= k1:
        raise click.BadParameter(f"{value!r}: give K0:K1 with 1 <= K0 <= K1")
    return (k0, k1)


def _shape_list(ctx, param, value):
    if value is None:
        return None
    from ..bench.runs import parse_shape

    out = tuple(v.strip() for v in value.split(",") if v.strip())
    try:
        for v in out:
            parse_shape(v)
    except UsageError as exc:
        raise click.BadParameter(exc.message) from None
    if not out:
        raise click.BadParameter("give at least one shape")
    return out


@bench.command("runs")
@click.option("--output", "-o", "out", required=True, type=click.Path(dir_okay=False),
              help="The JSON result; its table goes beside it (.txt).")
@click.option("--quick", is_flag=True,
              help="Tiny data for CI: --scale 0.001, and unless given, --shapes A,E --caches warm.")
@click.option("--scale", type=float, help="Rows of every shape times this (at least 4 K).  [default: 1]")
@click.option("--shapes", callback=_shape_list,
              help="Comma list of A-E or ROWSxATTRSxK.  A = 5e6 x 100 K=50 (the specification's example), "
                   "B = 1e7 x 32 K=1000, C = 1e8 x 8 K=16, D = 3e5 x 257 K=1000, E = 2e6 x 3 K=7.  [default: all]")
@click.option("--inits", default="k-means++,sample", show_default=True, callback=_choices(INIT_METHODS))
@click.option("--dtypes", default="float64,float32", show_default=True, callback=_choices(DTYPES),
              help="Data precision of the GPU runs (the CPU backend computes in float64).")
@click.option("--backends", default="", callback=_choices(tuple(b for b in BACKENDS if b != "auto"), empty_ok=True),
              help="Comma list of gpu, cpu.  [default: the GPU where nvidia-smi lists one, and the CPU]")
@click.option("--caches", callback=_choices(("empty", "warm")),
              help="Comma list: empty (a new kernel cache for each run), warm (one cache, after one "
                   "`mpikmeans warmup`).  [default: empty,warm]")
@click.option("--np", "ranks", type=click.IntRange(min=0), default=0, show_default=True,
              help="Run every command under `mpirun -np NP` (0: `mpikmeans run` alone, as most users type it).")
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True,
              help="Seed of gen-data and of every run's initialisation.")
@click.option("--data-dir", type=click.Path(file_okay=False),
              help="Where the .npy inputs stay, reused by later calls.  [default: <temp>/mpikmeans-bench-data]")
@click.option("--keep-arff", is_flag=True, help="Keep gen-data's ARFF beside each .npy.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="The warm runs' kernel cache (an empty directory times `warmup` from scratch).  "
                   "[default: the one mpikmeans uses]")
@click.option("--no-warmup", is_flag=True, help="Do not run `mpikmeans warmup` before the warm runs.")
@click.option("--warmup-args", default="", help="Options of that `mpikmeans warmup` (quoted).")
@click.option("--no-sklearn", is_flag=True, help="Leave out scikit-learn's fits.")
@click.option("--run-args", default="", help="More options of every `mpikmeans run` (quoted).")
@click.option("--sweep", callback=_sweep,
              help="Instead of the matrix: K = K0..K1 on the specification's example (A), in one job "
                   "(`mpikmeans run DATA -k K0:K1`), then one run per K.")
@click.option("--one-job-only", is_flag=True, help="The sweep in one job alone, without the run per K.")
@click.option("--sweep-sklearn", type=click.IntRange(min=0), default=5, show_default=True,
              help="K values of the sweep at which scikit-learn's fit is timed (the rest interpolated).")
@click.option("--launcher", help="MPI launcher command  [default: mpirun --bind-to none]")
@click.option("--timeout", "timeout_s", type=float, default=3600, show_default=True,
              help="Seconds allowed for any one command.")
def bench_runs(out, quick, scale, shapes, inits, dtypes, backends, caches, ranks, seed, data_dir, keep_arff,
               cache_dir, no_warmup, warmup_args, no_sklearn, run_args, sweep, one_job_only, sweep_sklearn, launcher,
               timeout_s):
    """Whole runs as a user types them: every phase, compile seconds, the slowest iteration, scikit-learn beside.

    \b
    Each run is `mpikmeans run DATA.npy -k K --init I --dtype D --backend B` on data made once by
    gen-data and convert; its figures come from its summary.json and the wall time of the command.
      mpikmeans bench runs -o runs.json                         # every shape, init, dtype, backend, cache
      mpikmeans bench runs --shapes A,D --caches warm -o ad.json
      mpikmeans bench runs --sweep 2:64 -o sweep.json           # K = 2..64 on 5e6 x 100
      mpikmeans bench runs --quick -o /tmp/q.json               # seconds, CPU
    Exits 1 when a run failed (its row says why; the others are kept).
    """
    from ..bench.runs import QUICK, RunsSettings, run_matrix, run_sweep
    from ..bench.tables import matrix_table, sweep_table

    try:
        settings = RunsSettings(
            shapes=shapes or (QUICK["shapes"] if quick else RunsSettings.shapes),
            scale=scale if scale is not None else (QUICK["scale"] if quick else 1.0),
            inits=inits, dtypes=dtypes, backends=backends, caches=caches or (QUICK["caches"] if quick else
                                                                                 RunsSettings.caches),
            np=ranks, seed=seed, data_dir=data_dir, keep_arff=keep_arff, cache_dir=cache_dir, warmup=not no_warmup,
            warmup_args=tuple(shlex.split(warmup_args)), sklearn=not no_sklearn,
            run_args=tuple(shlex.split(run_args)), sweep=sweep, sweep_sklearn=sweep_sklearn,
            sweep_separate=not one_job_only,
            launcher=shlex.split(launcher) if launcher else [], timeout_s=timeout_s)
    except ValueError as exc:
        _bench_failed(UsageError(f"--warmup-args or --run-args: {exc}"))
    try:
        if sweep:
            doc = run_sweep(settings, _command(), out, click.echo)
            lines = sweep_table(doc)
        else:
            doc = run_matrix(settings, _command(), out, click.echo)
            lines = matrix_table(doc)
    except MpikmeansError as exc:
        _bench_failed(exc)
    from ..io.output import write_atomic

    table = os.path.splitext(out)[0] + ".txt"
    write_atomic(table, ("\n".join([f"$ {doc['command']}", f"{doc['date']}, commit {doc['commit']}", *lines])
                         + "\n").encode())
    click.echo()
    for line in lines:
        click.echo(line)
    click.echo(f"wrote {out} and {table}")
    if doc["errors"]:
        _bench_failed(MpikmeansError(f"{doc['errors']} run(s) failed (see their rows above and in {out})"))
