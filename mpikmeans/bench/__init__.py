"""What a user runs to measure the tool on their own machine or cluster, beside the tools they would pick instead.

``mpikmeans bench`` (:mod:`mpikmeans.cli.bench`) drives everything here, and
every measurement starts the tool as a user does (``mpikmeans run ...``, under
``mpirun`` where asked) and reads the run's own ``summary.json``:

* :mod:`.sweeps` (``bench run``) with :mod:`.plots` (``bench plot``): compute time
  against processes, rows, attributes and clusters, and read time against
  processes (the specification's §5.7 and appendix 3);
* :mod:`.runs` (``bench runs``): whole runs phase by phase over shapes,
  initialisations, data types, backends and kernel caches, and one run per K;
* :mod:`.harness` (starting the tool, timing, the machine, the result file),
  :mod:`.data` (inputs made by ``gen-data`` and ``convert``) and
  :mod:`.references` (scikit-learn and PyTorch on the same data).

Kernel studies and developer measurements live beside the package, in the
repository's ``bench/`` folder, and use only the tool's public interfaces.
The modes return results and report progress through a callable; the CLI prints.
"""
