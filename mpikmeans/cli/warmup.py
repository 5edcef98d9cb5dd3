"""``mpikmeans warmup``: compile every kernel a run needs before the run (a job prologue, ``make run``)."""

from __future__ import annotations

import click

from ..config import DTYPES
from ..errors import UsageError
from ..warmup import CPU_PARTS, GPU_PARTS, HELPER_PARTS
from . import _guarded, main


@main.command()
@click.argument("data", required=False, type=click.Path(dir_okay=False, exists=True))
@click.option("-k", "k", type=click.IntRange(min=1), help="Clusters of the coming run (needed for --gpu).")
@click.option("-m", "m", type=click.IntRange(min=1), help="Attributes clustered  [default: DATA's numeric ones]")
@click.option("--gpu/--no-gpu", "gpu", default=None,
              help="Also compile the GPU kernels for -k and -m  [default: when a GPU is usable and -k is given]")
@click.option("--dtype", type=click.Choice(DTYPES), default="float64", show_default=True,
              help="Precision of the data on the GPU.")
@click.option("--rows", type=click.IntRange(min=1),
              help="Rows of the largest rank of the coming run (above 2**31 / M they need other GPU kernels) "
                   "[default: DATA's rows, else 1]")
@click.option("--part", "parts", type=click.Choice(("all",) + HELPER_PARTS), multiple=True, hidden=True,
              help="What a cold run's helper processes compile (repeatable; default all): 'rest' the CPU "
                   "kernels but the parser's (the run compiles it meanwhile) and the backend's, 'cpu-step' and "
                   "'cpu-init' the CPU backend's (step and assignment; initialisations), 'gpu-full', "
                   "'gpu-assign', 'gpu-delta' and 'gpu-init' the GPU kernels of the full step, the final "
                   "assignment, the incremental step and the initialisations, 'gpu-fixed' the CPU kernels "
                   "that sum a GPU run's fixed-point centres again.")
@click.option("-q", "--quiet", is_flag=True)
def warmup(data, k, m, gpu, dtype, rows, parts, quiet):
    """Compile (or check the caches hold) every kernel a run will need.

    \b
    CPU kernels (reader, writers, CPU backend, initialisations) are compiled
    whatever the arguments; the GPU kernels depend on the shape of the run:
      mpikmeans warmup                          # CPU kernels
      mpikmeans warmup data.arff -k 50 --gpu    # and the GPU kernels for data.arff's M
      mpikmeans warmup -k 50 -m 100 --dtype float32
    Under mpirun one rank per node compiles; the others wait.
    """

    def body(comm):
        from ..runner import gpu_possible, rank_threads
        from ..warmup import cache_status, warm_cpu, warm_cpu_backend, warm_gpu, warm_rest

        use_gpu = gpu
        if use_gpu is None:
            use_gpu = k is not None and gpu_possible()
        shape = _shape(comm, data, m, rows) if use_gpu else None
        if use_gpu and k is None:
            raise UsageError("--gpu needs -k (the GPU kernels are compiled for K centres)", collective=True)
        report = {}
        todo = set(parts or ["all"])
        if comm.node_rank == 0:
            threads = rank_threads(comm)
            if "all" in todo:
                report["cpu_s"] = warm_cpu(threads)
            else:
                cpu_parts = tuple(p for p in CPU_PARTS if f"cpu-{p}" in todo)
                report["cpu_s"] = (warm_rest(threads) if "rest" in todo else 0.0) + \
                    (warm_cpu_backend(threads, cpu_parts) if cpu_parts else 0.0)
            gpu_parts = tuple(p for p in GPU_PARTS if todo & {"all", f"gpu-{p}"})
            if use_gpu and gpu_parts:
                from ..backends.gpu import gpu_available, select_device_for

                if not gpu_available():
                    raise UsageError("--gpu: no usable CUDA GPU here", collective=True)
                device = select_device_for(0, 1, False)
                report["gpu_s"] = warm_gpu(k, shape[0], dtype, shape[1], device, parts=gpu_parts)
        comm.barrier()
        if comm.rank == 0 and not quiet:
            cache = cache_status()
            line = f"warm: CPU kernels in {report.get('cpu_s', 0.0):.1f} s"
            if "gpu_s" in report:
                line += f", GPU kernels for k={k}, m={shape[0]}, {dtype} in {report['gpu_s']:.1f} s"
            click.echo(line)
            click.echo(f"cache: {cache['root']} ({cache['cpu_kernels_cached']} of {cache['cpu_kernels']} main CPU "
                       f"kernels, {cache['gpu_kernels']} GPU kernels)")
        return 0

    _guarded(0, quiet, body)


def _shape(comm, data, m, rows) -> tuple:
    """(M, rows) of the coming run: from the options, else from DATA."""
    if data is not None and (m is None or rows is None):
        from ..warmup import data_shape

        m_data, n_data = comm.from_root(lambda: data_shape(data))
        m = m or m_data
        rows = rows or n_data
    if m is None:
        raise UsageError("the GPU kernels need M: give DATA or -m", collective=True)
    return m, rows or 1
