"""``mpikmeans predict MODEL DATA``: a saved model applied to new rows, on every rank (collective).

DATA is read in parallel exactly as ``run`` reads it (:func:`mpikmeans.io.formats.read_local`:
each rank its own byte range), after its attributes are checked against the
model's (:func:`mpikmeans.model.match_header`: the first mismatch ends the job
with one line, exit 3).  The rows are scaled with the model's scaling (its
offsets and scales, not the new data's), nominal attributes laid out in the
model's one-hot columns, and every row is assigned to its nearest centre by
the backend, with the arithmetic of a run's last assignment: the model of a
run applied to that run's data gives the run's labels, to the row.  Missing
values follow the model's policy; with ``mean`` a ``?`` gets the model's
recorded training mean (``missing.fill``), as a fitted imputer does, never
the new rows' own mean; a model that records none refuses data with a ``?``.

Results, in the output directory (:class:`PredictionDir`, published whole):
``labels.txt`` (one 0-based cluster per input row, -1 for a row dropped for a
missing value), ``distances.txt`` (``--distances``: each row's Euclidean
distance to its centre, shortest round-trip text) or ``transform.npy``
(``--transform``: its distance to every centre, float64 rows x K, as
scikit-learn's ``transform``), ``clustered.arff`` (``--write-arff``) and
``summary.json`` last: rows, the SSE of the new rows (exact, the same bits at
any rank count), cluster sizes, timings.  Distances are in the units the model
clustered in (scaled where it was).
"""

from __future__ import annotations

import io
import logging
import os
import time
from dataclasses import dataclass, replace

import numpy as np

from . import __version__
from .backends import BackendUnavailable, make_backend
from .errors import InputError, MpikmeansError, RunError, UsageError
from .fixedsums import Scales, cluster_sizes_and_sums, column_magnitudes, decode
from .io.formats import ReadOptions, detect, read_header, read_local, results_dir, shape
from .io.output import (CLUSTERED, LABELS, RESULT_FILES, SUMMARY, ResultsDir, remove_quietly, write_parallel,
                        write_summary)
from .io.textfmt import format_fixed
from .io.wekaout import write_clustered_arff
from .model import HeaderMatch, Model, load_model, match_header, match_names
from .startup import DevicePreparation, gpu_possible, prepare_read, rank_threads, start_driver
from .scores import all_dist2

log = logging.getLogger("mpikmeans")

#: ``--distances``: each row's distance to its centre, one a line
DISTANCES = "distances.txt"
#: ``--transform``: each row's distance to every centre, a float64 ``.npy`` of rows x K
TRANSFORM = "transform.npy"
#: What predict writes beyond the files a run writes (:data:`mpikmeans.io.output.RESULT_FILES`)
EXTRA_FILES = (DISTANCES, TRANSFORM)


#: multiply-adds a second that one CPU thread's assignment sustains at least (its certified screen and
#: exact recheck, on x86 cores with FMA): the cost model's CPU rate
CPU_MADDS_PER_THREAD = 7.0e9
#: bytes a second a rank's rows move from host memory to its GPU (pageable memory): the model's copy rate
GPU_COPY_BYTES = 16.0e9
#: seconds of a GPU's start the read does not hide (the device's context, the backend's set-up)
GPU_START_S = 0.25


