"""``mpikmeans bench``: every benchmark of the tool, its references and plots.

Thin: each subcommand parses its options, calls its mode in :mod:`mpikmeans.bench`
(which times, makes the data and returns results), prints, and writes the result
in the common JSON format (:func:`mpikmeans.bench.harness.result_document`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import asdict

import click

from ..bench.step import SHAPES as STEP_SHAPES, TOOLS as STEP_TOOLS
from ..config import DTYPES
from ..errors import MpikmeansError, UsageError
from . import _guarded, main


def _bench_failed(exc: MpikmeansError) -> None:
    click.echo(f"mpikmeans bench: error: {exc.message}", err=True)
    sys.exit(exc.exit_code)


def _command() -> str:
    """This command line, as a user would type it again."""
    return "mpikmeans " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _launch(launcher: str | None, timeout_s: float):
    from ..bench.harness import Launch

    return Launch(shlex.split(launcher) if launcher else [], timeout_s)


def _save(path: str, bench_name: str, settings, results: dict, machine: dict | None = None) -> dict:
    from ..bench.harness import result_document, write_result

    doc = result_document(bench_name, _command(), asdict(settings), results, machine)
    write_result(path, doc)
    return doc


class _ListCommand(click.Command):
    """A command whose list options also take the scripts' form, ``--ranks 1 2 4`` (as ``--ranks 1,2,4``)."""

    def __init__(self, *args, list_options: tuple = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.list_options = set(list_options)

    def parse_args(self, ctx, args):
        joined, i = [], 0
        while i < len(args):
            joined.append(args[i])
            i += 1
            if joined[-1] in self.list_options:
                values = []
                while i < len(args) and re.fullmatch(r"[0-9][0-9,]*", args[i]):
                    values.append(args[i])
                    i += 1
                if values:
                    joined.append(",".join(values))
        return super().parse_args(ctx, joined)


def _counts(ctx, param, value):
    """``"1,2,4"`` to ``(1, 2, 4)``: rank or thread counts, each at least 1."""
    if value is None:
        return None
    try:
        out = tuple(int(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: give whole numbers, as 1 2 4 or 1,2,4") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: give counts of at least 1")
    return out


_launcher_option = click.option("--launcher", help="MPI launcher command  [default: mpirun --bind-to none]")


def _timeout_option(default: float = 1800):
    return click.option("--timeout", "timeout_s", type=float, default=default, show_default=True,
                        help="Seconds allowed for any one command.")


@main.group()
def bench():
    """Benchmarks of the tool beside scikit-learn and PyTorch, with plots (see BENCHMARKS.md).

    \b
    Not run under mpirun (except mpi-gpu): each starts `mpirun -np P mpikmeans ...` itself.
      mpikmeans bench run --quick -o bench/quick        # seconds, CPU only
      mpikmeans bench run -o bench/h100 --sweeps n,m,k  # full sizes, on a GPU machine
      mpikmeans bench plot bench/h100                   # redraw from the CSVs
      mpikmeans bench cpu --rows 1000000 --ranks 1 2    # read, gen-data and iteration throughput
      mpikmeans bench read --baseline /tmp/base         # I/O paths, against another version
      mpikmeans bench gpu --cases A --dtype float32     # the GPU step against PyTorch and the floors
      mpirun -np 2 python -m mpikmeans bench mpi-gpu --out np2.json
      mpikmeans bench regs 50 100 float32               # registers of the kernel, no GPU
      mpikmeans bench parity /tmp/parity --np 2         # GPU against CPU through the command line
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


def _shapes(ctx, param, value):
    """``"200000x100x50,1000000x16x8"`` to ((rows, attributes, K), ...)."""
    if value is None:
        return None
    try:
        out = tuple(tuple(int(v) for v in part.lower().split("x")) for part in str(value).split(",") if part.strip())
    except ValueError:
        out = ()
    if not out or any(len(t) != 3 or min(t) < 1 for t in out):
        raise click.BadParameter(f"{value!r}: give ROWSxATTRSxK, comma-separated, as 200000x100x50,1000000x16x8")
    for n, _, k in out:
        if k > n:
            raise click.BadParameter(f"{value!r}: K={k} is more than the {n} rows")
    return out


def _thread_counts(ctx, param, value):
    """``"1,2,all"`` to (1, 2, 0): 0 stands for all the CPUs."""
    try:
        out = tuple(0 if v.strip() == "all" else int(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        out = ()
    if not out or min(out) < 0:
        raise click.BadParameter(f"{value!r}: give thread counts of at least 1 or 'all', as 1,2,all")
    return out


@bench.command("step")
@click.option("--shapes", default=",".join("x".join(map(str, t)) for t in STEP_SHAPES), show_default=True,
              callback=_shapes, help="ROWSxATTRSxK, comma-separated.")
@click.option("--threads", default="1,2,all", show_default=True, callback=_thread_counts,
              help="Thread counts, comma-separated; 'all': every CPU this process may use.")
@click.option("--iterations", type=click.IntRange(min=2), default=20, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="The tools take turns this many times (a process each time); each tool's figure is the "
                   "median of its rounds, so that a machine whose speed drifts slows all alike.")
@click.option("--tools", default=",".join(STEP_TOOLS), show_default=True,
              type=click.STRING, help="Which of " + ", ".join(STEP_TOOLS) + " to time.")
@click.option("--json", "--out", "out", help="Result file  [default: bench/results/step_<host>_<date>.json]")
@_timeout_option()
def bench_step(shapes, threads, iterations, repeats, rounds, tools, out, timeout_s):
    """ms per Lloyd iteration on the CPU: mpikmeans against scikit-learn and scikit-learn-intelex (oneDAL)."""
    import platform
    from datetime import date

    from ..bench.step import StepSettings, run_step, step_table

    names = tuple(t.strip() for t in tools.split(",") if t.strip())
    bad = [t for t in names if t not in STEP_TOOLS]
    if bad or not names:
        raise click.BadParameter(f"{tools!r}: choose among {', '.join(STEP_TOOLS)}", param_hint="--tools")
    settings = StepSettings(shapes=shapes, threads=threads, iterations=iterations, repeats=repeats, tools=names,
                            timeout_s=timeout_s, rounds=rounds)
    out = out or f"bench/results/step_{platform.node()}_{date.today()}.json"
    try:
        doc = _save(out, "step", settings, run_step(settings, click.echo))
    except MpikmeansError as exc:
        _bench_failed(exc)
    for line in step_table(doc):
        click.echo(line)
    click.echo(f"wrote {out}")


@bench.command("step-worker", hidden=True)
@click.argument("tool", type=click.Choice(STEP_TOOLS))
@click.option("--data", required=True, type=click.Path(dir_okay=False, exists=True), help=".npy (n, m) float64")
@click.option("--init", "init_path", required=True, type=click.Path(dir_okay=False, exists=True),
              help=".npy (k, m) float64")
@click.option("--iterations", type=click.IntRange(min=2), default=20)
@click.option("--repeats", type=click.IntRange(min=1), default=3)
@click.option("--threads", type=click.IntRange(min=1), default=1)
def bench_step_worker(tool, data, init_path, iterations, repeats, threads):
    """One tool's timing as a JSON line (``bench step`` runs this in a process per tool and thread count)."""
    import numpy as np

    from ..bench.step import time_tool

    click.echo(json.dumps(time_tool(tool, np.load(data), np.load(init_path), iterations, repeats, threads)))


@bench.command("cpu", cls=_ListCommand, list_options=("--ranks", "--gen-ranks"))
@click.option("--rows", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--attrs", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("-k", "k", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--ranks", default="1,2", show_default=True, callback=_counts, help="Rank counts: 1 2 4 or 1,2,4.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--gen-ranks", callback=_counts, help="Rank counts for timing gen-data  [default: --ranks]")
@click.option("--iterations", type=click.IntRange(min=1), default=20, show_default=True,
              help="Lloyd iterations per run (fixed for timing).")
@click.option("--data", type=click.Path(dir_okay=False), help="Input to (re)make and use  [default: a temporary file]")
@click.option("--json", "--out", "out", help="Result file  [default: bench/results/cpu_<host>_<date>.json]")
@click.option("--references", is_flag=True, help="Also time numpy.loadtxt and pandas on the file.")
@_launcher_option
@_timeout_option()
def bench_cpu(rows, attrs, k, ranks, repeats, gen_ranks, iterations, data, out, references, launcher, timeout_s):
    """Read MB/s per rank, ms per Lloyd iteration and gen-data MB/s per rank, on CPUs."""
    import platform
    from datetime import date

    from ..bench.cpu import CpuSettings, cpu_table, run_cpu

    settings = CpuSettings(rows=rows, attrs=attrs, k=k, ranks=ranks, repeats=repeats, gen_ranks=gen_ranks,
                           iterations=iterations, data=data, references=references)
    out = out or f"bench/results/cpu_{platform.node()}_{date.today()}.json"
    try:
        settings.check()
        doc = _save(out, "cpu", settings, run_cpu(settings, _launch(launcher, timeout_s), click.echo))
    except MpikmeansError as exc:
        _bench_failed(exc)
    for line in cpu_table(doc):
        click.echo(line)
    click.echo(f"wrote {out}")


@bench.command("read", cls=_ListCommand, list_options=("--ranks", "--threads"))
@click.option("--rows", type=click.IntRange(min=1), default=2_000_000, show_default=True)
@click.option("--attrs", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("-k", "k", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--ranks", default="1,2", show_default=True, callback=_counts, help="Rank counts: 1 2 or 1,2.")
@click.option("--threads", default="1,2", show_default=True, callback=_counts,
              help="Parse threads per rank (reading): 1 2 or 1,2.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--baseline", type=click.Path(file_okay=False),
              help="A directory holding another version of the mpikmeans package, measured interleaved.")
@click.option("--dir", "work_dir", type=click.Path(file_okay=False),
              help="Where the files go  [default: a temporary directory, removed after]")
@click.option("--json", "--out", "out", help="Write the results here.")
@_launcher_option
@_timeout_option()
def bench_read(rows, attrs, k, ranks, threads, repeats, baseline, work_dir, out, launcher, timeout_s):
    """The I/O paths: gen-data MB/s per rank, the ARFF read and its parts, optionally against a baseline."""
    from ..bench.reading import ReadSettings, read_table, run_read

    settings = ReadSettings(rows=rows, attrs=attrs, k=k, ranks=ranks, repeats=repeats, threads=threads,
                            baseline=baseline, dir=work_dir)
    try:
        settings.check()
        results = run_read(settings, _launch(launcher, timeout_s), click.echo)
        if out:
            doc = _save(out, "read", settings, results)
        else:
            from ..bench.harness import result_document

            doc = result_document("read", _command(), asdict(settings), results)
    except MpikmeansError as exc:
        _bench_failed(exc)
    click.echo()
    for line in read_table(doc):
        click.echo(line)
    if out:
        click.echo(f"wrote {out}")


@bench.command("gpu")
@click.option("--cases", default="A,B,C", show_default=True, help="Comma list of A, B, C or NxMxK.")
@click.option("--dtype", default="float32,float64", show_default=True, help="Comma list of float32, float64.")
@click.option("--repeats", type=int, default=5, show_default=True, help="Timed runs per measurement (median reported).")
@click.option("--iters", type=int, default=5, show_default=True, help="Iterations per timed run.")
@click.option("--variants", default="[{}]", show_default=True,
              help='JSON list of kernel tune dicts to compare, or {"A": [...], "*": [...]} per case.')
@click.option("--no-torch", is_flag=True, help="Skip the PyTorch comparison.")
@click.option("--lloyd", type=int, default=20, show_default=True,
              help="Also time a real Lloyd run of this many iterations per variant (centres updated every step, "
                   "so labels change as they do in use); 0 to skip.")
@click.option("--host-breakdown", is_flag=True, help="Also time the host-side parts of a step.")
@click.option("--noise", type=float, default=1.0, show_default=True,
              help="Standard deviation of the rows around their centre, per attribute (1: well separated; with "
                   "--start-rows, 4 keeps A's labels changing for 40 iterations).")
@click.option("--start-rows", is_flag=True,
              help="Start from the first K rows instead of near the true centres: with --noise, labels keep "
                   "changing for many iterations.")
@click.option("--device", type=int, default=0, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--out", help="Result file  [default: bench/results/gpu_<device>_<date>.json]")
def bench_gpu(cases, dtype, repeats, iters, variants, no_torch, lloyd, host_breakdown, noise, start_rows, device,
              seed, out):
    """The GPU backend's step against PyTorch/cuBLAS and the memory and FLOP floors (needs PyTorch and a GPU).

    \b
    Cases: A = 5e6 x 100, K=50; B = 1e7 x 32, K=1000; C = 1e8 x 8, K=16.
      mpikmeans bench gpu --cases A --dtype float32 --repeats 5 --host-breakdown
      mpikmeans bench gpu --variants '[{}, {"maxreg": 168}]' --out bench/results/x.json
    """
    from ..bench.gpu import GpuSettings, default_out, gpu_table, run_gpu

    settings = GpuSettings(cases, dtype, repeats, iters, variants, no_torch, lloyd, host_breakdown, noise,
                           start_rows, device, seed)
    try:
        results = run_gpu(settings, click.echo)
        out = out or default_out(results["device"])
        _save(out, "gpu", settings, results)
    except MpikmeansError as exc:
        _bench_failed(exc)
    click.echo()
    for line in gpu_table(results):
        click.echo(line)
    click.echo(f"wrote {out}")


@bench.command("mpi-gpu")
@click.option("--n", "-n", "n", type=int, default=20_000_000, show_default=True, help="Rows over all ranks.")
@click.option("--m", "-m", "m", type=int, default=100, show_default=True)
@click.option("--k", "-k", "k", type=int, default=50, show_default=True)
@click.option("--dtype", default="float64", show_default=True)
@click.option("--iters", type=int, default=10, show_default=True)
@click.option("--seed", type=int, default=3, show_default=True)
@click.option("--out", default="mpi_gpu.json", show_default=True, help="Result file (rank 0 writes it).")
@click.option("--compare", nargs=2, type=click.Path(dir_okay=False, exists=True), metavar="JSON JSON",
              help="Compare two result files (no MPI): centres, labels, speed-up; exit 1 if they differ.")
@click.option("-v", "--verbose", count=True)
def bench_mpi_gpu(n, m, k, dtype, iters, seed, out, compare, verbose):
    """Several GPUs under MPI: rank-count parity and strong scaling (needs PyTorch and a GPU per rank).

    \b
    Started under the launcher, one rank per GPU:
      mpirun -np 1 python -m mpikmeans bench mpi-gpu --out np1.json
      mpirun -np 2 python -m mpikmeans bench mpi-gpu --out np2.json
      python -m mpikmeans bench mpi-gpu --compare np1.json np2.json
    """
    from ..bench.mpigpu import MpiGpuSettings, compare as compare_runs, run_mpi_gpu

    if compare:
        from ..bench.harness import read_result

        try:
            verdict = compare_runs(read_result(compare[0]), read_result(compare[1]))
        except MpikmeansError as exc:
            _bench_failed(exc)
        except KeyError as exc:
            _bench_failed(UsageError(f"not an mpi-gpu result: {exc.args[0]} is missing"))
        click.echo(verdict["line"])
        sys.exit(0 if verdict["ok"] else 1)
    settings = MpiGpuSettings(n, m, k, dtype, iters, seed)
    try:
        settings.check()
    except UsageError as exc:
        _bench_failed(exc)

    def body(comm):
        from ..bench.harness import machine_description

        results = run_mpi_gpu(comm, settings, click.echo)
        hosts = sorted(set(comm.allgather(comm.host)))  # collective: every rank, before rank 0 alone writes
        if results is not None:
            _save(out, "mpi-gpu", settings, results, {**machine_description(), "hosts": hosts})
            click.echo(f"wrote {out}")
        return 0

    _guarded(verbose, False, body)


@bench.command("regs")
@click.argument("k", type=click.IntRange(min=1))
@click.argument("m", type=click.IntRange(min=1))
@click.argument("dtype", type=click.Choice(DTYPES))
@click.argument("tune", required=False, default="{}")
@click.argument("which", required=False, default="delta", type=click.Choice(["delta", "full", "assign"]))
def bench_regs(k, m, dtype, tune, which):
    """Registers and spills of the fused step kernel for K x M, from ptxas (no GPU needed).

    \b
    TUNE is a JSON dict of kernel overrides; WHICH the kernel (delta: incremental step).
      mpikmeans bench regs 50 100 float32
      mpikmeans bench regs 50 100 float32 '{}' full
      mpikmeans bench regs 1000 32 float64 '{"R": 1}' assign
    Needs libnvvm, NVRTC and ptxas (PTXAS=...; see mpikmeans/bench/regs.py).
    """
    from ..bench.regs import parse_tune, registers

    try:
        found = registers(k, m, dtype, parse_tune(tune), which)
    except MpikmeansError as exc:
        _bench_failed(exc)
    p = found["plan"]
    click.echo(f"plan: mode {p['mode']}, R {p['R']}, TC {p['TC']}, NT {p['NT']}, tiles {p['tiles']}, "
               f"centres in shared memory {p['centres_shared']}, {p['smem']} B shared")
    click.echo("\n".join(found["ptxas"]))
    if found["returncode"] != 0:
        _bench_failed(MpikmeansError(f"ptxas exited with {found['returncode']}"))


@bench.command("parity")
@click.argument("result_dir", default="/tmp/gpu_cpu_parity", type=click.Path(file_okay=False))
@click.option("--np", "ranks", type=click.IntRange(min=1), default=2, show_default=True, help="Ranks of every run.")
@click.option("-n", "n", type=click.IntRange(min=1), default=2_000_000, show_default=True, help="Rows.")
@click.option("-m", "m", type=click.IntRange(min=1), default=20, show_default=True, help="Attributes.")
@click.option("-k", "k", type=click.IntRange(min=1), default=12, show_default=True, help="Clusters.")
@click.option("--seed", type=click.IntRange(min=0), default=3, show_default=True, help="Seed of gen-data.")
@click.option("--data", default="/tmp/gpu_cpu_parity.arff", show_default=True, type=click.Path(dir_okay=False),
              help="The generated input.")
@click.option("--run-args", default="", help="More options for every `mpikmeans run`, e.g. '--chunk-rows 100000'.")
@click.option("--share-gpus", is_flag=True, help="Pass --share-gpus to the GPU runs (more ranks than GPUs; the simulator).")
@click.option("--compare-only", is_flag=True, help="Compare the runs already in RESULT_DIR; run nothing.")
@_launcher_option
@_timeout_option()
def bench_parity(result_dir, ranks, n, m, k, seed, data, run_args, share_gpus, compare_only, launcher, timeout_s):
    """GPU (float64 and float32) against CPU through `mpikmeans run` under mpirun, on one generated file.

    \b
    Labels identical, centres within 1e-9 relative (float64 on the GPU; 1e-5 float32), sizes equal;
    writes RESULT_DIR/parity.json and exits 1 on a mismatch.
      mpikmeans bench parity /tmp/parity --np 2
      NUMBA_ENABLE_CUDASIM=1 mpikmeans bench parity /tmp/p --np 2 -n 3000 -m 4 -k 3 --share-gpus
    """
    from ..bench.parity import ParitySettings, compare_runs, run_parity

    try:
        extra = shlex.split(run_args) + (["--share-gpus"] if share_gpus else [])
    except ValueError as exc:
        _bench_failed(UsageError(f"--run-args: {exc}"))
    settings = ParitySettings(ranks, n, m, k, seed, data, extra)
    try:
        if compare_only:
            results = compare_runs(result_dir)
        else:
            results = run_parity(settings, result_dir, _launch(launcher, timeout_s), click.echo)
        _save(os.path.join(result_dir, "parity.json"), "parity", settings, results)
    except MpikmeansError as exc:
        _bench_failed(exc)
    for r in results["gpu"].values():
        click.echo(r["line"])
    if not results["ok"]:
        _bench_failed(MpikmeansError("parity: the GPU runs differ from the CPU run (see above)"))


@bench.command("tts")
@click.option("--rows", type=click.IntRange(min=1), default=5_000_000, show_default=True)
@click.option("--attrs", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("-k", "k", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--ranks", type=click.IntRange(min=1), default=1, show_default=True, help="Ranks of every run.")
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True, help="Warm runs per input.")
@click.option("--gen-ranks", type=click.IntRange(min=0), default=0, help="Ranks of gen-data  [default: the cores]")
@click.option("--data-dir", type=click.Path(file_okay=False),
              help="Where the input and caches go for the measurement  [default: /dev/shm, else the temp dir]")
@click.option("--run-args", default="", help="More options of every run (quoted), e.g. '--dtype float32'.")
@click.option("--no-sklearn", is_flag=True, help="Leave out scikit-learn's default fit.")
@click.option("--no-cold", is_flag=True, help="Leave out the run on empty caches.")
@click.option("--out", help="Result file  [default: bench/results/tts_<host>_<date>.json]")
@_launcher_option
@_timeout_option()
def bench_tts(rows, attrs, k, ranks, repeats, gen_ranks, data_dir, run_args, no_sklearn, no_cold, out, launcher,
              timeout_s):
    """Time to solution with defaults: cold and warm caches, ARFF and .npy, scikit-learn beside.

    \b
    The specification's example (5e6 x 100, k=50) by default:
      mpikmeans bench tts                               # on a GPU machine
      mpikmeans bench tts --rows 200000 -k 50 --run-args '--backend cpu'
    """
    import platform
    from datetime import date

    from ..bench.tts import TtsSettings, time_to_solution, tts_table

    settings = TtsSettings(rows=rows, attrs=attrs, k=k, ranks=ranks, repeats=repeats, gen_ranks=gen_ranks,
                           data_dir=data_dir, run_args=tuple(shlex.split(run_args)), sklearn=not no_sklearn,
                           cold=not no_cold)
    out = out or f"bench/results/tts_{platform.node()}_{date.today()}.json"
    try:
        doc = _save(out, "tts", settings, time_to_solution(settings, _launch(launcher, timeout_s), click.echo))
    except MpikmeansError as exc:
        _bench_failed(exc)
    click.echo()
    for line in tts_table(doc):
        click.echo(line)
    click.echo(f"wrote {out}")


@bench.command("compile")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Threads of the CPU warm-up's parallel kernels.")
@click.option("--gpu", "gpu_shape", help="Also the GPU kernels of this shape: K,M[,DTYPE] (e.g. 50,100,float64).")
@click.option("--out", help="Result file  [default: bench/results/compile_<host>_<date>.json]")
@_launcher_option
@_timeout_option()
def bench_compile(threads, gpu_shape, out, launcher, timeout_s):
    """Every kernel's first compile on this machine, with empty caches (what a cold run pays)."""
    import platform
    from datetime import date

    from ..bench.compile import compile_costs

    shape = None
    if gpu_shape:
        parts = gpu_shape.split(",")
        try:
            shape = (int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "float64")
        except (ValueError, IndexError):
            _bench_failed(UsageError(f"--gpu {gpu_shape!r}: expected K,M[,DTYPE]"))
    out = out or f"bench/results/compile_{platform.node()}_{date.today()}.json"
    settings = {"threads": threads, "gpu": list(shape) if shape else None}
    try:
        from ..bench.harness import result_document, write_result

        results = compile_costs(_launch(launcher, timeout_s), threads, shape, click.echo)
        write_result(out, result_document("compile", _command(), settings, results))
    except MpikmeansError as exc:
        _bench_failed(exc)
    click.echo(f"wrote {out}")
