"""``python -m mpikmeans``: the same as the ``mpikmeans`` command."""

from .cli import entry

entry()
