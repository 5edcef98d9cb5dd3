"""``mpikmeans warmup``: compile every kernel of this machine before any run (``make run``, a job prologue)."""

from __future__ import annotations

import os

import click

from ..cache import CPU_HELPERS, PARTS, cache_root, is_warm
from ..errors import RunError
from .app import _guarded, main


@main.command()
@click.option("--gpu/--no-gpu", "gpu", default=None,
              help="Also compile the GPU kernels (both dtypes)  [default: where a GPU is usable]")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Parts compiled side by side, each in a process  [default: one per part, at most the CPUs]")
@click.option("--part", type=click.Choice(PARTS + CPU_HELPERS), default=None,
              help="Compile one part in this process (what the other forms start, one process a part; "
                   "the cpu part starts its pieces cpu-lloyd and cpu-host beside itself).")
@click.option("-q", "--quiet", is_flag=True)
def warmup(gpu, jobs, part, quiet):
    """Compile every kernel a run can need on this machine, once: no argument needed.

    \b
    The kernels take any shape, so this covers every K, M, dtype and input:
      mpikmeans warmup          # the CPU kernels, and the GPU's where a GPU is usable
      mpikmeans warmup --no-gpu
    The caches are shared by every later run (MPIKMEANS_CACHE_DIR, else
    ~/.cache/mpikmeans); mpikmeans info says what is warm.  Under mpirun one
    rank per node compiles; the others wait.
    """

    def body(comm):
        from ..startup import gpu_possible, rank_threads
        from ..warmup import parts_for, warm_part, warm_parts

        results = {}
        if part is not None:
            if comm.node_rank == 0:
                results[part] = (warm_part(part, rank_threads(comm)), "")
        else:
            use_gpu = gpu if gpu is not None else gpu_possible()
            todo = parts_for(use_gpu)
            if comm.node_rank == 0:
                results = warm_parts(todo, jobs or min(len(todo), os.cpu_count() or 1))
        failed = sorted({p for part_failed in comm.allgather([p for p, (_, e) in results.items() if e])
                         for p in part_failed})
        if comm.rank == 0 and not quiet:
            for p, (seconds, err) in results.items():
                click.echo(f"{p}: {'failed: ' + err if err else 'compiled'} in {seconds:.1f} s")
            click.echo(f"cache: {cache_root()}")
        if failed:
            raise RunError(f"warmup: could not compile {', '.join(failed)}", collective=True)
        return 0

    _guarded(0, quiet, body)


def warm_status() -> dict:
    """Each part's state here: ``warm``, or ``cold`` (``mpikmeans info`` shows it)."""
    return {p: "warm" if is_warm(p) else "cold" for p in PARTS}
