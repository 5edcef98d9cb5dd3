"""Where compiled kernels are kept between runs, and the guarantees the cache gives.

Compiling is the largest fixed cost of a run: the parser's CPU kernels take a
minute on a fresh machine, the GPU kernels seconds per dtype.  Both are
compiled once per machine type and loaded afterwards (``mpikmeans warmup``
compiles them all ahead; :func:`is_warm` says what it did):

* CPU kernels: Numba's own cache (``@njit(cache=True)``), moved into
  ``<root>/numba/<source hash>`` (``NUMBA_CACHE_DIR``) so that a change in any
  kernel source, or in a module a kernel calls, never loads a stale entry (Numba
  itself checks only the kernel's own file), and so that a read-only install
  still caches.  :func:`harden_numba_cache` makes Numba treat an unreadable or
  corrupt cache file as a miss (it is rebuilt) instead of an error.
* GPU kernels: :class:`KernelStore`, entries keyed by everything that changes the
  code (see :mod:`mpikmeans.backends.gpu.compiled`).

``<root>`` is ``MPIKMEANS_CACHE_DIR``, else ``$XDG_CACHE_HOME/mpikmeans``, else
``~/.cache/mpikmeans``.  Entries are written under a temporary name and renamed
into place (atomic on POSIX, also on NFS for one directory), so many ranks and
jobs may fill an empty cache at once: readers see a whole entry or none.  Every
GPU entry carries a checksum; one that fails it, or does not unpickle, is
removed and rebuilt, never trusted.

This module imports neither Numba nor NumPy: :func:`configure` must run before
Numba is imported to move its cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import pickle
import platform
import struct
import sys

log = logging.getLogger("mpikmeans")

_PACKAGE = os.path.dirname(os.path.abspath(__file__))
#: Text that marks a module holding CPU kernels (Numba's cache; the GPU kernels have their own keys).
_KERNEL_MARKERS = (b"njit", b"numba.jit")


#: Modules whose code is compiled into the GPU kernels (their store's keys hold these sources' hash).
GPU_SOURCES = tuple(os.path.join(_PACKAGE, *f.split("/"))
                    for f in ("backends/gpu/intrinsics.py", "backends/gpu/stepk.py", "backends/gpu/gemmk.py",
                              "backends/gpu/rows.py", "backends/gpu/initk.py", "backends/gpu/scorek.py",
                              "fixedsums.py"))


def cache_root() -> str:
    """The directory of mpikmeans' caches (not created here)."""
    explicit = os.environ.get("MPIKMEANS_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mpikmeans")


def writable_dir(path: str) -> bool:
    """Create ``path`` if needed; whether files can be written there."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".probe-{os.getpid()}-{os.urandom(6).hex()}")
        with open(probe, "wb"):
            pass
        os.unlink(probe)
        return True
    except OSError:
        return False


def source_hash(files: list[str] | None = None) -> str:
    """SHA-256 (16 hex digits) of the package's kernel sources.

    Parameters
    ----------
    files : list of str, optional
        Every one of these files is hashed.  Default: every module of the
        package that holds CPU kernels (it mentions ``njit``), so that an edit
        of any kernel, or of a helper a kernel inlines from another module,
        changes the hash.
    """
    chosen = files is not None
    if files is None:
        files = []
        for dirpath, dirs, names in os.walk(_PACKAGE):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [os.path.join(dirpath, f) for f in sorted(names) if f.endswith(".py")]
        files.remove(os.path.abspath(__file__))  # it names the markers, and holds no kernel
    h = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        if chosen or any(mark in data for mark in _KERNEL_MARKERS):
            h.update(os.path.relpath(path, _PACKAGE).encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:16]


def numba_cache_dir() -> str:
    """Where Numba's cache of this package's kernels goes: ``<root>/numba/<source hash>``."""
    return os.path.join(cache_root(), "numba", source_hash())


#: Marks a NUMBA_CACHE_DIR that :func:`configure` set (so a child process does not take it for the user's).
_OURS = "MPIKMEANS_SET_NUMBA_CACHE_DIR"


def configure() -> str | None:
    """Point Numba's cache at :func:`numba_cache_dir` (unless ``NUMBA_CACHE_DIR`` is set); harden it.

    Call before Numba is imported (``mpikmeans/__init__.py`` does).  When Numba
    is imported already, its configuration is reloaded so that kernels defined
    afterwards (this package's) use the directory.

    Returns
    -------
    str or None
        The directory in use, or None when Numba's default (next to the
        sources, else its own user cache) is kept: a ``NUMBA_CACHE_DIR`` set by
        the user, or a cache root that cannot be written.
    """
    theirs = os.environ.get("NUMBA_CACHE_DIR")
    if theirs and theirs != os.environ.get(_OURS):
        chosen = None
    else:
        # not set, or set by this function in a parent process (whose cache root a
        # child's MPIKMEANS_CACHE_DIR may change): choose again
        path = numba_cache_dir()
        chosen = path if writable_dir(path) else None
        if chosen:
            os.environ["NUMBA_CACHE_DIR"] = os.environ[_OURS] = chosen
            if "numba" in sys.modules:
                from numba.core import config

                config.reload_config()
    if "numba" in sys.modules:
        harden_numba_cache()
    return chosen


_hardened = False


@contextlib.contextmanager
def _locked(path: str):
    """An exclusive ``flock`` on ``path`` (created) while the block runs; none where the file system refuses it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


