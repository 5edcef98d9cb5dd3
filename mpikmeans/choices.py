"""The names a user chooses among: backends, storage types, initialisations, scalings and scores.

Plain tuples, with no numpy or numba behind them, so that parsing the command
line (``--help``, and every usage error) costs no compiler's import.  Each
module that implements a choice takes its names from here and keys its
registry by them: :func:`mpikmeans.backends.make_backend` (``BACKEND_NAMES``),
:mod:`mpikmeans.init` (``INIT_METHODS``), :mod:`mpikmeans.scaling`
(``NORMALIZE_METHODS``), :mod:`mpikmeans.scores` (``SCORE_CHOICES``).
"""

from __future__ import annotations

#: ``--backend``: ``auto`` takes the node-local rank's GPU where one is usable, else the CPU
BACKEND_NAMES = ("auto", "cpu", "gpu")
#: ``--dtype``: how a backend stores the rows (the CPU computes in float64 whatever it is given)
DTYPES = ("float64", "float32")
#: ``--init``: the random and deterministic initialisations (besides a file of centres or a model)
INIT_METHODS = ("k-means++", "k-means||", "range", "sample")
#: ``--normalize``: the per-attribute scalings
NORMALIZE_METHODS = ("none", "minmax", "zscore")
#: ``--scores``: every quality score, or none
SCORE_CHOICES = ("all", "none")
#: ``--score-sample``: rows of the sampled (scikit-learn) silhouette
DEFAULT_SCORE_SAMPLE = 10_000

__all__ = ["BACKEND_NAMES", "DEFAULT_SCORE_SAMPLE", "DTYPES", "INIT_METHODS", "NORMALIZE_METHODS", "SCORE_CHOICES"]
