"""What a run starts from: an initialisation method, or the centres of ``--init FILE`` (collective).

``FILE`` is a CSV file of centres (``centers.csv`` as a run writes it: a
header line of names matches its columns to the attributes by name, never by
position) or a model (``model.json``, :mod:`mpikmeans.model`): its centres,
matched to the run's attributes by name, order and type, and a nominal
attribute's categories by name.  Either is in data units; the run's own
scaling is applied to it.
"""

from __future__ import annotations

import logging

import numpy as np

from .choices import INIT_METHODS
from .errors import MpikmeansError, UsageError
from .init import check_centres
from .io.output import order_by_header, read_centres_csv, read_centres_fields
from .model import load_model, looks_like_model

log = logging.getLogger("mpikmeans")


def model_k(comm, path: str) -> int:
    """The K of the model ``path`` (collective: rank 0 reads it), for a run given ``--init model.json`` alone.

    Raises
    ------
    UsageError
        Not a model, or a model of another format version (:func:`mpikmeans.model.load_model`).
    InputError
        A damaged model.
    """
    return comm.from_root(lambda: load_model(path).k)


def initial_centres(comm, cfg, local, scaler, data: str):
    """What :func:`mpikmeans.restarts.run_restarts` starts from (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    cfg : RunConfig
        ``k`` (one K) and ``init``.
    local : mpikmeans.io.arff.LocalData
        The run's rows: their count, attribute names and layout.
    scaler : mpikmeans.scaling.Scaler
        The run's scaling, applied to the file's centres.
    data : str
        The data file, for messages.

    Returns
    -------
    str or ndarray, shape (k, local.m), float64
        The method's name, or the file's centres in the run's scaled units.

    Raises
    ------
    UsageError
        K above the rows; a CSV file that cannot be read or is of the wrong
        shape; a file that is not a model (or of another format version).
    InputError
        A model whose attributes do not match the data's (the first mismatch,
        naming both files and the attribute), or a damaged model.
    """
    k, m = cfg.k, local.m
    if k > local.n:
        raise UsageError(f"-k {k} is more than the {local.n} rows of {local.path}", collective=True)
    if cfg.init in INIT_METHODS:
        return cfg.init
    layout = local.layout

    def read_model():
        model = load_model(cfg.init)
        if model.k != k:
            raise UsageError(f"--init {cfg.init}: the model has {model.k} centres, and -k is {k}")
        if model.scaler.method != cfg.normalize:
            log.warning("--init %s: the model was fitted with --normalize %s, this run scales with %s (its centres "
                        "are taken in data units)", cfg.init, model.scaler.method, cfg.normalize)
        return model.centres_for(layout, cfg.init, data)

    def read_csv():
        # a header line's names say which column is which attribute: matched by name, never by position
        try:
            if layout.has_nominal:
                rows, header = read_centres_fields(cfg.init, local.names)
                fields = [values for _, values in rows]
                if header is not None:
                    _check_widths(header, {len(v) for v in fields})
                    order = order_by_header(header, local.names, cfg.init)
                    fields = [[values[j] for j in order] for values in fields]
                centres = layout.encode(fields)
            else:
                centres, header = read_centres_csv(cfg.init, local.names)
                if header is not None:
                    _check_widths(header, {centres.shape[1]})
                    centres = centres[:, order_by_header(header, local.names, cfg.init)]
            return check_centres(centres, k, m, cfg.init)
        except (ValueError, OSError) as exc:
            raise UsageError(f"--init {cfg.init}: {exc}") from None
        except MpikmeansError as exc:  # wrong shape: a usage error of this run
            raise UsageError(exc.message) from None

    centres = comm.from_root(lambda: read_model() if looks_like_model(cfg.init) else read_csv())
    return scaler.transform(np.asarray(centres, dtype=np.float64))  # the file is in data units


def _check_widths(header: list, widths: set) -> None:
    if widths and widths != {len(header)}:
        raise ValueError(f"its header line names {len(header)} columns, its rows have "
                         f"{', '.join(str(w) for w in sorted(widths))}")


__all__ = ["initial_centres", "model_k"]
