"""``mpikmeans predict MODEL DATA``: apply a saved model to new rows, print the summary on rank 0."""

from __future__ import annotations

import click

from ..config import BACKENDS, DTYPES
from .app import _guarded, main


@main.command(short_help="Apply a saved model (model.json) to DATA: each row's cluster.")
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("data", type=click.Path(dir_okay=False))
@click.option("--output-dir", "-o", help="Where the results go  [default: DATA without .arff, or the whole name of "
              "a CSV or .npy file, + .predict/: new.arff -> new.predict/]")
@click.option("--distances", is_flag=True, help="Also write distances.txt: each row's distance to its centre.")
@click.option("--transform", is_flag=True,
              help="Also write transform.npy: each row's distance to every centre (rows x K, float64).")
@click.option("--write-arff", is_flag=True,
              help="Also write clustered.arff: the rows with a nominal cluster attribute (Weka's AddCluster).")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="auto: the GPU where one is there and the assignment outweighs moving the rows to it, else the CPU "
              "(the same labels either way).")
@click.option("--dtype", type=click.Choice(DTYPES), help="Precision of the rows on a GPU  [default: the model's]")
@click.option("--ignore", help="More of DATA's attributes to leave out (names, first, last, 1-based indices, "
              "ranges); those the model left out are left out anyway.")
@click.option("--threads", type=int, help="CPU threads per rank  [default: as run]")
@click.option("--share-gpus", is_flag=True, help="Allow more ranks per node than GPUs.")
@click.option("--chunk-rows", type=int, help="GPU: stream the rows in chunks of this many.")
@click.option("--overwrite", is_flag=True, help="Replace the results already in the output directory.")
@click.option("-v", "--verbose", count=True, help="Progress on stderr (-vv: every rank's).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
def predict(model, data, output_dir, distances, transform, write_arff, backend, dtype, ignore, threads, share_gpus,
            chunk_rows, overwrite, verbose, quiet):
    """Assign every row of DATA to the nearest centre of MODEL (a model.json a run wrote).

    DATA's attributes must be the model's, by name, type and order, once the
    attributes the model left out (and --ignore's) are left out; its rows are
    scaled with the model's scaling.  Results (labels.txt, summary.json, and
    distances.txt, transform.npy or clustered.arff when asked) go to
    --output-dir.  Exit codes: 0 done, 1 runtime failure, 2 usage error (MODEL
    is not a model), 3 bad input data (a damaged model, DATA's attributes do
    not match it, a bad row).
    """
    if distances and transform:
        raise click.UsageError("--distances and --transform: choose one (transform.npy holds the distances to every "
                               "centre, the nearest among them)")
    if threads is not None and threads < 1:
        raise click.UsageError(f"--threads {threads}: expected an integer >= 1")
    if chunk_rows is not None and chunk_rows < 1:
        raise click.UsageError(f"--chunk-rows {chunk_rows}: expected an integer >= 1")

    def body(comm):
        from .. import IMPORTED_AT
        from ..predict import PredictConfig, predict_job

        cfg = PredictConfig(output_dir=output_dir, distances=distances, transform=transform, write_arff=write_arff,
                            backend=backend, dtype=dtype, threads=threads, share_gpus=share_gpus,
                            chunk_rows=chunk_rows, ignore=ignore, overwrite=overwrite)
        outcome = predict_job(comm, model, data, cfg, launched_at=IMPORTED_AT)
        if comm.rank == 0 and not quiet:
            _print_summary(outcome.summary, outcome.out_dir)
        return 0

    _guarded(verbose, quiet, body)


def _print_summary(s: dict, out_dir: str) -> None:
    t = s["timings"]
    devices = f" ({', '.join(s['devices'])})" if s["devices"] else ""
    click.echo(f"mpikmeans {s['version']} predict: {s['n']} rows x {s['m']} attributes, k={s['k']}, "
               f"{s['ranks']} rank{'s' if s['ranks'] != 1 else ''}, backend {s['backend']}{devices}, {s['dtype']}")
    units = "" if s["inertia_units"] == "data" else f" ({s['inertia_units']} units)"
    dropped = s["input_rows"] - s["n"]
    note = f"; {dropped} row{'s' if dropped != 1 else ''} dropped for a missing value (label -1)" if dropped else ""
    click.echo(f"SSE{units} {s['inertia']:.10g} on these rows (the model's: {s['model_inertia']:.10g} on "
               f"{s['model_n']} training rows){note}")
    sizes = s["sizes"]
    click.echo("cluster sizes: " + " ".join(str(v) for v in sizes[:20]) + (" ..." if len(sizes) > 20 else ""))
    click.echo(f"timings: read {t['read_s']:.3f} s (start-up {t['startup_s']:.3f} s), set-up {t['setup_s']:.3f} s, "
               f"assign {t['assign_s']:.3f} s, write {t['write_s']:.3f} s, total {t['total_s']:.3f} s")
    click.echo(f"results: {out_dir}/ ({', '.join(s['files'])})")