def assignment_backend(requested: str, gpu_here: bool, rank_rows: int, k: int, columns: int, itemsize: int,
                       threads: int) -> str:
    """The backend of one prediction: one assignment of every row, so a GPU pays only where the arithmetic
    outweighs moving the rows there.

    ==================================================  =========  ==================================
    case                                                backend    why
    ==================================================  =========  ==================================
    ``--backend cpu`` or ``gpu``                        as asked
    ``auto``, no GPU on the node                        ``cpu``
    ``auto``, CPU estimate <= GPU estimate              ``cpu``    the copy to the device costs more
                                                                   than the CPU's whole assignment
    ``auto``, otherwise                                 ``gpu``
    ==================================================  =========  ==================================

    The estimates, per rank: the CPU's ``rows K M / (threads CPU_MADDS_PER_THREAD)``;
    the GPU's ``rows M itemsize / GPU_COPY_BYTES + GPU_START_S`` (its arithmetic is
    small beside the copy).  Both backends give the same labels to the bit, so the
    choice changes only the time.  A run (many passes over rows that stay on the
    device) does not ask this.

    Parameters
    ----------
    requested : {"auto", "cpu", "gpu"}
    gpu_here : bool
        The node has NVIDIA devices (:func:`mpikmeans.startup.gpu_possible`).
    rank_rows : int
        Rows of the largest rank's share (estimated for a text file).
    k, columns : int
        The model's centres and columns.
    itemsize : int
        Bytes of a value on the device (8 float64, 4 float32).
    threads : int
        CPU threads of a rank.

    Returns
    -------
    str
        ``"cpu"`` or ``"gpu"`` (``requested`` where it is not ``auto``).
    """
    if requested != "auto":
        return requested
    if not gpu_here:
        return "cpu"
    cpu_s = rank_rows * k * columns / (max(1, threads) * CPU_MADDS_PER_THREAD)
    gpu_s = rank_rows * columns * itemsize / GPU_COPY_BYTES + GPU_START_S
    return "cpu" if cpu_s <= gpu_s else "gpu"


@dataclass(frozen=True)
class PredictConfig:
    """Settings of one ``mpikmeans predict``.

    Attributes
    ----------
    output_dir : str or None
        Default: :func:`default_prediction_dir`.
    distances, transform : bool
        Also write ``distances.txt`` / ``transform.npy`` (one of the two).
    write_arff : bool
        Also write ``clustered.arff`` (a text input only).
    backend : {"auto", "cpu", "gpu"}
    dtype : {"float64", "float32"} or None
        Precision of the rows on a GPU; None: the model's.
    threads : int or None
        CPU threads per rank (reading, the CPU backend); default as ``run``.
    share_gpus : bool
    chunk_rows : int or None
    ignore : str or None
        The data's attributes to leave out beyond those the model left out.
    overwrite : bool
        Replace the results already in the output directory.
    """

    output_dir: str | None = None
    distances: bool = False
    transform: bool = False
    write_arff: bool = False
    backend: str = "auto"
    dtype: str | None = None
    threads: int | None = None
    share_gpus: bool = False
    chunk_rows: int | None = None
    ignore: str | None = None
    overwrite: bool = False


@dataclass
class PredictOutcome:
    """What the CLI reports: the content of summary.json and where the results are."""

    summary: dict
    out_dir: str


def default_prediction_dir(data: str) -> str:
    """Where a prediction goes by default: as a run's results (:func:`mpikmeans.io.formats.results_dir`),
    with ``.predict`` for ``.mpikmeans`` (``new.arff`` -> ``new.predict``, ``new.csv`` -> ``new.csv.predict``)."""
    return results_dir(data)[: -len(".mpikmeans")] + ".predict"


class PredictionDir(ResultsDir):
    """A results directory (:class:`~mpikmeans.io.output.ResultsDir`) that also moves predict's own files.

    ``distances.txt`` and ``transform.npy`` are moved in before ``summary.json``;
    one left by an earlier prediction that this one does not write is removed
    (it came with the results ``--overwrite`` replaces).  A directory that holds
    one of them without results is refused before any work
    (:func:`check_paths`): it is not a file predict wrote.
    """

    @staticmethod
    def _move_files(staging: str, target: str) -> None:
        for name in EXTRA_FILES:
            if os.path.exists(os.path.join(staging, name)):
                os.replace(os.path.join(staging, name), os.path.join(target, name))
            else:
                remove_quietly(os.path.join(target, name))
        ResultsDir._move_files(staging, target)


def _inside(path: str, directory: str) -> bool:
    a, d = os.path.realpath(path), os.path.realpath(directory)
    return a == d or a.startswith(d.rstrip(os.sep) + os.sep)


