"""Reading the input in parallel, writing results.

Which reader a file takes is decided in :mod:`mpikmeans.io.formats` (the one
registry of input formats); this module holds what every reader shares: how a
data file is opened (:func:`open_input`), so that a file the parallel reader
cannot use is refused the same way, with the same message, wherever it is
first opened.  It imports none of its submodules: ``mpikmeans.io.output`` and
the writers stay light to import.
"""

from __future__ import annotations

import os
import stat

from ..errors import InputError, UsageError

#: The first bytes of the compressed files a user is likely to have, and the tool
#: that made them.  The parallel reader needs byte offsets into the text, which a
#: compressed stream does not have.
COMPRESSED_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x04\x22\x4d\x18", "lz4"),
    (b"PK\x03\x04", "zip"),
    (b"7z\xbc\xaf\x27\x1c", "7-zip"),
)
#: Bytes read to recognise :data:`COMPRESSED_MAGIC`.
MAGIC_BYTES = 8

_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def compression(head: bytes) -> str | None:
    """The compressor whose magic bytes start ``head`` (see :data:`COMPRESSED_MAGIC`), or None."""
    for magic, name in COMPRESSED_MAGIC:
        if head.startswith(magic):
            return name
    return None


def open_regular(path: str) -> int:
    """Open the regular file ``path`` for reading without waiting: a file descriptor, or a clear error.

    It is opened without blocking (``O_NONBLOCK``, which changes nothing for a
    regular file) so that a named pipe with no writer is refused at once
    instead of waited for.

    Returns
    -------
    int
        A file descriptor; the caller closes it.

    Raises
    ------
    UsageError
        ``path`` is a directory, a FIFO, a device or a socket.
    InputError
        It cannot be opened.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    for test, what in _NOT_REGULAR:
        if test(mode):
            os.close(fd)
            raise UsageError(f"{path}: {what}, not a regular file: the parallel reader reads byte ranges at "
                             "offsets, so the data must be in a regular file (copy it to one first)")
    return fd


def open_input(path: str) -> int:
    """Open the data file ``path`` for reading: a file descriptor, or a clear error.

    The file must be a regular (:func:`open_regular`), uncompressed file:
    every rank reads its own byte range at an offset.

    Parameters
    ----------
    path : str

    Returns
    -------
    int
        The descriptor of ``path`` opened for reading, at offset 0; the caller closes it.

    Raises
    ------
    UsageError
        Not a regular file (:func:`open_regular`).
    InputError
        It cannot be opened, or it is compressed.
    """
    fd = open_regular(path)
    try:
        try:
            tool = compression(os.pread(fd, MAGIC_BYTES, 0))
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror}") from None
        if tool is not None:
            raise InputError(f"{path}: compressed ({tool}): decompress it first, the parallel reader needs "
                             "byte offsets into the text")
    except BaseException:
        os.close(fd)
        raise
    return fd
