"""``mpikmeans bench fullstep``: the GPU's full Lloyd step against its floor and PyTorch (its own module:
``cli/bench.py`` holds the other modes)."""

from __future__ import annotations

import click

from ..errors import MpikmeansError
from .bench import _bench_failed, _save, bench


@bench.command("fullstep")
@click.option("--cases", default="A,B,C,D,E", show_default=True, help="Comma list of A-E or NxMxK.")
@click.option("--dtype", default="float32,float64", show_default=True, help="Comma list of float32, float64.")
@click.option("--iters", type=int, default=20, show_default=True, help="Lloyd iterations per run (each step timed).")
@click.option("--noise", type=float, default=4.0, show_default=True,
              help="Standard deviation of the rows around their blob's centre (labels keep moving).")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed runs of the PyTorch iteration.")
@click.option("--stream", default="", help="Also a streamed case NxMxK (rows in pinned host memory).")
@click.option("--chunk-rows", type=int, default=0, help="Rows per chunk of the streamed case.")
@click.option("--no-torch", is_flag=True, help="Skip the PyTorch comparison.")
@click.option("--compare", default="",
              help='JSON list of kernel overrides to time beside each full run, e.g. \'[{"split": false}]\'.')
@click.option("--device", type=int, default=0, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--out", help="Result file  [default: bench/results/fullstep_<device>_<date>.json]")
def bench_fullstep(cases, dtype, iters, noise, repeats, stream, chunk_rows, no_torch, compare, device, seed, out):
    """Full Lloyd steps on the GPU inside runs whose labels keep changing, beside the floor and PyTorch.

    \b
    Cases: A = 5e6 x 100, K=50; B = 1e7 x 32, K=1000; C = 1e8 x 8, K=16;
           D = 3e5 x 257, K=1000; E = 2e6 x 3, K=7 (needs PyTorch and a GPU).
      mpikmeans bench fullstep --stream 50000000x32x16 --chunk-rows 5000000
    """
    from ..bench.fullstep import FullStepSettings, fullstep_table, run_fullstep
    from ..bench.gpu import default_out

    settings = FullStepSettings(cases, dtype, iters, noise, repeats, stream, chunk_rows, no_torch, device, seed,
                                compare)
    try:
        results = run_fullstep(settings, click.echo)
        out = out or default_out(results["device"], "fullstep")
        _save(out, "fullstep", settings, results)
    except MpikmeansError as exc:
        _bench_failed(exc)
    click.echo()
    for line in fullstep_table(results):
        click.echo(line)
    click.echo(f"wrote {out}")
