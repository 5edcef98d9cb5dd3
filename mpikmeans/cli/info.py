"""``mpikmeans info``: every rank's host, node-local rank, threads and GPU, and the MPI library."""

from __future__ import annotations

import json
import os

import click

from ..cache import bytecode_status, cache_root
from .app import _guarded, main
from .warmup import warm_status


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def info(as_json):
    """Show every rank: host, node-local rank, GPUs, MPI library, chosen backend."""

    def body(comm):
        from ..startup import gpu_possible, rank_threads

        gpus, auto = [], "cpu"
        try:
            if gpu_possible():  # else skip importing numba-cuda (slow) on a CPU node
                from ..backends.gpu import device_descriptions, gpu_available

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
            cache = {"root": cache_root(), "parts": warm_status(), "bytecode": bytecode_status()}
            if as_json:
                click.echo(json.dumps({"mpi_library": comm.library(), "cache": cache, "ranks": rows}, indent=2))
            else:
                click.echo(f"MPI library: {comm.library()}")
                parts = ", ".join(f"{p} {state}" for p, state in cache["parts"].items())
                cold = any(state == "cold" for p, state in cache["parts"].items() if p == "cpu" or gpus)
                click.echo(f"kernel cache: {cache['root']}: {parts}" + ("  (mpikmeans warmup compiles them)"
                                                                          if cold else ""))
                code = cache["bytecode"]
                if not code["cached"] and not code["writes"]:
                    click.echo("Python bytecode: none, and none is written (PYTHONDONTWRITEBYTECODE): every run "
                               "compiles the sources of this package again; byte-compile it once (python -m "
                               "compileall), or set PYTHONPYCACHEPREFIX to a writable directory and unset the variable")
                else:
                    click.echo("Python bytecode: cached" + (f" in {code['prefix']}" if code["prefix"] else ""))
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
