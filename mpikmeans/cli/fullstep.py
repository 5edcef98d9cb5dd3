"""No command: ``cli/__init__.py`` imports this module, which registers nothing.

The GPU step's timing is ``python bench/fullstep.py`` beside the package (see
BENCHMARKS.md).  This file goes together with its name in ``cli/__init__.py``'s
import and ``COMMANDS``.
"""
