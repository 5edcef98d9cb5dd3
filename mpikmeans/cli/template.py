"""``mpikmeans template``: write a self-contained batch job script (PBS/Torque, PBS Pro, Slurm)."""

from __future__ import annotations

import os
import stat

import click

from ..errors import RunError
from ..jobs import KINDS, render
from .app import main


_HELP = """Write the job script for KIND; it needs no checkout and sources nothing.

\b
Kinds:
""" + "\n".join(f"  {k:<8} {what}" for k, (_, what) in KINDS.items()) + """

\b
Then edit its resources and submit it from the directory of your data:
  mpikmeans template pbs -o job.pbs && qsub -v DATA=big.arff,K=50 job.pbs
  mpikmeans template slurm -o job.sbatch && sbatch --export=ALL,DATA=big.arff,K=50 job.sbatch
"""


@main.command(help=_HELP)
@click.argument("kind", type=click.Choice(list(KINDS)))
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write the script here (made executable)  [default: standard output]")
@click.option("--force", is_flag=True, help="Replace an existing file.")
def template(kind, output, force):
    text = render(kind)
    if output is None:
        click.echo(text, nl=False)
        return
    if os.path.exists(output) and not force:
        raise click.UsageError(f"{output} exists; pass --force to replace it")
    # imported here: io.output's number formatting imports numba, which the other commands' parsing never needs
    from ..io.output import write_atomic

    try:
        write_atomic(output, text.encode("utf-8"))
        os.chmod(output, os.stat(output).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except RunError as exc:
        raise click.ClickException(exc.message) from None
    except OSError as exc:
        raise click.FileError(output, hint=exc.strerror) from None
    click.echo(f"wrote {output} ({KINDS[kind][1]})", err=True)
