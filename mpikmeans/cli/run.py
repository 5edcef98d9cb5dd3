"""``mpikmeans run``: cluster a file, print the summary and Weka's centroid table on rank 0."""

from __future__ import annotations

import os
import sys

import click
from click.core import ParameterSource

from ..config import (BACKENDS, DEFAULT_SCORE_SAMPLE, DTYPES, EMPTY_POLICIES, MISSING_POLICIES, NOMINAL_POLICIES,
                      NORMALIZE_METHODS, SCORE_CHOICES, build_config, format_k, load_yaml)
from ..errors import UsageError
from ..interrupt import EXIT_CHECKPOINTED
from .app import _guarded, main, plural


_RUN_KEYS = ("k", "init", "seed", "max_iter", "tol", "backend", "dtype", "empty_cluster", "output_dir",
             "threads", "share_gpus", "chunk_rows", "checkpoint", "checkpoint_every", "resume", "overwrite",
             "ignore", "missing", "nominal", "n_init", "normalize", "write_arff", "scores", "score_sample")


@main.command(short_help="Cluster DATA (ARFF, CSV or .npy) into K clusters.")
@click.argument("data", type=click.Path(dir_okay=False))
@click.option("-k", "k", help="Number of clusters (required, here or in --config); a list 2,4,8 or a range "
              "2:64 or 2:64:2 is a K sweep: each K in OUTPUT-DIR/k<K>/, with sweep.csv and sweep.png.")
@click.option("--init", help="k-means++ | k-means|| | range | sample | FILE.csv of k x m centres | model.json of a "
              "run (go on from its centres; -k may be left out)  [default: k-means++]")
@click.option("--n-init", type=int, help="Initialisations to run; the lowest SSE is kept  [default: 1]")
@click.option("--normalize", type=click.Choice(NORMALIZE_METHODS), help="Attribute scaling  [default: none]")
@click.option("--write-arff", is_flag=True, default=None,
              help="Also write clustered.arff: the rows with a nominal cluster attribute (Weka's AddCluster).")
@click.option("--seed", type=int, help="Seed of the initialisation  [default: 0]")
@click.option("--scores", type=click.Choice(SCORE_CHOICES),
              help="Quality scores after the fit (Calinski-Harabasz, Davies-Bouldin, silhouettes), in summary.json  "
                   "[default: all]")
@click.option("--score-sample", type=int, help=f"Rows of the sampled Euclidean silhouette; 0 leaves it out  "
              f"[default: {DEFAULT_SCORE_SAMPLE}]")
@click.option("--max-iter", type=int, help="Most Lloyd iterations  [default: 300]")
@click.option("--tol", type=float, help="Stop when no centre moves more than this; 0 = until labels are stable  [default: 0]")
@click.option("--backend", type=click.Choice(BACKENDS), help="[default: auto]")
@click.option("--dtype", type=click.Choice(DTYPES), help="Precision of the data on the GPU  [default: float64]")
@click.option("--empty-cluster", type=click.Choice(EMPTY_POLICIES), help="An empty cluster takes the farthest point (scikit-learn), keeps its centre, or is dropped (Weka)  [default: farthest]")
@click.option("--ignore", help="Attributes not to cluster: names, first, last, 1-based indices, ranges.")
@click.option("--missing", type=click.Choice(MISSING_POLICIES), help="Missing values '?'  [default: error]")
@click.option("--nominal", type=click.Choice(NOMINAL_POLICIES),
              help="Nominal attributes: skip them, or cluster them as Weka's SimpleKMeans (0/1 distance, the "
                   "mode as centroid)  [default: skip]")
@click.option("--output-dir", "-o", help="Where the results go  [default: DATA without .arff, or the whole name of "
              "a CSV or .npy file, + .mpikmeans/: data.arff -> data.mpikmeans/, data.npy -> data.npy.mpikmeans/]")
@click.option("--overwrite", is_flag=True, default=None,
              help="Replace the results already in the output directory (the directory as a whole, once the new "
                   "results are written) and an older --checkpoint file.")
@click.option("--threads", type=int, help="CPU threads per rank, for parsing and the CPU backend  [default: the "
              "rank's share of its node's CPUs, lowered by OMP_NUM_THREADS; mpikmeans info shows it]")
