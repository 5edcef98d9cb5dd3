"""Input formats, decided in one place: what a file is, and which reader reads it.

Every caller that reads DATA, or needs its shape, asks this module:
:func:`read_local` (this rank's rows, collective), :func:`shape` (rows and
columns without parsing), :func:`shared_header` / :func:`read_header` (a text
file's attributes), :func:`warm_up` (the reader's start-up), :func:`convert`
(any input to ``.npy``), :func:`input_files` (what a read opens, never to be
written over); :func:`text_output` says what ``gen-data`` writes for a name.  A file is recognised as follows, the first row that applies winning:

==================================  ==============================  ===================  =====================
the file                            recognised by                   header               rows
==================================  ==============================  ===================  =====================
a directory, FIFO, device, socket   ``fstat`` (never opened to      usage error (exit 2): the parallel reader
                                    read: no wait on a FIFO)        needs a regular file to read at offsets
compressed: gzip, bzip2, xz, zstd,  its first bytes (whatever its   input error (exit 3): decompress it first
lz4, zip, 7-zip                     name)
empty                               its size                        input error (exit 3)
NumPy ``.npy`` (``convert``)        the name ``*.npy``, or the      the sidecar          :func:`binary.read_npy`
                                    magic ``\\x93NUMPY``             ``*.npy.json``       (a slice of rows)
ARFF                                the name ``*.arff``, or a       :func:`header.       :func:`arff.read_local`
                                    first line (past blanks and     read_header`         with Weka's tokens
                                    ``%`` comments) that is
                                    ``@relation``, ``@attribute``
                                    or ``@data``
TSV                                 the name ``*.tsv`` or ``*.tab`` :func:`csvhead.      :func:`arff.read_local`
                                                                    read_csv_header`,    with CSV tokens
                                                                    tab-delimited
CSV                                 any other text (``*.csv``,      :func:`csvhead.      :func:`arff.read_local`
                                    no extension, ``*.txt``...)     read_csv_header`,    with CSV tokens
                                                                    delimiter sniffed
==================================  ==============================  ===================  =====================

Names are matched without regard to case.  The content decides before the name
where they disagree, except for ``*.arff`` (an ARFF file's own errors say more
than a CSV reading of it) and ``*.npy``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numba
import numpy as np

from ..errors import InputError, UsageError
from . import binary, open_input
from .arff import LocalData, read_arff, warm_up as warm_up_text
from .csvhead import read_csv_header
from .header import Header, header_text
from .header import read_header as read_arff_header
from .split import check_memory, plan_local

#: The first bytes of a ``.npy`` file.
NPY_MAGIC = b"\x93NUMPY"

#: Bytes read at a time while looking for an ARFF file's first keyword past its comments.
_SNIFF_BLOCK = 1 << 16

_ARFF_KEYWORDS = (b"@relation", b"@attribute", b"@data")


@dataclass(frozen=True)
class ReadOptions:
    """What a run asks of the reader.

    Attributes
    ----------
    ignore : str, optional
        ``--ignore``: attributes not to cluster.
    missing : {"error", "drop", "mean"}
    nominal : {"skip", "weka"}
    threads : int
        Reading and parsing threads of this rank.
    write_arff : bool
        ``--write-arff``: the rows' text is copied into the results (a text input only).
    fill : ndarray, shape (columns,), float64, or None
        With ``missing="mean"``: the values that replace ``?`` (a model's training
        means, in the file's columns); None: the file's own means.
    """

    ignore: str | None = None
    missing: str = "error"
    nominal: str = "skip"
    threads: int = 1
    write_arff: bool = False
    fill: np.ndarray | None = None


@dataclass(frozen=True)
class Shape:
    """A data set's size, known without parsing it.

    Attributes
    ----------
    rows : int
        Rows in the file: exact for ``.npy``, estimated from a sample of a text file.
    columns : int
        Columns a run clusters with the default options (the numeric attributes).
    names : tuple of str
        Their names.
    rank_rows : int
        Rows of the largest rank's share among ``ranks`` (estimated for text: rank 0's).
    exact : bool
        Whether ``rows`` and ``rank_rows`` are counts rather than estimates.
    """

    rows: int
    columns: int
    names: tuple
    rank_rows: int
    exact: bool


@dataclass(frozen=True)
class Format:
    """One row of the table in the module docstring.

    Attributes
    ----------
    name : str
        ``"arff"``, ``"csv"``, ``"tsv"`` or ``"npy"``.
    header : callable or None
        ``header(path) -> Header`` for a text format; None for ``.npy`` (no text header).
    """

    name: str
    header: Callable[[str], Header] | None


def _tsv_header(path: str) -> Header:
    return read_csv_header(path, delimiter="\t")


#: The registry: every input format by name.
FORMATS = {
    "npy": Format("npy", None),
    "arff": Format("arff", read_arff_header),
    "tsv": Format("tsv", _tsv_header),
    "csv": Format("csv", read_csv_header),
}


def _starts_like_arff(fd: int, size: int) -> bool:
    """Whether the first line that is not blank or a ``%`` comment starts with an ARFF keyword."""
    pos, rest = 0, b""
    while pos < size:
        block = os.pread(fd, _SNIFF_BLOCK, pos)
        if not block:
            break
        text = rest + block
        if pos == 0 and text.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
            text = text[3:]
        pos += len(block)
        lines = text.split(b"\n")
        rest = lines.pop() if pos < size else b""  # a line cut by the block's end: read on
        for line in lines + ([rest] if pos >= size else []):
            word = line.strip()
            if not word or word.startswith(b"%"):
                continue
            low = word[:12].lower()
            return any(low.startswith(k) and (len(low) == len(k) or low[len(k):len(k) + 1].isspace())
                       for k in _ARFF_KEYWORDS)
    return False


def detect(path: str) -> Format:
    """The format of ``path`` (see the module docstring's table).  Reads at most its comments and first line.

    Raises
    ------
    UsageError
        Not a regular file.
    InputError
        Unreadable, compressed or empty.
    """
    fd = open_input(path)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise InputError(f"{path}: the file is empty")
        low = path.lower()
        if low.endswith(".npy") or os.pread(fd, len(NPY_MAGIC), 0) == NPY_MAGIC:
            return FORMATS["npy"]
        if low.endswith(".arff") or _starts_like_arff(fd, size):
            return FORMATS["arff"]
        if low.endswith((".tsv", ".tab")):
            return FORMATS["tsv"]
        return FORMATS["csv"]
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


def input_files(path: str) -> list:
    """Every file a read of ``path`` opens: ``path`` and, for a ``.npy`` copy, its sidecar and weights.

    For the commands' check that no output is written over an input; a file
    that cannot be recognised is just itself (the read reports it).
    """
    try:
        fmt = detect(path)
    except (InputError, UsageError):
        return [path]
    return [path] if fmt.header is not None else [path, binary.sidecar_path(path), binary.weights_path(path)]


def read_header(path: str) -> Header:
    """The header of the text file ``path`` (ARFF, CSV or TSV), by its format.

    Raises
    ------
    UsageError
        ``path`` is a ``.npy`` file (no text header), or not a regular file.
    InputError
        Unreadable, compressed, empty, or a malformed header.
    """
    fmt = detect(path)
    if fmt.header is None:
        raise UsageError(f"{path}: a NumPy .npy file has no text header; this needs the ARFF or CSV file")
    return fmt.header(path)


def shared_header(path: str, comm) -> Header:
    """Rank 0 reads :func:`read_header` and broadcasts it; every rank gets it or the same error (collective)."""
    return comm.from_root(lambda: read_header(path))


def _text_or_npy(path: str) -> Header | None:
    """The header of a text file, None for a ``.npy`` one."""
    fmt = detect(path)
    return None if fmt.header is None else fmt.header(path)


def read_local(comm, path: str, options: ReadOptions = ReadOptions()) -> LocalData:
    """This rank's rows of ``path``, whatever its format (collective: every rank calls it).

    Rank 0 recognises the file and reads its header; a text file's rows are
    then read by every rank from its own byte range (after checking that the
    share fits in memory), a ``.npy`` file's as a slice of rows.

    Parameters
    ----------
    comm : Comm or SerialComm
    path : str
    options : ReadOptions

    Returns
    -------
    LocalData
        ``x`` of shape (n_local, m); a rank may have no rows.

    Raises
    ------
    UsageError, InputError
        On every rank, with one message (naming the file, and for a bad row its
        line and attribute).
    """
    header = comm.from_root(lambda: _text_or_npy(path))
    numba.set_num_threads(max(1, min(options.threads, numba.config.NUMBA_NUM_THREADS)))
    if header is None:
        if options.ignore or options.missing != "error" or options.nominal != "skip" or options.write_arff:
            raise UsageError("--ignore, --missing, --nominal and --write-arff need the ARFF or CSV file, "
                             "not a .npy copy", collective=True)
        return binary.read_npy(path, comm, options.threads)
    check_memory(path, header, comm)
    return read_arff(path, comm, header=header, ignore=options.ignore, missing=options.missing,
                     threads=options.threads, nominal=options.nominal, fill=options.fill)


def shape(path: str, ranks: int = 1) -> Shape:
    """Rows and columns of ``path`` without parsing its rows (this rank alone).

    Parameters
    ----------
    path : str
    ranks : int
        The ranks that will share the rows (for :attr:`Shape.rank_rows`).

    Returns
    -------
    Shape

    Raises
    ------
    UsageError, InputError
        As :func:`detect`, or a malformed header.
    """
    fmt = detect(path)
    if fmt.header is None:
        n, m, _, meta, _, _ = binary.describe_npy(path)
        names = tuple(meta.get("attributes") or (f"X{j + 1}" for j in range(m)))
        return Shape(n, m, names, -(-n // max(1, ranks)), True)
    header = fmt.header(path)
    names = tuple(a.name for a in header.attributes if a.kind == "numeric")
    rows = plan_local(path, header, 0, 1)["rows"]
    rank_rows = plan_local(path, header, 0, ranks)["rows"] if ranks > 1 else rows
    return Shape(rows, len(names), names, rank_rows, False)


def warm_up(path: str, threads: int = 1) -> None:
    """The one-time start-up of the reader ``path`` takes (Numba, its cached kernels, ``threads``).

    A file that cannot be opened or recognised gets none: the read that
    follows reports the problem on every rank at once, without first waiting
    for a reader's kernels to compile on a cold cache.
    """
    try:
        fmt = detect(path)
    except (InputError, UsageError):
        return
    if fmt.header is None:
        binary.warm_up(threads)
    else:
        warm_up_text(threads)


def check_convert_target(target: str) -> list:
    """The files ``convert`` writes for ``target``: the ``.npy`` and its sidecar.

    Raises
    ------
    UsageError
        On every rank: ``target`` does not end in ``.npy``.
    """
    if not target.lower().endswith(".npy"):
        raise UsageError(f"{target}: the target must end in .npy", collective=True)
    return [target, binary.sidecar_path(target)]


def results_dir(path: str) -> str:
    """Where a run's results go by default: an ARFF file's path without ``.arff``, any other
    file's whole name, plus ``.mpikmeans`` (``data.arff`` -> ``data.mpikmeans``, ``data.npy`` ->
    ``data.npy.mpikmeans``, ``data.csv`` -> ``data.csv.mpikmeans``), so that the ``.npy`` or CSV
    copy of a file never shares its results directory.  By name: the file need not exist yet."""
    stem, ext = os.path.splitext(path)
    return (stem if ext.lower() == ".arff" else path.rstrip(os.sep)) + ".mpikmeans"


def convert(comm, source: str, target: str, ignore: str | None = None, missing: str = "error",
            threads: int = 1, timings: dict | None = None) -> LocalData:
    """Read ``source`` (any input format) and write ``target`` (.npy) and its sidecar (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    source, target : str
    ignore, missing
        As for ``mpikmeans run``.
    threads : int
        Reading threads per rank (as a run's reader uses).
    timings : dict, optional
        Filled with this rank's ``read_s`` (parsing) and ``write_s`` (the
        ``.npy``, the weights and the sidecar, up to the final barrier).

    Returns
    -------
    LocalData
        What this rank read.

    Raises
    ------
    UsageError
        On every rank: ``target`` does not end in ``.npy``, or is ``source`` itself.
    """
    check_convert_target(target)
    if comm.from_root(lambda: os.path.exists(target) and os.path.exists(source) and os.path.samefile(source, target)):
        raise UsageError(f"{target}: is the input itself; convert writes a new file", collective=True)
    options = ReadOptions(ignore=ignore, missing=missing, threads=threads)
    return binary.timed_copy(comm, lambda: read_local(comm, source, options), target, missing, threads, timings)


#: Names ``gen-data`` will not write text under: a binary copy's, and compressed files'.
_NOT_TEXT = (".npy", ".npz", ".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip", ".7z")


def text_output(path: str, relation: str, names: list) -> tuple[bytes, str]:
    """What a text file named ``path`` starts with, and the delimiter of its rows (``gen-data``).

    ``*.csv``: a line of the column names, commas between values; ``*.tsv`` or
    ``*.tab``: the same with tabs; any other name: an ARFF header (every
    attribute numeric), commas between values.  Each reads back as the same
    rows through :func:`read_local`.

    Returns
    -------
    head : bytes
    delimiter : str

    Raises
    ------
    UsageError
        ``path`` names a binary or compressed file.
    """
    low = path.lower()
    if low.endswith(_NOT_TEXT):
        raise UsageError(f"{path}: gen-data writes text (ARFF, CSV or TSV), not {os.path.splitext(low)[1]}; "
                         "name the file .arff, .csv or .tsv (convert makes a .npy of it)", collective=True)
    if low.endswith((".csv", ".tsv", ".tab")):
        delimiter = "," if low.endswith(".csv") else "\t"
        return (delimiter.join(_csv_name(n, delimiter) for n in names) + "\n").encode("utf-8"), delimiter
    return header_text(relation, names), ","


def _csv_name(name: str, delimiter: str) -> str:
    if any(c in name for c in (delimiter, '"', "'", "\n")) or name != name.strip():
        return '"' + name.replace('"', '""') + '"'
    return name