def check_paths(model_path: str, data: str, out_dir: str) -> None:
    """Refuse an output directory that holds the model or the data, or a file of predict's not from results (rank 0).

    Raises
    ------
    UsageError
    """
    for what, path in (("the model", model_path), ("the data", data)):
        if os.path.exists(path) and _inside(path, out_dir):
            raise UsageError(f"{out_dir}: the output directory holds {what} ({path}), which predict never writes "
                             "over: choose another --output-dir")
    if os.path.isdir(out_dir) and not any(os.path.exists(os.path.join(out_dir, f)) for f in RESULT_FILES):
        there = [f for f in EXTRA_FILES if os.path.exists(os.path.join(out_dir, f))]
        if there:
            raise UsageError(f"{out_dir}: holds {', '.join(there)} without the results it belongs to: move it, or "
                             "choose another --output-dir")


def _text_header(data: str):
    """The data's header (ARFF or CSV), None for a ``.npy`` copy (rank 0)."""
    return None if detect(data).header is None else read_header(data)


def _npy_header(shape: tuple) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _with_dropped(values: np.ndarray, kept: np.ndarray | None, fill) -> np.ndarray:
    """``values`` of the rows kept, spread over every row read (``fill`` for a dropped one)."""
    if kept is None:
        return values
    out = np.full((len(kept),) + values.shape[1:], fill, dtype=values.dtype)
    out[kept] = values
    return out


def _data_fill(model: Model, match: HeaderMatch) -> np.ndarray | None:
    """The model's fill values in the data's columns (a nominal block's categories in the data's order), or
    None where the model records none.

    Where the data's header lacks the category a nominal attribute's ``?`` is
    filled with, its block here is all 0: :func:`_fill_absent_modes` sets it
    once the rows are in the model's columns.
    """
    fill = model.missing["fill"]
    if fill is None:
        return None
    fill = np.array(fill, dtype=np.float64)
    return fill if match.columns is None else fill[match.columns]


def _fill_absent_modes(model: Model, match: HeaderMatch, x: np.ndarray) -> None:
    """Give the rows whose nominal block is all 0 (a ``?`` filled with a category the data's header lacks, see
    :func:`_data_fill`) the model's fill for that block, in place; ``x`` of shape (rows, model columns)."""
    if match.columns is None:
        return  # the data's columns are the model's: every category a '?' gets is the data's, filled by the reader
    fill = np.array(model.missing["fill"], dtype=np.float64)
    for _, s, v in model.layout.blocks():
        block = slice(s, s + len(v))
        if np.isin(np.flatnonzero(fill[block]) + s, match.columns).all():
            continue  # the category is the data's: the reader filled it
        x[(x[:, block] == 0.0).all(axis=1), block] = fill[block]


def _backend(comm, cfg: PredictConfig, model: Model, threads: int, device: int | None, reason: str):
    dtype = cfg.dtype or model.dtype
    options = {"threads": threads, "dtype": dtype, "chunk_rows": cfg.chunk_rows, "node_ranks": comm.node_size}
    if device is None:
        if cfg.backend == "auto" and reason:
            log.warning("--backend auto: the GPU cannot be used (%s); running on the CPU", reason)
        return make_backend("cpu" if cfg.backend == "auto" else cfg.backend, **options)
    return make_backend(cfg.backend, device=device, **options)


def predict_job(comm, model_path: str, data: str, cfg: PredictConfig,
                launched_at: float | None = None) -> PredictOutcome:
    """Apply the model in ``model_path`` to the rows of ``data`` and write the results (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    model_path : str
        A ``model.json`` (:mod:`mpikmeans.model`).
    data : str
        An ARFF or CSV file, or a ``.npy`` copy made by ``convert``.
    cfg : PredictConfig
    launched_at : float, optional
        ``time.perf_counter()`` when the command's process started (``timings.launch_s``).

    Returns
    -------
    PredictOutcome

    Raises
    ------
    UsageError
        Bad options, a file that is not a model (exit 2).
    InputError
        A damaged model, data whose attributes do not match the model's, a bad row (exit 3).
    RunError
        The backend or the writing failed (exit 1).
    """
    t0 = time.perf_counter()
    if cfg.distances and cfg.transform:
        raise UsageError("--distances and --transform: choose one (transform.npy holds the distances to every "
                         "centre, the nearest among them)", collective=True)
    out_dir = cfg.output_dir or default_prediction_dir(data)

    def checked_model() -> Model:
        check_paths(model_path, data, out_dir)
        return load_model(model_path)

    model = comm.from_root(checked_model)
    own = [os.path.join(out_dir, f) for f in EXTRA_FILES]
    results = PredictionDir(comm, out_dir, cfg.overwrite, own=own, data=data)
    try:
        return _predict(comm, model, model_path, data, cfg, results, launched_at, t0)
    except BaseException:
        results.discard()
        raise