@click.option("--share-gpus", is_flag=True, default=None, help="Allow more ranks per node than GPUs.")
@click.option("--chunk-rows", type=int, help="GPU: stream the data in chunks of this many rows.")
@click.option("--checkpoint", help="Save the loop state here periodically and on a stop signal (SIGTERM, SIGINT, "
              "SIGUSR1, SIGUSR2; then exit 75)  [default: on a stop signal only, OUTPUT-DIR/checkpoint.npz]")
@click.option("--checkpoint-every", type=int, help="Checkpoint every N iterations  [default: at most every 60 s]")
@click.option("--resume", help="Go on from a checkpoint (made with the same data and settings).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML file of settings (keys = option names).")
@click.option("--dry-run", is_flag=True, help="Print per-rank rows, bytes and memory estimates, then exit.")
@click.option("-v", "--verbose", count=True, help="One line per iteration (-vv: more).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@click.pass_context
def run(ctx, data, config_path, dry_run, verbose, quiet, **options):
    """Cluster DATA into K clusters.

    DATA is an ARFF file, a CSV file (.csv: a header line of names, or none),
    or the .npy copy of either that `mpikmeans convert` makes.  The results
    (centers.csv, labels.txt, model.json, summary.json) go to --output-dir;
    with -k 2:64 (a K sweep) each K's go to --output-dir/k<K>/, beside
    sweep.csv and sweep.png; warnings and progress go to stderr.  Exit codes: 0 done, 1 runtime failure, 2 usage
    error, 3 bad input data, 75 stopped by a signal (go on with --resume and the
    checkpoint it names).
    """
    given = {key: options[key] for key in _RUN_KEYS
             if ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE and options[key] is not None}

    def body(comm):
        try:
            cfg = build_config(load_yaml(config_path) if config_path else {}, given)
        except UsageError as exc:
            exc.collective = True  # same arguments and files on every rank
            raise
        # the run's modules (numpy, numba) only once the settings are good: a usage error answers at once
        from ..runner import dry_run as plan_ranks
        from ..runner import run_job

        if dry_run:
            plans = plan_ranks(comm, data, cfg)
            if comm.rank == 0:
                _print_plan(plans, cfg)
            return 0
        from .. import IMPORTED_AT
        from ..io.formats import results_dir

        if comm.rank == 0 and not quiet:
            _print_start(data, cfg, comm.size, cfg.output_dir or results_dir(data))
        outcome = run_job(comm, data, cfg, launched_at=IMPORTED_AT, config_path=config_path)
        if comm.rank == 0 and outcome.interrupted_by:
            _print_stop(data, outcome)
        elif comm.rank == 0:
            if outcome.signal_while_writing:
                click.echo(f"mpikmeans: {outcome.signal_while_writing} came as the run was finishing: its results "
                           "were written in full and are complete (exit 0)", err=True)
            if not quiet and outcome.sweep is not None:
                _print_sweep(outcome.sweep)
            elif not quiet:
                _print_summary(outcome.summary, outcome.out_dir)
                _print_centroids(outcome)
        return EXIT_CHECKPOINTED if outcome.interrupted_by else 0

    _guarded(verbose, quiet, body)


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"


def _print_start(data: str, cfg, ranks: int, out_dir: str) -> None:
    """What the run is about to do, on stderr before it starts (the summary comes at the end)."""
    from .. import __version__

    try:
        size = f" ({_size(os.path.getsize(data))})"
    except OSError:
        size = ""
    init = cfg.init if cfg.resume is None else f"resumed from {cfg.resume}"
    k = "that of the model" if cfg.k is None else format_k(cfg.k)
    click.echo(f"mpikmeans {__version__}: {data}{size}, k = {k}, {plural(ranks, 'rank')}, backend {cfg.backend}, "
               f"init {init}, seed {cfg.seed}; results to {out_dir}/", err=True)


def _stop_lines(data: str, outcome) -> list:
    name = outcome.interrupted_by
    if outcome.sweep is not None and not outcome.interrupted_phase:
        return _sweep_stop_lines(data, outcome)
    if outcome.interrupted_phase:
        return [f"mpikmeans: stopped by {name} while {outcome.interrupted_phase}, before the first iteration: "
                "nothing to save; run the same command again"]
    it = outcome.summary["iterations"]
    if not outcome.resumable:
        return [f"mpikmeans: stopped by {name} after iteration {it}; the restarts of --n-init cannot be "
                "resumed: run the same command again"]
    if outcome.checkpoint is None:
        return [f"mpikmeans: stopped by {name} after iteration {it}; the checkpoint could not be written "
                "(see the warning above)"]
    return [f"mpikmeans: stopped by {name} after iteration {it}; state saved to {outcome.checkpoint}",
            f"mpikmeans: go on with: mpikmeans run {data} --resume {outcome.checkpoint} (and the same settings)"]


def _sweep_stop_lines(data: str, outcome) -> list:
    sweep = outcome.sweep
    done = ", ".join(str(k) for k in sweep["done"]) or "none"
    where = f"at K = {sweep['stopped_at']}" if sweep["stopped_at"] is not None else "after its last K"
    if outcome.summary.get("iterations"):
        where += f", after iteration {outcome.summary['iterations']}"
    lines = [f"mpikmeans: K sweep stopped by {outcome.interrupted_by} {where}; K done: {done} (kept in "
             f"{sweep['out_dir']}/k<K>/)"]
    if not outcome.resumable or outcome.checkpoint is None:
        lines.append("mpikmeans: no checkpoint to go on from: run the same command with --overwrite to start afresh")
    else:
        lines.append(f"mpikmeans: go on with: mpikmeans run {data} --resume {outcome.checkpoint} (and the same -k and "
                     "settings)")
    return lines


def _print_stop(data: str, outcome) -> None:
    """Why a stopped run stopped, what it saved, how to go on (stderr).

    Open MPI 5's mpirun, itself stopped by SIGINT (Ctrl-C) or SIGTERM, passes
    SIGTERM on to the ranks and drops their output from then on: the lines go
    to the terminal the job was started from as well, where there is one.
    """
    lines = _stop_lines(data, outcome)
    for line in lines:
        click.echo(line, err=True)
    if outcome.interrupted_by == "SIGTERM" and os.environ.get("OMPI_VERSION", "").startswith("5.") \
            and not sys.stderr.isatty():
        lines.append("mpikmeans: (mpirun passed on a Ctrl-C or SIGTERM as SIGTERM, and exits 1 whatever the ranks do; "
                     f"the run's own exit code is {EXIT_CHECKPOINTED})")
        try:
            with open("/dev/tty", "w") as tty:
                tty.write("".join(line + "\n" for line in lines))
        except OSError:  # no controlling terminal: a batch job, whose template reports the exit code
            pass


def _print_plan(plans: list, cfg) -> None:
    gib = 2.0**30
    gpu = any(p.get("backend") == "gpu" for p in plans)
    where = f"dtype {cfg.dtype} on a GPU" if gpu else "on the CPU"
    click.echo(f"dry run: {plural(len(plans), 'rank')}, m = {plans[0]['m']}, k = {format_k(cfg.k)}, {where}")
    device = f" {'GPU GiB':>8}" if gpu else ""
    click.echo(f"{'rank':>4} {'host':<18} {'bytes':>14} {'rows (est.)':>12} {'host GiB':>9}{device} {'avail GiB':>9}")
    for p in plans:
        avail = "?" if p["available_bytes"] is None else f"{p['available_bytes'] / gib:.1f}"
        device = f" {p['device_bytes'] / gib:>8.2f}" if gpu else ""
        click.echo(f"{p['rank']:>4} {p['host']:<18} {p['bytes']:>14} {p['rows']:>12} "
                   f"{p['host_bytes'] / gib:>9.2f}{device} {avail:>9}")
    click.echo(f"total: {sum(p['bytes'] for p in plans)} bytes, about {sum(p['rows'] for p in plans)} rows")


#: Larger centroid tables are left to centers.csv.
_TABLE_CELLS = 400


def _print_centroids(outcome) -> None:
    """A centroid table like Weka's SimpleKMeans: Full Data column, then one per cluster."""
    s = outcome.summary
    names = s["attributes"]
    k, m = len(outcome.centres), len(names)
    if k * m > _TABLE_CELLS:
        click.echo(f"({k} x {m} centroids: see centers.csv)")
        return
    table = outcome.table()
    heads = ["Full Data"] + [str(j) for j in range(k)]
    sizes = [f"({s['n']}.0)"] + [f"({v}.0)" for v in s["sizes"]]
    # numbers with Weka's 4 decimals, a nominal attribute's category as its name
    cols = [[v if isinstance(v, str) else f"{v:.4f}" for v in row] for row in table]
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
    per = f"{plural(s['threads_per_rank'], 'thread')}/rank" if s["backend"] == "cpu" \
        else ", ".join(s["devices"])
    click.echo(f"mpikmeans {s['version']}: {plural(s['n'], 'row')} x {plural(s['m'], 'attribute')}, k={s['k']}, "
               f"{plural(s['ranks'], 'rank')}, backend {s['backend']} ({per}), {s['dtype']}")
    state = "converged" if s["converged"] else "stopped"
    resumed = f", resumed at iteration {s['resumed_at_iteration']}" if s.get("resumed_from") else ""
    units = "" if s["inertia_units"] == "data" else f" ({s['inertia_units']} units)"
    restarts = f", best of {s['n_init']} restarts (#{s['best_restart']})" if s["n_init"] > 1 else ""
    click.echo(f"{state} after {plural(s['iterations'], 'iteration')} ({s['stop_reason']}{resumed}{restarts}); "
               f"SSE{units} {s['inertia']:.10g}")
    sizes = s["sizes"]
    shown = " ".join(str(v) for v in sizes[:20]) + (" ..." if len(sizes) > 20 else "")
    click.echo(f"cluster sizes: {shown}")
    rate = f"{mb / t['read_s']:.0f} MB/s, " if t["read_s"] > 0 else ""
    launch = f"launch {t['launch_s']:.3f} s, " if "launch_s" in t else ""
    click.echo(f"timings: {launch}read {t['read_s']:.3f} s ({rate}start-up {t['startup_s']:.3f} s), "
               f"backend set-up {t['setup_s']:.3f} s, "
               f"init {t['init_s']:.3f} s, "
               f"compute {t['compute_s']:.3f} s ({1e3 * t['per_iteration_s']:.2f} ms/iteration), "
               f"write {t['write_s']:.3f} s, total {t['total_s']:.3f} s")
    click.echo(f"results: {out_dir}/ (centers.csv, labels.txt, model.json, summary.json)")


def _number(v) -> str:
    return "" if v is None else f"{v:.6g}"


def _print_sweep(sweep: dict) -> None:
    """The K sweep's table, the suggested K and where the results are (stdout)."""
    columns, rows = sweep["columns"], sweep["rows"]
    heads = {"k": "K", "sse": "SSE", "iterations": "iter", "calinski_harabasz": "CH", "davies_bouldin": "DB",
             "silhouette_sqeuclidean": "silh.sq", "silhouette_sample": "silh.sample", "seconds": "s"}
    cells = [[str(v) if isinstance(v, int) else (f"{v:.2f}" if name == "seconds" else _number(v))
              for name, v in zip(columns, row)] for row in rows]
    widths = [max(len(heads[c]), *(len(r[j]) for r in cells)) for j, c in enumerate(columns)]
    click.echo("  ".join(f"{heads[c]:>{w}}" for c, w in zip(columns, widths)))
    for r in cells:
        click.echo("  ".join(f"{v:>{w}}" for v, w in zip(r, widths)))
    knee = sweep["knee"]
    if knee is None:
        click.echo(f"suggested K: none ({sweep['rule']}: fewer than 3 K, or no knee in the SSE)")
    else:
        click.echo(f"suggested K = {knee} ({sweep['rule']})")
    if sweep.get("best"):
        click.echo("best K by score: " + ", ".join(f"{heads[name]} {k}" for name, k in sweep["best"].items()))
    ks = [row[0] for row in rows]
    dirs = f"k{ks[0]}/" if len(ks) == 1 else f"k{ks[0]}/ ... k{ks[-1]}/"
    click.echo(f"results: {sweep['out_dir']}/ ({dirs}, sweep.csv{', sweep.png' if sweep['plot'] else ''})")
