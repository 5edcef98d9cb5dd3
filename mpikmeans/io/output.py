"""Results on disk: centres, labels in input order, summary JSON; atomic writes.

Every file appears whole or not at all: it is written under a temporary name
in the same directory and renamed into place, which is atomic on POSIX file
systems.  Files written by all ranks together (labels, generated data) are
assembled with positional writes at offsets from an exchange of byte counts,
then renamed by rank 0 once every rank has finished.  A results directory
appears whole too, and never mixes two runs (:class:`ResultsDir`): a run's
files are written into a new directory beside it, which then takes its place.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
from typing import Iterable

import numpy as np

from ..errors import RunError, UsageError
from .textfmt import format_fixed

CENTERS = "centers.csv"
LABELS = "labels.txt"
SUMMARY = "summary.json"
CLUSTERED = "clustered.arff"
#: The fitted model (:mod:`mpikmeans.model`, docs/model.md).
MODEL = "model.json"
#: A K sweep's table and plot, beside its ``k<K>/`` directories (:mod:`mpikmeans.sweep`).
SWEEP_TABLE = "sweep.csv"
SWEEP_PLOT = "sweep.png"
#: Every file a run may write into its results directory (``summary.json`` last).
RESULT_FILES = (CENTERS, LABELS, CLUSTERED, MODEL, SWEEP_TABLE, SWEEP_PLOT, SUMMARY)
#: The checkpoint a stopped run leaves in its output directory when not told where (``--checkpoint``).
DEFAULT_CHECKPOINT = "checkpoint.npz"


def _tmp_name(path: str) -> str:
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{tail}.tmp-{os.getpid()}")


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one.

    Raises
    ------
    RunError
        The directory is not writable, the disk is full...
    """
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        remove_quietly(tmp)
        raise RunError(f"{path}: cannot write: {exc.strerror}") from None


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def pwrite_all(fd: int, data, offset: int) -> None:
    """Write all of ``data`` (bytes-like) at ``offset``: ``pwrite`` may write less than asked."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def publish(comm, tmp: str, path: str) -> None:
    """Rank 0 renames the finished ``tmp`` to ``path``; every rank learns if that failed (collective).

    Raises
    ------
    RunError
        On every rank, if the rename failed (``tmp`` is removed then).
    """
    error = None
    if comm.rank == 0:
        try:
            os.replace(tmp, path)
        except OSError as exc:
            remove_quietly(tmp)
            error = RunError(f"{path}: cannot write: {exc.strerror}")
    comm.agree(error)


def write_parallel(comm, path: str, head: bytes, pieces: Iterable, threads: int = 1) -> int:
    """Write one file from every rank's bytes, in rank order (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    path : str
        The final name; it appears only when every rank's bytes are in.
    head : bytes
        Written first, by rank 0 only (a header); ignored on other ranks.
    pieces : iterable of bytes-like
        This rank's bytes, in order.
    threads : int
        Threads writing this rank's bytes (in slices of at least 64 MiB at their
        offsets: a single ``pwrite`` stream does not reach a fast disk's or tmpfs'
        speed).

    Returns
    -------
    int
        Total size of the file in bytes.

    Raises
    ------
    RunError
        On every rank, if any rank failed to write.
    """
    pieces = [memoryview(np.ascontiguousarray(p) if isinstance(p, np.ndarray) else p).cast("B") for p in pieces]
    mine = sum(len(p) for p in pieces)
    sizes = comm.allgather(mine)
    head_len = comm.bcast(len(head) if comm.rank == 0 else 0, root=0)
    offset = head_len + sum(sizes[: comm.rank])
    total = head_len + sum(sizes)
    tmp = comm.bcast(_tmp_name(path) if comm.rank == 0 else None, root=0)

    error = None
    if comm.rank == 0:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, total)
                os.pwrite(fd, head, 0)
            finally:
                os.close(fd)
        except OSError as exc:
            error = RunError(f"{path}: cannot write: {exc.strerror}")
    comm.agree(error)
    try:
        if mine:
            fd = os.open(tmp, os.O_WRONLY)
            try:
                jobs, at = [], offset
                for p in pieces:
                    step = max(64 << 20, -(-len(p) // max(1, threads)))
                    jobs += [(p[a:a + step], at + a) for a in range(0, len(p), step)]
                    at += len(p)
                if threads > 1 and len(jobs) > 1:
                    from concurrent.futures import ThreadPoolExecutor

                    with ThreadPoolExecutor(min(threads, len(jobs))) as pool:
                        list(pool.map(lambda job: pwrite_all(fd, *job), jobs))  # pwrite releases the GIL
                else:
                    for job in jobs:
                        pwrite_all(fd, *job)
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        error = RunError(f"{path}: cannot write: {exc.strerror}")
    try:
        comm.agree(error)
    except RunError:
        if comm.rank == 0:
            remove_quietly(tmp)
        raise
    publish(comm, tmp, path)
    return total


def _csv_field(text: str) -> str:
    if any(c in text for c in ',"\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def centres_csv(centres, names: list) -> bytes:
    """``centers.csv``: a header line of attribute names, then K rows at ``repr`` precision.

    Parameters
    ----------
    centres : ndarray, shape (k, m), float64, or list of k rows of m values
        A value that is a string (a nominal attribute's category) is written as
        it is, quoted for CSV where it must be.
    names : list of str, length m
    """
    lines = [",".join(_csv_field(n) for n in names)]
    lines += [",".join(_csv_field(v) if isinstance(v, str) else repr(float(v)) for v in row) for row in centres]
    return ("\n".join(lines) + "\n").encode("utf-8")


def read_centres_fields(path: str, names: list | None = None) -> tuple[list, list | None]:
    """The rows of a CSV file of centres as text fields, and its header line if it has one.

    Parameters
    ----------
    path : str
    names : list of str, optional
        The data's attribute names: a first line equal to them is the header
        even when the names look like numbers (``@attribute 1 numeric``).

    Returns
    -------
    rows : list of (int, list of str)
        Each row's line number and fields (lines starting with ``#`` are comments).
    names : list of str or None
        The header line's names, if the first line is a header: it is when it
        equals ``names``, or when any of its fields is not a number.
    """
    import csv

    with open(path, newline="") as f:
        reader = csv.reader(f)
        rows = [(reader.line_num, r) for r in reader if r and not r[0].lstrip().startswith("#")]
    header = None
    if rows:
        first = [v.strip() for v in rows[0][1]]
        if names is not None and first == list(names):
            header = first
        else:
            try:
                [float(v) for v in first]
            except ValueError:
                header = first
        if header is not None:
            rows = rows[1:]
    return rows, header


def read_centres_csv(path: str, names: list | None = None) -> tuple[np.ndarray, list | None]:
    """Read centres written by :func:`centres_csv` (or a plain CSV of numbers).

    Parameters
    ----------
    path : str
    names : list of str, optional
        See :func:`read_centres_fields`.

    Returns
    -------
    centres : ndarray, shape (k, m), float64
    names : list of str or None
        The header line's names, if the first line is a header.

    Raises
    ------
    ValueError
        With the file's line number of the first line that is not numbers.
    """
    rows, header = read_centres_fields(path, names)
    values = []
    for line_no, r in rows:
        try:
            values.append([float(v) for v in r])
        except ValueError:
            raise ValueError(f"line {line_no}: not a row of numbers: {','.join(r)[:60]!r}") from None
    if not values:
        raise ValueError("no rows of centres")
    widths = {len(v) for v in values}
    if len(widths) != 1:
        raise ValueError(f"rows have different numbers of values: {sorted(widths)}")
    return np.array(values, dtype=np.float64), header


def write_arrays(comm, out_dir: str, centres: np.ndarray, names: list, labels: np.ndarray) -> None:
    """Write ``centers.csv`` and ``labels.txt`` (collective).

    Any ``summary.json`` already in ``out_dir`` is removed first: the summary is
    written last (:func:`write_summary`), so its presence means a whole result.

    Parameters
    ----------
    comm : Comm or SerialComm
    out_dir : str
        Created if missing.
    centres : ndarray, shape (k, m), float64, or list of k rows of m values
        (see :func:`centres_csv`)
    names : list of str
    labels : ndarray, shape (n_local,), int
        This rank's labels; ranks hold consecutive slices of the input rows.
    """
    error = None
    if comm.rank == 0:
        try:
            os.makedirs(out_dir, exist_ok=True)
            remove_quietly(os.path.join(out_dir, SUMMARY))
            write_atomic(os.path.join(out_dir, CENTERS), centres_csv(centres, names))
        except OSError as exc:
            error = RunError(f"{out_dir}: cannot create the output directory: {exc.strerror}")
        except RunError as exc:
            error = exc
    comm.agree(error)
    write_parallel(comm, os.path.join(out_dir, LABELS), b"", [format_fixed(labels.astype(np.int64), 0)])


def write_summary(comm, out_dir: str, summary: dict) -> None:
    """Write ``summary.json`` from rank 0 (collective: failures reach every rank)."""
    error = None
    if comm.rank == 0:
        try:
            write_atomic(os.path.join(out_dir, SUMMARY), (json.dumps(summary, indent=2) + "\n").encode())
        except RunError as exc:
            error = exc
    comm.agree(error)


def order_by_header(header: list, names: list, path: str) -> list:
    """Which column of a centres file holds each attribute, from the file's header line.

    Parameters
    ----------
    header : list of str
        The file's names, in its column order.
    names : list of str, length m
        The run's attributes, in the data's order.
    path : str
        For the message.

    Returns
    -------
    list of int, length m
        ``order[j]``: the file's column of ``names[j]``.

    Raises
    ------
    ValueError
        The header does not name each attribute exactly once: the message names
        the attributes missing, unknown or repeated.
    """
    header = [h.strip() for h in header]
    if header == list(names):
        return list(range(len(names)))
    repeated = sorted({h for h in header if header.count(h) > 1})
    missing = [n for n in names if n not in header]
    unknown = [h for h in header if h not in names]
    if repeated or missing or unknown:
        parts = []
        if missing:
            parts.append("no column for " + ", ".join(repr(n) for n in missing))
        if unknown:
            parts.append("columns the data does not cluster: " + ", ".join(repr(h) for h in unknown))
        if repeated:
            parts.append("columns named twice: " + ", ".join(repr(h) for h in repeated))
        raise ValueError(f"its header line does not match the attributes clustered ({', '.join(names)}): "
                         + "; ".join(parts))
    return [header.index(n) for n in names]


# --------------------------------------------------------------------------- results directory

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: str, b: str) -> bool:
    """Swap two directories in one atomic step (Linux ``renameat2``); False where it is not supported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # an old kernel or a file system without the exchange: two renames instead
    raise OSError(err, os.strerror(err), a)


def _is_ours(name: str, own: set) -> bool:
    """Whether a file in a results directory is one mpikmeans writes there (or this run's own)."""
    return (name in RESULT_FILES or name == DEFAULT_CHECKPOINT or name in own
            or (name.startswith(".") and (".tmp-" in name or ".probe-" in name or ".mpikmeans-new-" in name)))


class ResultsDir:
    """A run's results directory, checked before any work and published whole (collective).

    Where the results go depends on what is there:

    - no directory: the files are written into a new directory beside it
      (``.NAME.tmp-PID``), renamed to NAME at the end;
    - a directory without results (empty, a stopped run's checkpoint, the
      user's other files): the files are written into a directory inside it
      and moved in one by one, ``summary.json`` last;
    - a directory with results, and ``overwrite``: the new results are written
      into a new directory beside it, which then takes its place in one atomic
      exchange (``renameat2``; two renames where the file system lacks it), and
      the old one is removed.  The old results stay whole until then: a full
      disk or a crash leaves them as they were.  Such a directory may hold only
      what mpikmeans writes there, since all of it is replaced.

    Parameters
    ----------
    comm : Comm or SerialComm
    path : str
    overwrite : bool
    own : iterable of str
        Other paths of this run (its checkpoint, resume and init files) that may
        lie in the directory without being another program's files.
    data : str, optional
        The run's input: a refusal says when the results there are another file's.

    Raises
    ------
    UsageError
        Results are there and ``overwrite`` is False; ``path`` is a file; with
        ``overwrite``, the directory holds files mpikmeans did not write.
    RunError
        The results cannot be written there.
    """

    def __init__(self, comm, path: str, overwrite: bool, own=(), data: str | None = None):
        self.comm = comm
        self.data = os.path.abspath(data) if data else None
        self.path = path.rstrip(os.sep) or os.sep
        self.overwrite = overwrite
        self._own = {os.path.basename(p) for p in own
                     if p and os.path.dirname(os.path.abspath(p)) == os.path.abspath(self.path)}
        self.staging = None
        self._mode = None
        self._created = []  # parent directories this run made, removed again if it fails
        error, mode = None, None
        if comm.rank == 0:
            try:
                mode = self._check()
            except (UsageError, RunError) as exc:
                error = exc
        comm.agree(error)
        self._mode = comm.bcast(mode, root=0)

    # ---- rank 0
    def _check(self) -> str:
        path = self.path
        if os.path.exists(path) and not os.path.isdir(path):
            raise UsageError(f"{path}: exists and is not a directory: choose another --output-dir")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(path):
            self._probe(self._nearest_existing(parent))
            return "new"
        present = [f for f in RESULT_FILES if os.path.exists(os.path.join(path, f))]
        if not present:
            self._probe(path)
            return "into"
        if not self.overwrite:
            raise UsageError(f"{path} already holds results{self._whose()} ({', '.join(present)}); "
                             "pass --overwrite to replace them, or choose another --output-dir")
        cwd = os.path.abspath(os.getcwd())
        target = os.path.abspath(path)
        if cwd == target or cwd.startswith(target + os.sep):
            raise UsageError(f"{path}: --overwrite replaces the directory as a whole, and it is the current "
                             "directory (or holds it): choose another --output-dir")
        foreign = sorted(f for f in os.listdir(path) if not _is_ours(f, self._own))
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise UsageError(f"{path}: --overwrite replaces the directory as a whole, and it holds files "
                             f"mpikmeans did not write ({shown}): move them, or choose another --output-dir")
        try:
            self._probe(parent)
            same_fs = os.stat(parent).st_dev == os.stat(path).st_dev
        except RunError:
            same_fs = False
        if same_fs:
            return "swap"
        self._probe(path)  # a mount point, or a parent this user cannot write: replaced file by file
        return "replace"

    def _whose(self) -> str:
        """`` of another data file, DATA`` when the results there are (from their summary.json)."""
        try:
            with open(os.path.join(self.path, SUMMARY)) as f:
                data = json.load(f).get("data")
        except (OSError, ValueError, AttributeError):
            return ""
        return f" of another data file, {data}," if isinstance(data, str) and data != self.data else ""

    @staticmethod
    def _nearest_existing(path: str) -> str:
        while not os.path.isdir(path):
            up = os.path.dirname(path)
            if up == path:
                break
            if os.path.exists(path):
                raise RunError(f"{path}: is not a directory: cannot write results under it")
            path = up
        return path

    def _probe(self, directory: str) -> None:
        probe = os.path.join(directory, f".{os.path.basename(os.path.abspath(self.path))}.probe-{os.getpid()}")
        try:
            with open(probe, "wb"):
                pass
            os.unlink(probe)
        except OSError as exc:
            raise RunError(f"{self.path}: cannot write results there ({directory}: {exc.strerror})") from None

    def _make_parents(self, parent: str) -> None:
        missing = []
        while not os.path.isdir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        for d in reversed(missing):
            os.mkdir(d)
            self._created.append(d)

    # ---- collective
    def stage(self) -> str:
        """Make the directory the results are written into (collective); returns its path."""
        error, staging = None, None
        if self.comm.rank == 0:
            target = os.path.abspath(self.path)
            parent, base = os.path.dirname(target), os.path.basename(target)
            try:
                if self._mode in ("new", "swap"):
                    self._make_parents(parent)
                    staging = os.path.join(parent, f".{base}.tmp-{os.getpid()}")
                else:
                    staging = os.path.join(target, f".mpikmeans-new-{os.getpid()}")
                os.mkdir(staging)
            except OSError as exc:
                error = RunError(f"{self.path}: cannot write results there: {exc.strerror}")
                staging = None
        self.comm.agree(error)
        self.staging = self.comm.bcast(staging, root=0)
        return self.staging

    def publish(self) -> None:
        """Put the staged results in place (collective); the old ones, if any, are removed."""
        error = None
        if self.comm.rank == 0:
            try:
                self._publish()
                self.staging = None
            except OSError as exc:
                error = RunError(f"{self.path}: cannot put the results in place: {exc.strerror}"
                                 + (f" (they are in {self.staging})" if self.staging else ""))
            except RunError as exc:
                error = exc
        self.comm.agree(error)

    def _publish(self) -> None:
        staging, target = self.staging, os.path.abspath(self.path)
        mode = self._mode
        if mode == "new":
            try:
                os.rename(staging, target)
                return
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                    raise
            # something made the directory meanwhile (this run's checkpoint, say): move the files in
            mode = "into"
        if mode == "into":
            present = [f for f in RESULT_FILES if os.path.exists(os.path.join(target, f))]
            if present:
                raise RunError(f"{self.path}: another run wrote results there meanwhile ({', '.join(present)}); "
                               f"this run's results are in {staging}")
            self._move_files(staging, target)
            return
        if mode == "swap":
            if not _exchange(staging, target):
                old = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.old-{os.getpid()}")
                os.rename(target, old)
                try:
                    os.rename(staging, target)
                except OSError:
                    os.rename(old, target)
                    raise
                staging = old
            shutil.rmtree(staging, ignore_errors=True)  # the old results
            return
        # replace: file by file inside the directory; without summary.json it is not a result meanwhile
        remove_quietly(os.path.join(target, SUMMARY))
        for name in RESULT_FILES:
            if name != SUMMARY and not os.path.exists(os.path.join(staging, name)):
                remove_quietly(os.path.join(target, name))  # a file of the old run this one does not write
        self._move_files(staging, target)

    @staticmethod
    def _move_files(staging: str, target: str) -> None:
        names = [f for f in RESULT_FILES if os.path.exists(os.path.join(staging, f))]
        for name in names:  # RESULT_FILES ends with summary.json: it comes last
            os.replace(os.path.join(staging, name), os.path.join(target, name))
        shutil.rmtree(staging, ignore_errors=True)

    def discard(self) -> None:
        """Remove what this run made for its results (rank 0; after a failure, not collective)."""
        if self.comm.rank != 0:
            return
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        for d in reversed(self._created):
            try:
                os.rmdir(d)  # only if still empty
            except OSError:
                break
        self._created = []
