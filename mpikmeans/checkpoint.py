"""Checkpoints of the Lloyd loop: save atomically, load, check they fit the run.

A checkpoint holds the loop state (:class:`mpikmeans.lloyd.LoopState`: the
centres after the last completed iteration, the centres before it, the
iteration number, the history) and the settings that determine the result.
The centres are stored in binary (``.npz``), so a resumed run continues from
bit-identical values.  Only rank 0 writes: the state is the same on every rank.
"""

from __future__ import annotations

import io
import json
import logging
import time

import numpy as np

from . import __version__
from .errors import UsageError
from .lloyd import LoopState
from .io.output import write_atomic

log = logging.getLogger("mpikmeans")

#: Settings that must match between the checkpoint and the resumed run.
BINDING_KEYS = ("data_size", "n", "m", "k", "tol", "empty_cluster")


def save(path: str, state: LoopState, settings: dict) -> None:
    """Write ``state`` and ``settings`` to ``path`` atomically.

    Parameters
    ----------
    path : str
    state : LoopState
    settings : dict
        JSON-serialisable; must include :data:`BINDING_KEYS`.
    """
    buf = io.BytesIO()
    prev = state.prev_centres if state.prev_centres is not None else np.empty((0, state.centres.shape[1]))
    np.savez(buf, centres=state.centres, prev_centres=prev, iteration=np.int64(state.iteration),
             relocated=np.int64(state.relocated), dropped=np.int64(state.dropped),
             meta=np.frombuffer(json.dumps({"settings": settings, "history": state.history,
                                            "version": __version__, "written": time.time()}).encode(),
                                dtype=np.uint8))
    write_atomic(path, buf.getvalue())


def load(path: str) -> tuple[LoopState, dict]:
    """Read a checkpoint written by :func:`save`.

    Returns
    -------
    state : LoopState
    settings : dict

    Raises
    ------
    UsageError
        The file is missing or is not a checkpoint.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            prev = z["prev_centres"]
            state = LoopState(iteration=int(z["iteration"]), centres=np.array(z["centres"]),
                              prev_centres=np.array(prev) if prev.size else None,
                              history=meta["history"], relocated=int(z["relocated"]),
                              dropped=int(z["dropped"]) if "dropped" in z.files else 0)
    except OSError as exc:
        raise UsageError(f"--resume {path}: cannot read: {exc.strerror or exc}") from None
    except (KeyError, ValueError) as exc:
        raise UsageError(f"--resume {path}: not an mpikmeans checkpoint ({exc})") from None
    return state, meta["settings"]


def check_compatible(path: str, saved: dict, current: dict) -> None:
    """Refuse to resume a checkpoint into a run with other binding settings.

    Raises
    ------
    UsageError
        Naming the first setting that differs.
    """
    for key in BINDING_KEYS:
        if saved.get(key) != current.get(key):
            raise UsageError(f"--resume {path}: the checkpoint was made with {key} = {saved.get(key)!r}, "
                             f"this run has {current.get(key)!r}")


class Checkpointer:
    """Decides when to write checkpoints during the loop (rank 0 writes).

    Parameters
    ----------
    path : str
    settings : dict
    every : int or None
        Write every ``every`` iterations; None: at most every ``seconds``.
    seconds : float
    is_root : bool
        Only rank 0 writes.
    """

    def __init__(self, path: str, settings: dict, every: int | None = None, seconds: float = 60.0,
                 is_root: bool = True):
        self.path = path
        self.settings = settings
        self.every = every
        self.seconds = seconds
        self.is_root = is_root
        self.last = time.monotonic()
        self.written = 0
        self.error = None

    def __call__(self, state: LoopState, force: bool) -> None:
        due = force or (state.iteration % self.every == 0 if self.every else
                        time.monotonic() - self.last >= self.seconds)
        if not (due and self.is_root):
            return
        try:
            save(self.path, state, self.settings)
            self.written += 1
        except Exception as exc:  # noqa: BLE001 - a failed checkpoint must not kill the run
            self.error = str(exc)
            if force:
                raise
            log.warning("checkpoint not written: %s", exc)
        self.last = time.monotonic()
