"""Checkpoints of the Lloyd loop: save atomically, load, check they fit the run.

A checkpoint holds the loop state (:class:`mpikmeans.lloyd.LoopState`: the
centres after the last completed iteration, the centres before it, the
iteration number, the history) and every setting that changes the answer
(:data:`BINDING`): the data's identity, its shape, k, the initialisation and
its seed, the scaling, the policies for nominal, missing and empty...  A run
resumed under other settings is refused, naming the first difference, so a
resumed run always gives the answer of the uninterrupted one.  The centres are
stored in binary (``.npz``), so a resumed run continues from bit-identical
values.  Only rank 0 writes: the state is the same on every rank.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import threading
import time
import zipfile
from dataclasses import dataclass

import numpy as np

from . import __version__
from .errors import UsageError
from .lloyd import LoopState
from .io import open_regular
from .io.output import write_atomic

log = logging.getLogger("mpikmeans")

#: Settings that must match between the checkpoint and the resumed run, in the
#: order they are compared, with how a message names each.  ``max_iter`` is not
#: one: it does not change the path of the iterations, only where they end.
BINDING = (
    ("data_identity", "the data file"),
    ("k", "-k"),
    ("init", "--init"),
    ("init_sha256", "--init (the file's content)"),
    ("seed", "--seed"),
    ("n_init", "--n-init"),
    ("normalize", "--normalize"),
    ("nominal", "--nominal"),
    ("missing", "--missing"),
    ("tol", "--tol"),
    ("empty_cluster", "--empty-cluster"),
    ("attributes", "the attributes clustered (--ignore, --nominal)"),
    ("n", "rows"),
    ("m", "columns"),
    ("dtype", "--dtype"),
)

#: The binding keys alone (the settings known before the data is read come first).
BINDING_KEYS = tuple(key for key, _ in BINDING)

#: Bytes of each end of the data file that its identity hashes.
_IDENTITY_BYTES = 1 << 20


def data_identity(path: str) -> dict:
    """What identifies the data file a checkpoint was made from, wherever it is moved.

    Its size and a SHA-256 of its first and last MiB (the header, the shape of a
    ``.npy``, and both ends of the rows): cheap on a file of any size.

    Returns
    -------
    dict
        ``{"size": int, "sha256": str}``.
    """
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(f.read(_IDENTITY_BYTES))
        if size > _IDENTITY_BYTES:
            f.seek(max(_IDENTITY_BYTES, size - _IDENTITY_BYTES))
            h.update(f.read(_IDENTITY_BYTES))
    return {"size": int(size), "sha256": h.hexdigest()}


def file_sha256(path: str) -> str:
    """SHA-256 of a (small) file's whole content, e.g. an ``--init`` file of centres."""
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Checkpoint:
    """A checkpoint as read back.

    Attributes
    ----------
    state : LoopState
    settings : dict
        The binding settings (:data:`BINDING`) and a few for messages (``data``).
    finished : dict or None
        For the state of a loop that had ended (saved while its results were
        being written): ``converged`` and ``stop_reason``.
    version : str
        The mpikmeans that wrote it.
    """

    state: LoopState
    settings: dict
    finished: dict | None = None
    version: str = ""


def save(path: str, state: LoopState, settings: dict, finished: dict | None = None) -> None:
    """Write ``state`` and ``settings`` to ``path`` atomically.

    Parameters
    ----------
    path : str
    state : LoopState
    settings : dict
        JSON-serialisable; holds :data:`BINDING_KEYS`.
    finished : dict, optional
        ``{"converged": bool, "stop_reason": str}`` when the loop had ended.
    """
    buf = io.BytesIO()
    prev = state.prev_centres if state.prev_centres is not None else np.empty((0, state.centres.shape[1]))
    meta = {"settings": settings, "history": state.history, "version": __version__, "written": time.time(),
            "finished": finished}
    np.savez(buf, centres=state.centres, prev_centres=prev, iteration=np.int64(state.iteration),
             relocated=np.int64(state.relocated), dropped=np.int64(state.dropped),
             meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    write_atomic(path, buf.getvalue())


def is_checkpoint(path: str) -> bool:
    """Whether ``path`` is a checkpoint :func:`load` reads (no error for any other file)."""
    try:
        load(path)
    except UsageError:
        return False
    return True


def load(path: str) -> Checkpoint:
    """Read a checkpoint written by :func:`save`.

    Returns
    -------
    Checkpoint

    Raises
    ------
    UsageError
        The file is missing, unreadable, truncated, or not a checkpoint.
    """
    not_one = UsageError(f"--resume {path}: not an mpikmeans checkpoint (a truncated file, or another kind of "
                         "file): give the file a run wrote with --checkpoint, or start afresh without --resume")
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile) or "meta" not in z.files:
                raise not_one
            meta = json.loads(bytes(z["meta"]).decode())
            prev = z["prev_centres"]
            centres = np.array(z["centres"], dtype=np.float64)
            if centres.ndim != 2 or prev.ndim != 2:
                raise not_one
            state = LoopState(iteration=int(z["iteration"]), centres=centres,
                              prev_centres=np.array(prev, dtype=np.float64) if prev.size else None,
                              history=list(meta["history"]), relocated=int(z["relocated"]),
                              dropped=int(z["dropped"]) if "dropped" in z.files else 0)
            settings = meta["settings"]
            if not isinstance(settings, dict):
                raise not_one
    except UsageError:
        raise
    except IsADirectoryError:
        raise UsageError(f"--resume {path}: is a directory, not a checkpoint file") from None
    except OSError as exc:
        raise UsageError(f"--resume {path}: cannot read: {exc.strerror or exc}") from None
    except (zipfile.BadZipFile, EOFError, KeyError, ValueError, TypeError, UnicodeDecodeError):
        # numpy's own message (a pickle hint for a file that is not one) would mislead here
        raise not_one from None
    return Checkpoint(state, settings, meta.get("finished"), str(meta.get("version", "")))