def _predict(comm, model: Model, model_path: str, data: str, cfg: PredictConfig, results, launched_at, t0: float):
    threads = rank_threads(comm, cfg.threads)
    if cfg.backend == "auto" and gpu_possible():
        rank_rows = comm.from_root(lambda: shape(data, comm.size).rank_rows)
        itemsize = np.dtype(cfg.dtype or model.dtype).itemsize
        cfg = replace(cfg, backend=assignment_backend("auto", True, rank_rows, model.k, model.layout.columns,
                                                      itemsize, threads))
        if cfg.backend == "cpu":
            log.info("--backend auto: the CPU assigns these rows sooner than they would move to the GPU")
    start_driver(comm, cfg)  # the CUDA driver's part of a GPU's start, beside everything below
    prepare_read(comm, data, threads)
    t_ready = time.perf_counter()
    header = comm.from_root(lambda: _text_header(data))
    match = HeaderMatch(None)
    if header is not None:
        match = comm.from_root(lambda: match_header(model, header, data, model_path, cfg.ignore))
    elif cfg.ignore or cfg.write_arff or model.missing["policy"] != "error":
        # a .npy copy holds no '?': one made with --missing drop or mean lost them (rows dropped, or
        # filled with its own means rather than the model's)
        raise UsageError("--ignore, --write-arff and a model made with --missing drop or mean need the ARFF or CSV "
                         "file, not a .npy copy", collective=True)
    policy = model.missing["policy"]
    fill = _data_fill(model, match) if policy == "mean" else None
    # a model without fill values reads the rows with 0 in place of a '?', to count them: any is refused below
    placeholder = policy == "mean" and fill is None
    if placeholder:
        fill = np.zeros(match.columns.size if match.columns is not None else model.layout.columns)
    gpu_start = DevicePreparation(comm, cfg)  # the GPU's start overlaps the read
    local = read_local(comm, data, ReadOptions(ignore=match.ignore, missing=policy, nominal=model.nominal,
                                               threads=threads, write_arff=cfg.write_arff, fill=fill))
    if header is None:
        comm.from_root(lambda: match_names(model, list(local.names), data, model_path))
    if placeholder and local.missing:
        raise InputError(f"{data}: {local.missing} missing value{'s' if local.missing != 1 else ''} ('?'), and the "
                         f"model {model_path} (--missing mean) records no training means to fill them with "
                         f"(missing.fill is null: written by mpikmeans {model.info.get('tool_version', '?')}): fit "
                         "the model again with this mpikmeans, or give data without '?'", collective=True)
    t_read = time.perf_counter()

    layout = model.layout
    x = local.x
    if match.columns is not None:  # a nominal attribute's categories in the model's columns
        placed = np.zeros((len(x), layout.columns))
        placed[:, match.columns] = x
        x = placed
        if policy == "mean" and local.missing:
            _fill_absent_modes(model, match, x)
    # the model's scaling, in place: the new rows' own statistics play no part
    z = model.scaler.transform(x, out=x)
    centres = np.ascontiguousarray(model.centres_scaled)
    weights = local.weights
    if match.columns is None and not local.missing:
        # the reader's global extremes, scaled as the rows were (each scaling is monotonic): no pass over the rows
        mags = np.abs(model.scaler.transform(np.vstack([local.mins, local.maxs]))).max(axis=0)
    else:  # nominal columns placed, or filled values the extremes do not bound
        mags = column_magnitudes(z)
    bounds = np.append(mags, weights.max() if weights is not None and len(weights) else 0.0)
    bounds = comm.allreduce(bounds, "max")
    mags = bounds[:-1]
    weighted = bool(comm.allreduce(np.array([weights is not None], dtype=np.int64), "max")[0])
    backend, error = None, None
    try:
        backend = _backend(comm, cfg, model, threads, gpu_start.result(), gpu_start.reason)
        backend.load(z, weights, magnitudes=mags)
    except (BackendUnavailable, MpikmeansError) as exc:
        error = RunError(str(exc))
    except MemoryError:
        error = RunError(f"rank {comm.rank}: not enough device or host memory for {len(z)} rows")
    comm.agree(error)
    t_setup = time.perf_counter()
    try:
        labels, dist2 = backend.assign(centres)
        table = all_dist2(z, centres) if cfg.transform else None
    finally:
        info = backend.info()
        backend.close()
    k = model.k
    exponent = Scales.of(mags, float(bounds[-1]) if weighted else 1.0).sse_exponent(centres)
    tail = comm.allreduce(cluster_sizes_and_sums(labels, dist2, weights, k, exponent), "sum")
    sizes = [int(s) for s in tail[:k]]
    limbs = tail[k:].reshape(k, 4)
    t_assign = time.perf_counter()

    staging = results.stage()
    rows_labels = _with_dropped(labels.astype(np.int64), local.kept, -1)
    write_parallel(comm, os.path.join(staging, LABELS), b"", [format_fixed(rows_labels, 0)], threads)
    written = [LABELS]
    if cfg.distances:
        dist = _with_dropped(np.sqrt(dist2), local.kept, np.nan)
        text = ("\n".join(map(repr, dist.tolist())) + "\n").encode() if len(dist) else b""
        write_parallel(comm, os.path.join(staging, DISTANCES), b"", [text], threads)
        written.append(DISTANCES)
    if cfg.transform:
        table = _with_dropped(np.sqrt(table), local.kept, np.nan)
        rows_read = int(comm.allreduce(np.array([len(table)], dtype=np.int64), "sum")[0])
        write_parallel(comm, os.path.join(staging, TRANSFORM), _npy_header((rows_read, k)), [table], threads)
        written.append(TRANSFORM)
    if cfg.write_arff:
        write_clustered_arff(comm, local, rows_labels, k, os.path.join(staging, CLUSTERED))
        written.append(CLUSTERED)
    t_written = time.perf_counter()
    summary = {
        "command": "predict",
        "version": __version__,
        "model": os.path.abspath(model_path),
        "data": os.path.abspath(data),
        "k": k,
        "n": local.n,
        "input_rows": local.input_rows,
        "m": len(layout.names),
        "columns": layout.columns,
        "attributes": layout.names,
        "missing": {"policy": model.missing["policy"], "count": local.missing},
        "weighted": weighted,
        "inertia": float(decode(limbs.sum(axis=0), exponent)),
        "inertia_units": "data" if model.scaler.method == "none" else f"scaled ({model.scaler.method})",
        "cluster_sse": [float(v) for v in decode(limbs, exponent)],
        "sizes": sizes,
        "model_inertia": model.sse,
        "model_n": model.n,
        "ranks": comm.size,
        "backend": info.name,
        "devices": [d for per_rank in comm.allgather(info.devices) for d in per_rank],
        "threads_per_rank": info.threads,
        "dtype": info.dtype,
        "bytes_read": int(comm.allreduce(np.array([local.bytes_read], dtype=np.int64), "sum")[0]),
        "files": written + [SUMMARY],
        "timings": {
            **({"launch_s": t0 - launched_at} if launched_at is not None else {}),
            "startup_s": t_ready - t0,
            "read_s": t_read - t_ready,
            "setup_s": t_setup - t_read,
            "assign_s": t_assign - t_setup,
            "write_s": t_written - t_assign,
            "total_s": t_written - t0,
        },
    }
    write_summary(comm, staging, summary)
    results.publish()
    return PredictOutcome(summary, results.path)


__all__ = ["DISTANCES", "EXTRA_FILES", "TRANSFORM", "PredictConfig", "PredictOutcome", "PredictionDir",
           "assignment_backend", "check_paths", "default_prediction_dir", "predict_job"]