def harden_numba_cache() -> None:
    """Make Numba's disk cache safe against damaged files and against processes saving at once.

    * Numba writes its cache atomically, but a file damaged later (a full disk, a
      copy cut short, a bit flip) makes it raise from inside the first call of the
      kernel.  With this, the entry is compiled again and rewritten instead.
    * Numba names a new entry's data file after the entries its index lists when
      it saves: two processes saving two signatures of one kernel at once (the
      warm-up's processes, runs starting together on a shared cache) would take
      the same name, and one index would point at the other's machine code.  Each
      save holds a lock on a file beside the kernel's index, so the second save
      reads the first's index and takes another name.
    """
    global _hardened
    if _hardened:
        return
    from numba.core import caching

    cls = caching.IndexDataCacheFile
    load_index, load_data, save = cls._load_index, cls._load_data, cls.save

    def _load_index(self):
        try:
            return load_index(self)
        except Exception as exc:  # a damaged index: start it again
            log.warning("Numba cache index %s is unreadable (%s): rebuilding it", self._index_path, exc)
            return {}

    def _load_data(self, name):
        try:
            return load_data(self, name)
        except Exception as exc:  # a damaged entry: a miss, compiled again and overwritten
            log.warning("Numba cache entry %s is unreadable (%s): compiling again", name, exc)
            raise OSError(str(exc)) from None  # what IndexDataCacheFile.load treats as a miss

    def _save(self, key, data):
        with _locked(self._index_path + ".lock"):
            return save(self, key, data)

    cls._load_index, cls._load_data, cls.save = _load_index, _load_data, _save
    _hardened = True


# ---------------------------------------------------------------------------------------- entries

_MAGIC = b"MPIKMEANS-KERNEL-1\n"
_HEAD = struct.Struct("<32sQ")  # sha256 of the payload, payload length


class KernelStore:
    """A directory of compiled kernels, one file per key, each checksummed.

    Parameters
    ----------
    path : str
        Created on first write; when it cannot be written, :meth:`put` does nothing.

    Notes
    -----
    A key is a tuple of plain values (str, int, float, bool, tuples of them);
    its SHA-256 names the file, so no two keys share an entry.  Values are any
    picklable object.
    """

    def __init__(self, path: str):
        self.path = path
        self._writable = None
        self.hits = 0
        self.misses = 0

    @staticmethod
    def digest(key: tuple) -> str:
        """File name of ``key`` (its SHA-256, hex)."""
        return hashlib.sha256(repr(key).encode()).hexdigest()

    def file_of(self, key: tuple) -> str:
        return os.path.join(self.path, self.digest(key) + ".kernel")

    def get(self, key: tuple, loads=pickle.loads):
        """The value stored for ``key``, or None (absent, damaged: a damaged file is removed).

        ``loads`` turns the stored bytes back into the value (any exception: damaged).
        """
        path = self.file_of(key)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except OSError:
            self.misses += 1
            return None
        try:
            value = loads(self.payload(blob))
        except Exception as exc:
            log.warning("kernel cache entry %s is damaged (%s): compiling again", path, exc)
            try:
                os.unlink(path)
            except OSError:
                pass
            self.misses += 1
            return None
        self.hits += 1
        return value

    @staticmethod
    def payload(blob: bytes) -> bytes:
        """The stored bytes of an entry file's content ``blob``; ValueError when it is not whole."""
        if not blob.startswith(_MAGIC):
            raise ValueError("not a kernel cache entry")
        digest, size = _HEAD.unpack_from(blob, len(_MAGIC))
        payload = blob[len(_MAGIC) + _HEAD.size:]
        if len(payload) != size or hashlib.sha256(payload).digest() != digest:
            raise ValueError(f"checksum mismatch ({len(payload)} of {size} bytes)")
        return payload

    def put(self, key: tuple, value, dumps=pickle.dumps) -> bool:
        """Store ``value`` for ``key`` atomically; False when the directory cannot be written.

        ``dumps`` turns the value into bytes (default: the standard pickle).
        """
        if self._writable is None:
            self._writable = writable_dir(self.path)
        if not self._writable:
            return False
        payload = dumps(value)
        blob = _MAGIC + _HEAD.pack(hashlib.sha256(payload).digest(), len(payload)) + payload
        path = self.file_of(key)
        tmp = f"{path}.tmp-{os.getpid()}-{os.urandom(6).hex()}"
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            return True
        except OSError as exc:
            log.warning("kernel cache %s cannot be written (%s): kernels are compiled every run", self.path, exc)
            self._writable = False
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False

    def entries(self) -> int:
        """Entries in the store now."""
        try:
            return sum(1 for f in os.listdir(self.path) if f.endswith(".kernel"))
        except OSError:
            return 0