def _shown(key: str, value, settings: dict) -> str:
    """A setting as a message names it: ``--normalize zscore``, ``60000 rows``, ``the attributes a, b``."""
    label = dict(BINDING)[key]
    if key in ("n", "m"):
        return f"{value} {label}"
    if key == "attributes" and isinstance(value, list):
        shown = ", ".join(map(str, value[:8])) + (", ..." if len(value) > 8 else "")
        return f"the attributes {shown}"
    if key == "init_sha256":
        return f"--init a file of SHA-256 {str(value)[:12]}..." if value else "--init not a file"
    return f"{label} {_value(key, value, settings)}"


def _value(key: str, value, settings: dict) -> str:
    if value is None:
        return "(not recorded)"
    if key == "data_identity":
        where = settings.get("data")
        size = value.get("size") if isinstance(value, dict) else None
        return f"{where or 'a file'} ({size} bytes)" if size is not None else str(where or "a file")
    return str(value)


def check_compatible(path: str, saved: dict, current: dict, keys=BINDING_KEYS) -> None:
    """Refuse to resume a checkpoint into a run with other binding settings.

    Parameters
    ----------
    path : str
    saved, current : dict
        The checkpoint's settings and this run's.
    keys : sequence of str
        The keys to compare (those of :data:`BINDING` this run knows yet);
        ``current`` lacking one of them skips it.

    Raises
    ------
    UsageError
        Naming the first setting that differs.
    """
    names = dict(BINDING)
    for key in BINDING_KEYS:  # in this order whatever the order of ``keys``: the first difference is named
        if key not in keys or key not in current:
            continue
        if saved.get(key) != current.get(key):
            if key not in saved:
                raise UsageError(f"--resume {path}: the checkpoint does not record {names[key]} (written by another "
                                 "version of mpikmeans): start afresh without --resume")
            if key == "data_identity":
                raise UsageError(f"--resume {path}: the checkpoint was made from another data file: "
                                 f"{_value(key, saved[key], saved)}; this run reads "
                                 f"{_value(key, current[key], current)}")
            raise UsageError(f"--resume {path}: the checkpoint was made with {_shown(key, saved[key], saved)}; "
                             f"this run has {_shown(key, current[key], current)} (resume with the settings that "
                             "made it, or start afresh without --resume)")


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
    enabled : bool
        False: never write (a run whose state cannot be resumed, such as one
        of several restarts).

    Attributes
    ----------
    written : int
        Checkpoints written so far.
    error : str or None
        Why the last write failed.
    """

    def __init__(self, path: str, settings: dict, every: int | None = None, seconds: float = 60.0,
                 is_root: bool = True, enabled: bool = True):
        self.path = path
        self.settings = settings
        self.every = every
        self.seconds = seconds
        self.is_root = is_root
        self.enabled = enabled
        self.last = time.monotonic()
        self.written = 0
        self.error = None
        self._lock = threading.Lock()
        self._latest = None          # (state, finished) of the last completed iteration
        self._saved_iteration = -1   # the iteration the file holds, from this run

    def __call__(self, state: LoopState, force: bool) -> None:
        self._latest = (state, None)
        due = force or (state.iteration % self.every == 0 if self.every else
                        time.monotonic() - self.last >= self.seconds)
        if not (due and self.is_root and self.enabled):
            return
        try:
            self._save(state, None)
        except Exception as exc:  # noqa: BLE001 - a failed checkpoint must not kill the run
            self.error = str(exc)
            if force:
                raise
            log.warning("checkpoint not written: %s", exc)
        self.last = time.monotonic()

    def finished(self, state: LoopState, converged: bool, stop_reason: str) -> None:
        """The loop has ended with ``state``: what :meth:`save_now` saves while the results are written."""
        self._latest = (state, {"converged": bool(converged), "stop_reason": stop_reason})

    def save_now(self, signum: int | None = None) -> bool:  # noqa: ARG002 - called with the signal's number
        """Save the last completed iteration at once (a signal arrived; a SIGKILL may follow).

        Safe to call from another thread while the loop runs: the state objects
        are never changed once made.  Returns whether a checkpoint was written.
        """
        latest = self._latest
        if latest is None or not (self.is_root and self.enabled):
            return False
        try:
            return self._save(*latest)
        except Exception as exc:  # noqa: BLE001 - reported; the main thread goes on
            self.error = str(exc)
            log.warning("checkpoint not written: %s", exc)
            return False

    def _save(self, state: LoopState, finished: dict | None) -> bool:
        with self._lock:
            if state.iteration < self._saved_iteration or (state.iteration == self._saved_iteration
                                                           and finished is None):
                return False  # the file holds this state or a later one already
            parent = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(parent, exist_ok=True)
            save(self.path, state, self.settings, finished)
            self._saved_iteration = state.iteration
            self.written += 1
            log.debug("checkpoint of iteration %d written to %s", state.iteration, self.path)
            return True
