"""Command line: ``mpikmeans run | predict | gen-data | convert | warmup | info | template | bench``.

Thin: parse options, call the library, print on rank 0; the only package that
prints.  :mod:`.app` holds the group and the error reporting; each command
lives in a module of its own, which registers it on the group when imported.
"""

from __future__ import annotations

from . import bench, data, info, predict, run, template, warmup
from .app import entry, main

__all__ = ["entry", "main"]

#: the modules of the commands
COMMANDS = (bench, data, info, predict, run, template, warmup)

if __name__ == "__main__":  # pragma: no cover
    entry()
