"""``mpikmeans run``: cluster a file, print the summary and Weka's centroid table on rank 0."""

from __future__ import annotations

import click
from click.core import ParameterSource

from ..config import (BACKENDS, DTYPES, EMPTY_POLICIES, MISSING_POLICIES, NOMINAL_POLICIES, NORMALIZE_METHODS,
                      build_config, load_yaml)
from ..errors import UsageError
from . import _guarded, main


_RUN_KEYS = ("k", "init", "seed", "max_iter", "tol", "backend", "dtype", "empty_cluster", "output_dir",
             "threads", "share_gpus", "chunk_rows", "checkpoint", "checkpoint_every", "resume", "overwrite",
             "ignore", "missing", "nominal", "n_init", "normalize", "write_arff")


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
@click.option("--empty-cluster", type=click.Choice(EMPTY_POLICIES), help="An empty cluster takes the farthest point (scikit-learn), keeps its centre, or is dropped (Weka)  [default: farthest]")
@click.option("--ignore", help="Attributes not to cluster: names, first, last, 1-based indices, ranges.")
@click.option("--missing", type=click.Choice(MISSING_POLICIES), help="Missing values '?'  [default: error]")
@click.option("--nominal", type=click.Choice(NOMINAL_POLICIES),
              help="Nominal attributes: skip them, or cluster them as Weka's SimpleKMeans (0/1 distance, the "
                   "mode as centroid)  [default: skip]")
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
        from ..interrupt import EXIT_CHECKPOINTED
        from ..runner import dry_run as plan_ranks
        from ..runner import run_job

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
        from .. import IMPORTED_AT

        outcome = run_job(comm, data, cfg, launched_at=IMPORTED_AT)
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
    launch = f"launch {t['launch_s']:.3f} s, " if "launch_s" in t else ""
    click.echo(f"timings: {launch}read {t['read_s']:.3f} s ({rate}start-up {t['startup_s']:.3f} s), "
               f"backend set-up {t['setup_s']:.3f} s, "
               f"init {t['init_s']:.3f} s, "
               f"compute {t['compute_s']:.3f} s ({1e3 * t['per_iteration_s']:.2f} ms/iteration), "
               f"write {t['write_s']:.3f} s, total {t['total_s']:.3f} s")
    click.echo(f"results: {out_dir}/ (centers.csv, labels.txt, summary.json)")