# ---------------------------------------------------------------------------------------- what is warm

#: The parts `mpikmeans warmup` compiles, each in a process of its own (see :mod:`mpikmeans.warmup`).
CPU_PART = "cpu"
GPU_PARTS = ("gpu-float64", "gpu-float32")
PARTS = (CPU_PART,) + GPU_PARTS
#: Pieces of the CPU part that its process starts beside itself, each in a process of its own (the
#: longest compiles: :mod:`mpikmeans.warmup`); they mark nothing warm
CPU_HELPERS = ("cpu-lloyd", "cpu-host")
#: About how long a part takes to compile on a machine that has never run this version (seconds, one
#: process): what a run that has to compile says it will cost
COMPILE_ESTIMATE_S = {CPU_PART: 50, "gpu-float64": 35, "gpu-float32": 35}


def gpu_part(dtype: str) -> str:
    """The warm-up part of the GPU kernels for rows of ``dtype``."""
    return f"gpu-{dtype}"


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), or "" where it cannot be read: the lent GPU
    machines are all "vm", and only the model tells their hosts' CPUs apart."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _gpu_models() -> str:
    """The NVIDIA GPUs' model names as the driver lists them (no CUDA call: asked before a run starts one)."""
    base = "/proc/driver/nvidia/gpus"
    names = []
    try:
        for d in sorted(os.listdir(base)):
            with open(os.path.join(base, d, "information"), encoding="utf-8", errors="replace") as f:
                names += [line.split(":", 1)[1].strip() for line in f if line.startswith("Model")]
    except OSError:
        pass
    return ",".join(names) or "unknown"


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def warm_key(part: str) -> str:
    """A name for "this part's kernels are compiled here": the package's kernel sources, the compilers'
    versions, Python, the CPU model and, for a GPU part, the GPUs' models.  A marker only says whether a
    run compiles first; which entry is loaded is decided by the caches' own keys."""
    key = [part, source_hash(), _version("numba"), tuple(sys.version_info[:2]),
           cpu_model() or platform.processor() or platform.machine()]
    if part in GPU_PARTS:
        key += [source_hash(list(GPU_SOURCES)), _version("numba-cuda"), _gpu_models()]
    return hashlib.sha256(repr(key).encode()).hexdigest()[:32]


def _marker(part: str) -> str:
    return os.path.join(cache_root(), "warm", f"{part}-{warm_key(part)}")


def is_warm(part: str) -> bool:
    """Whether ``mpikmeans warmup`` (or a run's helper) compiled this part here, for this version."""
    return os.path.exists(_marker(part))


def mark_warm(part: str, seconds: float) -> None:
    """Record that a part is compiled (best effort: an unwritable cache is compiled again next time)."""
    path = _marker(part)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{seconds:.1f}\n")
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def cold_parts(gpu_dtype: str | None = None) -> list:
    """The parts a run needs that are not marked warm: the CPU kernels, and the GPU kernels of ``gpu_dtype``."""
    need = [CPU_PART] + ([gpu_part(gpu_dtype)] if gpu_dtype else [])
    return [p for p in need if not is_warm(p)]


_warming = False


def warming(on: bool | None = None) -> bool:
    """Whether this process is itself a warm-up (set by :func:`mpikmeans.warmup.warm_part`): its runs start
    no compiling helpers, which would each start more."""
    global _warming
    if on is not None:
        _warming = bool(on)
    return _warming


def warmup_command(part: str) -> list:
    """The command line of a process that compiles one part (``mpikmeans warmup --part``)."""
    return [sys.executable, "-m", "mpikmeans", "warmup", "--part", part, "-q"]


def bytecode_status() -> dict:
    """Whether Python finds this package byte-compiled, or compiles its sources in every process.

    An installation without ``.pyc`` files in an environment that forbids writing
    them (``PYTHONDONTWRITEBYTECODE``, as some images set) compiles every module of
    numpy, numba and this package again at each start.

    Returns
    -------
    dict
        ``cached`` (this module has bytecode), ``writes`` (Python writes it where it
        is missing), ``prefix`` (``PYTHONPYCACHEPREFIX``, or None).
    """
    cached = os.path.exists(importlib.util.cache_from_source(os.path.abspath(__file__)))
    return {"cached": cached, "writes": not sys.dont_write_bytecode, "prefix": sys.pycache_prefix}
