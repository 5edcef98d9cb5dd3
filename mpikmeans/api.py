"""A scikit-learn-shaped Python API: ``from mpikmeans import KMeans``.

In one process it clusters a NumPy array; given a communicator
(``mpikmeans.comm.world()`` under ``mpirun``) every rank passes its own rows,
the fit is collective, and ``labels_`` holds this rank's rows.  It is a thin
shell over the same pieces as ``mpikmeans run``: :func:`fit_scaler`,
:func:`mpikmeans.restarts.run_restarts` (initialisation + :func:`mpikmeans.lloyd.lloyd`) and a
backend, so both give the same result for the same data and settings.

Example::

    from mpikmeans import KMeans
    km = KMeans(n_clusters=3, normalize="minmax", random_state=1).fit(x)
    km.cluster_centers_, km.labels_, km.inertia_, km.n_iter_
    km.save("model.json")                     # the model file `mpikmeans run` writes
    km2 = mpikmeans.load("model.json")        # a fitted KMeans: predict, transform, score
"""

from __future__ import annotations

import numpy as np

from .backends import make_backend
from .choices import BACKEND_NAMES, DEFAULT_SCORE_SAMPLE as DEFAULT_SAMPLE, INIT_METHODS, NORMALIZE_METHODS
from .comm import SerialComm, default_threads
from .errors import UsageError
from .fixedsums import Scales, cluster_sums, column_magnitudes, decode
from .lloyd import prepare_loop
from .model import Model, load_model, write_model
from .restarts import run_restarts
from .scaling import fit_scaler
from .scores import all_dist2, quality_scores

_EMPTY_POLICIES = ("farthest", "keep", "drop")


