"""``mpikmeans bench``: benchmark sweeps and measurements through the real tool, with plots."""

from __future__ import annotations

import json
import os
import sys

import click

from ..config import DTYPES
from ..errors import MpikmeansError, UsageError
from . import main


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

    from ..bench.sweeps import BenchSettings, run_benchmarks

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
    from ..bench.plots import plot_all

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
