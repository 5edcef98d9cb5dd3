"""Benchmarks of the tool against the tools a user would pick instead, timed in the same run.

``mpikmeans bench`` (:mod:`mpikmeans.cli.bench`) drives everything here; one harness
owns the timing, the data and the result format:

* :mod:`.harness`: starting the tool under the MPI launcher, time limits, statistics,
  CUDA-event timing, the machine description, the JSON result file;
* :mod:`.data`: synthetic inputs (gen-data through its report, ``.npy`` blobs, initial
  centres, data generated on the GPU);
* :mod:`.references`: scikit-learn, PyTorch and the text readers on the same data;
* one module per mode: :mod:`.sweeps` (``bench run``: time against processes, rows,
  attributes and clusters, the specification's §5.7) with :mod:`.plots` (``bench plot``),
  :mod:`.cpu`, :mod:`.reading` with :mod:`.readphases`, :mod:`.gpu`, :mod:`.mpigpu`,
  :mod:`.regs`, :mod:`.parity`; :mod:`.bytecode`, the device script's byte-compile step.

The modes return results and report progress through a callable; the CLI prints.
"""