class KMeans:
    """Lloyd's k-means over MPI ranks with scikit-learn's interface.

    Parameters
    ----------
    n_clusters : int
    init : {"k-means++", "k-means||", "range", "sample"} or ndarray, shape (n_clusters, m)
        An array gives the initial centres in the data's units (scaled with
        the data when ``normalize`` is set); then ``n_init`` must be 1.
    n_init : int
        Initialisations; the one with the lowest SSE is kept (restart 0 uses
        ``random_state`` itself, see :func:`mpikmeans.restarts.restart_seeds`).
    max_iter : int
    tol : float
        Stop when no centre moves more than ``tol`` (Euclidean, in the scaled
        units); 0: when no label changes.
    random_state : int or None
        Seed; None draws one (on rank 0, shared with the other ranks).
    normalize : {"none", "minmax", "zscore"}
        Attribute scaling with global statistics; ``minmax`` is Weka's default.
    empty_cluster : {"farthest", "keep", "drop"}
        An empty cluster takes the point farthest from its centre (scikit-learn's
        rule, the default), keeps its centre, or is removed (Weka's).
    backend : {"cpu", "gpu", "auto"} or Backend
        A Backend instance is used as is (loaded with the data by ``fit``).
    comm : Comm, SerialComm or None
        None: this process alone.
    threads : int, optional
        CPU threads per rank; default: as ``mpikmeans run``, this rank's share
        of its node's CPUs (:func:`mpikmeans.comm.default_threads`).
    init_options : dict, optional
        ``rounds``, ``oversampling`` (k-means||), ``n_local_trials`` (k-means++).

    Attributes
    ----------
    cluster_centers_ : ndarray, shape (n_clusters, m), float64
        In the data's units.
    labels_ : ndarray, shape (n_local,), int32
        Cluster of each row passed to ``fit`` (this rank's rows).
    inertia_ : float
        Global SSE of the final assignment, in the scaled units.
    n_iter_ : int
    n_features_in_ : int
    converged_ : bool
    stop_reason_ : str
    scaler_ : mpikmeans.scaling.Scaler
    scaled_centers_ : ndarray, shape (n_clusters, m)
        The centres in the scaled units (where the SSE is measured).
    restarts_ : list of dict
        Per restart: seed, inertia, iterations, timings.
    n_samples_ : int
        Rows over all ranks.
    feature_names_in_ : ndarray of str
        The columns' names when ``fit`` was given a table with names (a pandas
        DataFrame's columns; :func:`load`: the model's attributes).
    model_ : mpikmeans.model.Model
        What :meth:`save` writes (:func:`load`: what it read).
    """

    def __init__(self, n_clusters: int = 8, *, init="k-means++", n_init: int = 1, max_iter: int = 300,
                 tol: float = 0.0, random_state: int | None = 0, normalize: str = "none",
                 empty_cluster: str = "farthest", backend="cpu", comm=None, threads: int | None = None,
                 init_options: dict | None = None):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.normalize = normalize
        self.empty_cluster = empty_cluster
        self.backend = backend
        self.comm = comm
        self.threads = threads
        self.init_options = init_options

    # -- scikit-learn's estimator protocol ------------------------------------
    _PARAMS = ("n_clusters", "init", "n_init", "max_iter", "tol", "random_state", "normalize", "empty_cluster",
               "backend", "comm", "threads", "init_options")

    def get_params(self, deep: bool = True) -> dict:
        """The constructor's parameters (scikit-learn's ``clone`` uses them)."""
        return {p: getattr(self, p) for p in self._PARAMS}

    def set_params(self, **params) -> "KMeans":
        """Set constructor parameters; returns self."""
        for key, value in params.items():
            if key not in self._PARAMS:
                raise ValueError(f"invalid parameter {key!r} for KMeans")
            setattr(self, key, value)
        return self

    def __repr__(self) -> str:
        return f"KMeans(n_clusters={self.n_clusters}, init={self.init!r}, n_init={self.n_init}, " \
               f"normalize={self.normalize!r}, random_state={self.random_state!r})"

    # -- fitting -------------------------------------------------------------------
    def _check(self, comm) -> None:
        if not (isinstance(self.n_clusters, (int, np.integer)) and self.n_clusters >= 1):
            raise UsageError(f"n_clusters={self.n_clusters!r}: expected an integer >= 1")
        if isinstance(self.init, str) and self.init not in INIT_METHODS:
            raise UsageError(f"init={self.init!r}: expected one of {', '.join(INIT_METHODS)} or an array")
        if self.normalize not in NORMALIZE_METHODS:
            raise UsageError(f"normalize={self.normalize!r}: expected one of {', '.join(NORMALIZE_METHODS)}")
        if self.empty_cluster not in _EMPTY_POLICIES:
            raise UsageError(f"empty_cluster={self.empty_cluster!r}: expected one of {', '.join(_EMPTY_POLICIES)}")
        if not (isinstance(self.max_iter, (int, np.integer)) and self.max_iter >= 1):
            raise UsageError(f"max_iter={self.max_iter!r}: expected an integer >= 1")
        if not (self.tol >= 0):
            raise UsageError(f"tol={self.tol!r}: expected a number >= 0")
        if isinstance(self.backend, str) and self.backend not in BACKEND_NAMES:
            raise UsageError(f"backend={self.backend!r}: expected one of {', '.join(BACKEND_NAMES)} or a Backend")

    def _threads(self, comm) -> int:
        # the same default as ``mpikmeans run``: this rank's share of its node's CPUs
        return self.threads or default_threads(comm)

    def _make_backend(self, comm):
        if not isinstance(self.backend, str):
            return self.backend
        options = {"threads": self._threads(comm), "node_ranks": comm.node_size}
        if self.backend in ("gpu", "auto"):
            try:
                from .backends.gpu import gpu_available, select_device_for
            except ImportError:
                gpu_available = None
            if gpu_available is not None and (self.backend == "gpu" or gpu_available()):
                options["device"] = select_device_for(comm.node_rank, comm.node_size, False)
        return make_backend(self.backend, **options)

    def _seed(self, comm) -> int:
        if self.random_state is not None:
            seed = int(self.random_state)
            if seed < 0:
                raise UsageError(f"random_state={seed}: expected an integer >= 0")
            return seed
        fresh = None
        if comm.rank == 0:  # one draw, shared: every rank must start from the same seed
            fresh = int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(1))
        return comm.bcast(fresh, root=0)

    def fit(self, X, y=None, sample_weight=None) -> "KMeans":
        """Cluster the rows of all ranks (collective under MPI).

        Parameters
        ----------
        X : array-like, shape (n_local, m)
            This rank's rows (all rows in one process).
        y : ignored
        sample_weight : array-like, shape (n_local,), optional
            Instance weights (sums, counts, SSE and the D² sampling are weighted).

        Returns
        -------
        self
        """
        comm = self.comm if self.comm is not None else SerialComm()
        self._check(comm)
        names = getattr(X, "columns", None)
        x = np.ascontiguousarray(X, dtype=np.float64)
        if x.ndim != 2:
            raise UsageError(f"X must be 2-D (rows x attributes), got shape {x.shape}")
        weights = None
        if sample_weight is not None:
            weights = np.ascontiguousarray(sample_weight, dtype=np.float64)
            if weights.shape != (len(x),) or not np.isfinite(weights).all() or (weights < 0).any():
                raise UsageError("sample_weight must hold one finite weight >= 0 per row")
        # every rank learns the split: its first row's global index and the total
        shapes = comm.allgather((len(x), x.shape[1], bool(np.isfinite(x).all())))
        widths = {s[1] for s in shapes if s[0] > 0} or {x.shape[1]}
        if len(widths) != 1:
            raise UsageError(f"the ranks' X have different numbers of attributes: {sorted(widths)}")
        if not all(s[2] for s in shapes):
            raise UsageError("X holds NaN or infinite values")
        n = sum(s[0] for s in shapes)
        row_offset = sum(s[0] for s in shapes[: comm.rank])
        k = int(self.n_clusters)
        if k > n:
            raise UsageError(f"n_clusters={k} is more than the {n} rows")
        seed = self._seed(comm)

        scaler = fit_scaler(comm, x, self.normalize)
        z = scaler.transform(x)
        init = self.init
        if not isinstance(init, str):
            init = scaler.transform(np.asarray(init, dtype=np.float64))

        backend = self._make_backend(comm)
        try:
            backend.load(z, weights)
            prepare_loop(backend, k, z.shape[1])  # as a command's set-up does: not in the first iteration
            out = run_restarts(comm, backend, z, row_offset, n, k, init=init, seed=seed, n_init=int(self.n_init),
                               weights=weights, max_iter=int(self.max_iter), tol=float(self.tol),
                               empty_cluster=self.empty_cluster, init_options=self.init_options)
        finally:
            if isinstance(self.backend, str):
                backend.close()
        best = out.best
        self.scaler_ = scaler
        self.scaled_centers_ = best.centres
        self.cluster_centers_ = scaler.inverse(best.centres)
        self.labels_ = best.labels
        self.inertia_ = best.inertia
        self.n_iter_ = best.iterations
        self.converged_ = best.converged
        self.stop_reason_ = best.stop_reason
        self.sizes_ = best.sizes
        self.history_ = best.history
        self.restarts_ = out.restarts
        self.best_restart_ = out.best_index
        self.n_features_in_ = x.shape[1]
        self.n_samples_ = n
        self.seed_ = seed
        if names is not None and len(names) == x.shape[1]:
            self.feature_names_in_ = np.array([str(c) for c in names], dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        self.model_ = self._model(init)
        return self

    def fit_predict(self, X, y=None, sample_weight=None) -> np.ndarray:
        """``fit(X).labels_``: this rank's labels, shape (n_local,), int32."""
        return self.fit(X, sample_weight=sample_weight).labels_

    def predict(self, X) -> np.ndarray:
        """Nearest fitted centre of each row (local: no communication).

        Parameters
        ----------
        X : array-like, shape (n, m), in the data's units

        Returns
        -------
        ndarray, shape (n,), int32
            Distances are measured in the scaled units, ties to the lowest
            centre, exactly as during ``fit`` (``predict`` of the training
            rows gives ``labels_``).
        """
        return self._assign(X)[0]

    def transform(self, X) -> np.ndarray:
        """Euclidean distance of each row to each centre, in the scaled units (local: no communication).

        Each squared distance adds its terms in attribute order, as the
        backends do: the smallest of a row's is the one :meth:`predict` takes,
        to the bit, and ``mpikmeans predict --transform`` writes the same values.

        Parameters
        ----------
        X : array-like, shape (n, m), in the data's units

        Returns
        -------
        ndarray, shape (n, n_clusters), float64
        """
        return np.sqrt(all_dist2(self._scaled(X), self.scaled_centers_))

    def score(self, X, y=None, sample_weight=None) -> float:
        """Minus the SSE of ``X`` to the fitted centres (scikit-learn's sign), in the scaled units.

        Collective under a communicator, as :meth:`fit`: every rank passes its
        rows and gets the total of all of them, summed exactly (the same bits
        at any number of ranks).

        Parameters
        ----------
        X : array-like, shape (n_local, m)
        y : ignored
        sample_weight : array-like, shape (n_local,), optional

        Returns
        -------
        float
        """
        comm = self.comm if self.comm is not None else SerialComm()
        z = self._scaled(X)
        labels, d2 = self._assign(X)
        w = None if sample_weight is None else np.ascontiguousarray(sample_weight, dtype=np.float64)
        if w is not None and w.shape != (len(z),):
            raise UsageError("sample_weight must hold one weight per row")
        k = len(self.scaled_centers_)
        bounds = np.append(column_magnitudes(z), w.max() if w is not None and len(w) else 0.0)
        bounds = comm.allreduce(bounds, "max")
        weighted = bool(comm.allreduce(np.array([w is not None], dtype=np.int64), "max")[0])
        exponent = Scales.of(bounds[:-1], float(bounds[-1]) if weighted else 1.0).sse_exponent(self.scaled_centers_)
        limbs = comm.allreduce(cluster_sums(labels, d2, w, k, exponent).sum(axis=0), "sum")
        return -float(decode(limbs, exponent))

    def quality(self, X, labels=None, *, sample_weight=None, sample_size: int = DEFAULT_SAMPLE,
                seed: int | None = None) -> dict:
        """Calinski–Harabasz, Davies–Bouldin and the silhouettes of a clustering of ``X`` (collective, as :meth:`fit`).

        See :func:`mpikmeans.scores.quality_scores`: exact over the ranks, in the scaled units.

        Parameters
        ----------
        X : array-like, shape (n_local, m)
            This rank's rows.
        labels : array-like, shape (n_local,), optional
            Default: :meth:`predict` of ``X``.
        sample_weight : array-like, shape (n_local,), optional
        sample_size : int
            Rows of the sampled (scikit-learn) silhouette; 0 leaves it out.
        seed : int, optional
            Of the sample; default: the fit's seed.

        Returns
        -------
        dict
        """
        comm = self.comm if self.comm is not None else SerialComm()
        z = self._scaled(X)
        labels = self.predict(X) if labels is None else np.asarray(labels, dtype=np.int32)
        return quality_scores(comm, z, labels, len(self.scaled_centers_), weights=sample_weight,
                              centres=self.scaled_centers_, sample_size=sample_size,
                              seed=self.seed_ if seed is None else seed, threads=self._threads(comm))

    # -- the model file --------------------------------------------------------------
    def _model(self, init) -> Model:
        """The fitted clustering as a :class:`~mpikmeans.model.Model`."""
        names = list(getattr(self, "feature_names_in_", [f"x{j}" for j in range(self.n_features_in_)]))
        attributes = [{"name": name, "type": "numeric", "role": "clustered"} for name in names]
        info = {"data": None, "iterations": int(self.n_iter_), "converged": bool(self.converged_),
                "stop_reason": self.stop_reason_,
                "sizes": None if self.sizes_ is None else [int(v) for v in self.sizes_]}
        return Model(attributes, "skip", {"policy": "error", "fill": None}, self.scaler_,
                     np.array(self.scaled_centers_, dtype=np.float64), "float64",
                     init if isinstance(init, str) else "array", int(self.seed_), float(self.inertia_),
                     int(self.n_samples_), info)

    def save(self, path: str, overwrite: bool = False) -> None:
        """Write the fitted model to ``path`` as ``model.json`` (collective under a communicator: rank 0 writes).

        The format ``mpikmeans run`` writes (docs/model.md): ``mpikmeans predict
        path DATA`` and :func:`load` read it.  The columns are named after
        ``feature_names_in_`` where ``fit`` had names, else ``x0, x1, ...``.

        Parameters
        ----------
        path : str
        overwrite : bool
            Replace an earlier model there (a file that is not a model is never written over).

        Raises
        ------
        UsageError
            Not fitted; ``path`` holds another file, or a model and not ``overwrite``.
        """
        if not hasattr(self, "model_"):
            raise UsageError("this KMeans is not fitted yet: call fit first")
        write_model(self.comm if self.comm is not None else SerialComm(), path, self.model_, overwrite)

    def _scaled(self, X) -> np.ndarray:
        if not hasattr(self, "scaled_centers_"):
            raise UsageError("this KMeans is not fitted yet: call fit first")
        return self.scaler_.transform(np.asarray(X, dtype=np.float64))

    def _assign(self, X):
        z = self._scaled(X)
        if not isinstance(self.backend, str):
            # the caller's backend holds the training rows: leave it alone
            from .backends.serial import SerialRows

            return SerialRows(z).assign(self.scaled_centers_)
        # the CPU backend's arithmetic is the GPU's exact path's: the same labels,
        # without starting a device for a prediction
        backend = make_backend("cpu", threads=self._threads(self.comm if self.comm is not None else SerialComm()))
        try:
            backend.load(z)
            return backend.assign(self.scaled_centers_)
        finally:
            backend.close()


def load(path: str, *, comm=None, backend="cpu", threads: int | None = None) -> KMeans:
    """A fitted :class:`KMeans` from a model file (``model.json`` of a run, or :meth:`KMeans.save`'s).

    Under a communicator rank 0 reads the file and every rank gets the model
    (collective).  ``predict``, ``transform``, ``score`` and ``quality`` work
    as after ``fit``; ``labels_`` is not there (a model holds no rows).  A
    model with nominal attributes takes rows in its one-hot columns
    (``model_.layout``).

    Parameters
    ----------
    path : str
    comm : Comm, SerialComm or None
    backend : {"cpu", "gpu", "auto"} or Backend
    threads : int, optional

    Returns
    -------
    KMeans

    Raises
    ------
    UsageError
        Not a model, or a model of another format version.
    InputError
        A damaged model.
    """
    model = (comm or SerialComm()).from_root(lambda: load_model(path))
    init = model.init if model.init in INIT_METHODS else "k-means++"
    km = KMeans(n_clusters=model.k, init=init, normalize=model.scaler.method, random_state=model.seed,
                backend=backend, comm=comm, threads=threads)
    km.scaler_ = model.scaler
    km.scaled_centers_ = model.centres_scaled
    km.cluster_centers_ = model.centres
    km.inertia_ = model.sse
    km.n_iter_ = int(model.info.get("iterations") or 0)
    km.converged_ = bool(model.info.get("converged", True))
    km.stop_reason_ = str(model.info.get("stop_reason", ""))
    sizes = model.info.get("sizes")
    km.sizes_ = None if sizes is None else np.array(sizes, dtype=np.int64)
    km.n_features_in_ = model.layout.columns
    km.n_samples_ = model.n
    km.seed_ = model.seed
    if not model.layout.has_nominal:
        km.feature_names_in_ = np.array(model.names, dtype=object)
    km.model_ = model
    return km


__all__ = ["KMeans", "load"]
