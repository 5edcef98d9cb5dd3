"""Benchmarks of the tool against the tools a user would pick instead, timed in the same run.

``mpikmeans bench`` (:mod:`mpikmeans.cli.bench`) drives everything here:
:mod:`.sweeps` (time against processes, rows, attributes and clusters through
the real command, the specification's §5.7), :mod:`.references` (scikit-learn and
PyTorch on the same data), :mod:`.plots` (the figures of BENCHMARKS.md).
"""
