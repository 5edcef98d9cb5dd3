"""Tests for :mod:`mpikmeans.cache`: where compiled kernels are kept and what a damaged entry does.

- the cache root follows MPIKMEANS_CACHE_DIR, else XDG_CACHE_HOME, else ~/.cache;
- Numba's cache lands in ``<root>/numba/<source hash>``, and the hash changes
  with any kernel module's source;
- a KernelStore entry that is truncated, flipped or not a pickle is refused,
  removed and rebuilt; entries never mix keys;
- many processes filling an empty store, or an empty Numba cache, at once (two
  jobs of four ranks) all succeed, and every entry left behind is whole;
- a Numba cache index or entry damaged on disk is compiled again, not an error;
- what is warm: a marker per warm-up part, keyed by what changes its compiled code (:func:`warm_key`),
  written atomically; :func:`cold_parts` lists what a run still needs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mpikmeans import cache as C

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "MPIKMEANS_CACHE_DIR")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MPIKMEANS_CACHE_DIR", str(tmp_path / "mine"))
    assert C.cache_root() == str(tmp_path / "mine")
    monkeypatch.delenv("MPIKMEANS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert C.cache_root() == str(tmp_path / "xdg" / "mpikmeans")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert C.cache_root() == str(tmp_path / "home" / ".cache" / "mpikmeans")


def test_numba_cache_dir_is_keyed_by_the_kernel_sources(tmp_path):
    """Files named are hashed whole; by default, the package's modules that hold kernels and no other."""
    a = tmp_path / "a.py"
    b = tmp_path / "b.py"
    a.write_text("from numba import njit\n@njit(cache=True)\ndef f(x):\n    return x + 1\n")
    b.write_text("def g():\n    return 1\n")
    h1 = C.source_hash([str(a), str(b)])
    b.write_text("def g():\n    return 2\n")
    assert C.source_hash([str(a), str(b)]) != h1
    h2 = C.source_hash([str(a), str(b)])
    a.write_text(a.read_text().replace("x + 1", "x + 2"))
    assert C.source_hash([str(a), str(b)]) != h2
    package = os.path.dirname(C.__file__)
    kernels = []
    for dirpath, dirs, names in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(names):
            path = os.path.join(dirpath, f)
            if f.endswith(".py") and path != os.path.abspath(C.__file__) and \
                    any(mark in Path(path).read_bytes() for mark in C._KERNEL_MARKERS):
                kernels.append(path)
    assert any(p.endswith("fixedsums.py") for p in kernels) and not any(p.endswith("model.py") for p in kernels)
    by_walk = kernels
    assert C.source_hash() == C.source_hash(by_walk) and len(C.source_hash()) == 16


def test_a_process_uses_the_configured_numba_cache(tmp_path):
    code = "import mpikmeans, os; from numba.core import config; print(config.CACHE_DIR)"
    out = subprocess.run([sys.executable, "-c", code], env=_env(MPIKMEANS_CACHE_DIR=tmp_path / "c"),
                         capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert out == os.path.join(str(tmp_path / "c"), "numba", C.source_hash())
    # a NUMBA_CACHE_DIR set by the user is left alone
    out = subprocess.run([sys.executable, "-c", code], env=_env(MPIKMEANS_CACHE_DIR=tmp_path / "c",
                                                                   NUMBA_CACHE_DIR=tmp_path / "theirs"),
                         capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert out == str(tmp_path / "theirs")


def test_an_unwritable_root_keeps_numbas_default(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    try:
        if os.access(root, os.W_OK):
            pytest.skip("running as a user that may write anywhere")
        code = "import os, mpikmeans; print(os.environ.get('NUMBA_CACHE_DIR', ''))"
        out = subprocess.run([sys.executable, "-c", code], env=_env(MPIKMEANS_CACHE_DIR=root),
                             capture_output=True, text=True, timeout=120, check=True).stdout.strip()
        assert out == ""
    finally:
        root.chmod(0o700)


# ---------------------------------------------------------------------------------------- KernelStore

def test_store_round_trip_and_keys_do_not_mix(tmp_path):
    store = C.KernelStore(str(tmp_path / "k"))
    assert store.get(("a", 1)) is None and store.misses == 1
    assert store.put(("a", 1), {"code": b"\x00\x01"})
    assert store.put(("a", 2), {"code": b"\x02"})
    assert store.get(("a", 1)) == {"code": b"\x00\x01"}
    assert store.get(("a", 2)) == {"code": b"\x02"}
    assert store.entries() == 2 and store.hits == 2
    assert not [f for f in os.listdir(store.path) if ".tmp-" in f]  # no temporary left behind


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage", "not_a_pickle"])
def test_a_damaged_entry_is_refused_and_rebuilt(tmp_path, damage):
    store = C.KernelStore(str(tmp_path / "k"))
    key = ("fused", (50, 100, "float32"))
    store.put(key, list(range(1000)))
    path = store.file_of(key)
    blob = open(path, "rb").read()
    if damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "flip":
        blob = blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:]
    elif damage == "empty":
        blob = b""
    elif damage == "garbage":
        blob = os.urandom(len(blob))
    if damage == "not_a_pickle":
        store.put(key, b"payload", dumps=lambda v: b"this is not a pickle")
    else:
        open(path, "wb").write(blob)
    assert store.get(key) is None
    assert not os.path.exists(path)  # removed, so the next run compiles and stores again
    store.put(key, [1, 2, 3])
    assert store.get(key) == [1, 2, 3]


def test_a_store_that_cannot_be_written_is_not_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the directory should go")
    store = C.KernelStore(str(blocker / "k"))
    assert store.put(("a",), 1) is False
    assert store.get(("a",)) is None


_FILL = textwrap.dedent(
    r"""
    import sys, time
    from mpikmeans.cache import KernelStore
    store = KernelStore(sys.argv[1])
    job, rank = sys.argv[2], sys.argv[3]
    for i in range(40):
        key = ("kernel", i % 7)
        value = store.get(key)
        if value is None:
            time.sleep(0.002)  # "compiling"
            value = {"i": i % 7, "code": bytes(range(256)) * 64}
            store.put(key, value)
        assert value["i"] == i % 7 and len(value["code"]) == 256 * 64, (job, rank, i)
    print("ok", job, rank)
    """
)


def test_two_jobs_of_four_ranks_fill_an_empty_store_at_once(tmp_path):
    path = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, "-c", _FILL, str(path), str(j), str(r)], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for j in range(2) for r in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    store = C.KernelStore(str(path))
    assert store.entries() == 7
    for i in range(7):
        assert store.get(("kernel", i))["i"] == i
    assert not [f for f in os.listdir(path) if ".tmp-" in f]


# ---------------------------------------------------------------------------------------- Numba's cache

_KERNELS = textwrap.dedent(
    """
    import numpy as np
    from numba import njit

    @njit(cache=True)
    def total(x):
        s = 0.0
        for v in x:
            s += v * v
        return s

    @njit(cache=True)
    def shifted(x, c):
        return x - c
    """
)

_USE = textwrap.dedent(
    r"""
    import sys
    sys.path.insert(0, sys.argv[1])
    import mpikmeans.jit  # hardens Numba's cache (what every kernel module of the package imports)
    import numpy as np
    import kernels_for_cache_test as K
    x = np.arange(10.0)
    assert K.total(x) == 285.0 and K.shifted(x, 1.0)[0] == -1.0
    print("hits", sum(d.stats.cache_hits.get(s, 0) for d in (K.total, K.shifted) for s in d.signatures))
    """
)


def _run_kernels(tmp_path, cache_dir):
    mod = tmp_path / "mod"
    mod.mkdir(exist_ok=True)
    (mod / "kernels_for_cache_test.py").write_text(_KERNELS)
    return subprocess.Popen([sys.executable, "-c", _USE, str(mod)], env=_env(NUMBA_CACHE_DIR=cache_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_concurrent_processes_fill_an_empty_numba_cache(tmp_path):
    cache_dir = tmp_path / "numba"
    procs = [_run_kernels(tmp_path, cache_dir) for _ in range(8)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    p = _run_kernels(tmp_path, cache_dir)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert out.split()[-1] == "2"  # both kernels loaded from the cache


_SIGNATURES = textwrap.dedent(
    r"""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    import mpikmeans.jit  # hardens Numba's cache
    import numpy as np
    from numba import njit
    from numba.core import caching

    if sys.argv[2] == "save":  # every process reads the empty index, then takes its time to write it
        save_index = caching.IndexDataCacheFile._save_index
        def slow(self, overloads):
            time.sleep(1.0)
            save_index(self, overloads)
        caching.IndexDataCacheFile._save_index = slow
    import kernels_for_signatures as K
    dtypes = sys.argv[3].split(",")
    got = [K.scaled(np.arange(4, dtype=d), 3) for d in dtypes]
    assert all(g.dtype == np.dtype(d) and list(g) == [0, 3, 6, 9] for g, d in zip(got, dtypes)), got
    print("hits", sum(K.scaled.stats.cache_hits.values()))
    """
)


def test_processes_saving_signatures_of_one_kernel_at_once_keep_each_its_own_entry(tmp_path):
    # Numba names a new entry's data file from the index it read: without the lock around a save, three
    # processes that read the empty index together would all write entry 1 and one index would send a
    # float32 call to another signature's machine code
    mod = tmp_path / "mod"
    mod.mkdir()
    (mod / "kernels_for_signatures.py").write_text(
        "from numba import njit\n\n@njit(cache=True)\ndef scaled(x, a):\n    return x * a\n")
    cache_dir = tmp_path / "numba"

    def start(mode, dtypes):
        return subprocess.Popen([sys.executable, "-c", _SIGNATURES, str(mod), mode, dtypes],
                                env=_env(NUMBA_CACHE_DIR=cache_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    procs = [start("save", d) for d in ("int64", "float64", "float32")]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    p = start("load", "float32,int64,float64")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert out.split()[-1] == "3"  # every signature from its own entry


@pytest.mark.parametrize("which", ["index", "data"])
def test_a_damaged_numba_cache_file_is_compiled_again(tmp_path, which):
    cache_dir = tmp_path / "numba"
    p = _run_kernels(tmp_path, cache_dir)
    assert p.wait(timeout=300) == 0
    files = [f for f in cache_dir.rglob("*") if f.is_file() and f.suffix == (".nbi" if which == "index" else ".nbc")]
    assert files
    for f in files:
        f.write_bytes(f.read_bytes()[:7])  # truncated
    p = _run_kernels(tmp_path, cache_dir)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert "compiling again" in err or "rebuilding" in err
    p = _run_kernels(tmp_path, cache_dir)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0 and out.split()[-1] == "2", err  # rewritten whole: loaded again


def test_a_child_with_its_own_cache_root_is_not_held_to_the_parents(tmp_path):
    # a benchmark imports mpikmeans (which sets NUMBA_CACHE_DIR in its environment), then
    # starts runs with MPIKMEANS_CACHE_DIR of their own: theirs must win
    code = "import mpikmeans, os; from numba.core import config; print(config.CACHE_DIR)"
    parent = _env(MPIKMEANS_CACHE_DIR=tmp_path / "parent")
    out = subprocess.run([sys.executable, "-c", "import os, mpikmeans, json; print(json.dumps(dict(os.environ)))"],
                         env=parent, capture_output=True, text=True, timeout=120, check=True).stdout
    import json

    inherited = json.loads(out)
    assert inherited["NUMBA_CACHE_DIR"].startswith(str(tmp_path / "parent"))
    inherited["MPIKMEANS_CACHE_DIR"] = str(tmp_path / "child")
    got = subprocess.run([sys.executable, "-c", code], env=inherited, capture_output=True, text=True, timeout=120,
                         check=True).stdout.strip()
    assert got == os.path.join(str(tmp_path / "child"), "numba", C.source_hash())


# ---------------------------------------------------------------------------------------- GPU jobs, for real

def _usable_gpu() -> bool:
    try:
        from mpikmeans.backends import gpu as G
    except Exception:
        return False
    return not G.SIM and G.gpu_available()


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.skipif(not _usable_gpu(), reason="needs a real CUDA GPU")
def test_two_gpu_jobs_of_four_ranks_start_on_an_empty_cache_and_a_damaged_store_is_rebuilt(tmp_path):
    """Eight ranks and their helper processes compile into one empty cache at once; then every
    GPU kernel entry is truncated, and the next job refuses each, compiles it again and rewrites it."""
    from concurrent.futures import ThreadPoolExecutor

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import run_cli

    data = tmp_path / "d.arff"
    r = run_cli(["gen-data", data, "-n", 20000, "-m", 12, "-k", 5, "--seed", 4], timeout=300)
    assert r.code == 0, r.err
    cache = tmp_path / "cache"
    env = {"MPIKMEANS_CACHE_DIR": cache}

    def job(name):
        return run_cli(["run", data, "-k", 5, "--backend", "gpu", "--share-gpus", "-o", tmp_path / name, "-q"],
                       np=4, timeout=600, env=env)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(job, ["a", "b"]))
    for r in results:
        assert r.code == 0, r.err
    centres = (tmp_path / "a" / "centers.csv").read_bytes()
    assert (tmp_path / "b" / "centers.csv").read_bytes() == centres
    store = cache / "cuda"
    entries = sorted(store.glob("*.kernel"))
    assert entries and not list(store.glob("*.tmp-*"))
    for f in entries:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    r = job("c")  # refuses the damaged entries it needs, compiles them again, rewrites them
    assert r.code == 0, r.err
    assert (tmp_path / "c" / "centers.csv").read_bytes() == centres
    # and a warm-up those the run did not need (k-means||'s nearest-candidate kernel, the other dtype's)
    r = run_cli(["warmup", "--gpu", "-q"], timeout=600, env=env)
    assert r.code == 0, r.err
    for f in entries:  # every damaged entry was refused, compiled again and rewritten whole
        assert C.KernelStore.payload(f.read_bytes())


def test_info_says_whether_the_kernel_caches_are_warm(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import run_cli

    env = {"MPIKMEANS_CACHE_DIR": tmp_path / "c", "NUMBA_CACHE_DIR": None}
    r = run_cli(["info"], env=env)
    assert r.code == 0, r.err
    line = next(ln for ln in r.out.splitlines() if ln.startswith("kernel cache:"))
    assert line == (f"kernel cache: {tmp_path / 'c'}: cpu cold, gpu-float64 cold, gpu-float32 cold"
                    "  (mpikmeans warmup compiles them)"), line
    # the cpu part marked warm (as a warm-up does at its end), in a process of that cache root
    subprocess.run([sys.executable, "-c", "from mpikmeans.cache import mark_warm; mark_warm('cpu', 1.0)"],
                   env=_env(MPIKMEANS_CACHE_DIR=tmp_path / "c"), check=True, timeout=120)
    r = run_cli(["info", "--json"], env=env)
    assert r.code == 0, r.err
    import json

    assert json.loads(r.out)["cache"]["parts"] == {"cpu": "warm", "gpu-float64": "cold", "gpu-float32": "cold"}
    r = run_cli(["info"], env=env)
    line = next(ln for ln in r.out.splitlines() if ln.startswith("kernel cache:"))
    # no GPU here: its cold parts are not what a run on this node needs
    assert "cpu warm" in line and "mpikmeans warmup compiles them" not in line, line


def test_info_says_when_every_run_compiles_the_python_sources(tmp_path):
    """No .pyc and none written (PYTHONDONTWRITEBYTECODE, as the GPU machines' image): info says so and what to do."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import run_cli

    r = run_cli(["info"], env={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(tmp_path / "none")})
    assert r.code == 0, r.err
    assert "Python bytecode: none, and none is written (PYTHONDONTWRITEBYTECODE)" in r.out, r.out
    r = run_cli(["info"], env={"PYTHONPYCACHEPREFIX": str(tmp_path / "pyc")})  # written as the package loads
    assert r.code == 0, r.err
    assert f"Python bytecode: cached in {tmp_path / 'pyc'}" in r.out, r.out
    assert (tmp_path / "pyc").is_dir()


# ---------------------------------------------------------------------------------------- what is warm

@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A cache root of its own and a fixed description of the machine (the warm keys' inputs)."""
    monkeypatch.setenv("MPIKMEANS_CACHE_DIR", str(tmp_path / "cache"))
    desc = {"cpu": "Some CPU", "gpus": "Some GPU", "numba": "0.1", "numba-cuda": "0.2"}
    monkeypatch.setattr(C, "cpu_model", lambda: desc["cpu"])
    monkeypatch.setattr(C, "_gpu_models", lambda: desc["gpus"])
    monkeypatch.setattr(C, "_version", lambda dist: desc[dist])
    return desc


def test_the_parts_and_their_commands():
    assert C.PARTS == (C.CPU_PART,) + C.GPU_PARTS == ("cpu", "gpu-float64", "gpu-float32")
    assert [C.gpu_part(d) for d in ("float64", "float32")] == list(C.GPU_PARTS)
    assert set(C.COMPILE_ESTIMATE_S) == set(C.PARTS)
    assert C.warmup_command("gpu-float32") == [sys.executable, "-m", "mpikmeans", "warmup", "--part", "gpu-float32",
                                               "-q"]
    # the per-shape GPU markers are gone: a part covers every shape
    assert not hasattr(C, "gpu_shape_key") and not hasattr(C, "mark_gpu_shape_warm")
    assert not hasattr(C, "gpu_shape_warm")


def test_warm_key_changes_with_the_part_and_what_compiles_it(machine, monkeypatch, tmp_path):
    keys = {p: C.warm_key(p) for p in C.PARTS}
    assert len(set(keys.values())) == 3 and all(len(k) == 32 for k in keys.values())
    assert keys == {p: C.warm_key(p) for p in C.PARTS}  # stable

    def changed(**what):
        saved = dict(machine)
        machine.update(what)
        try:
            return {p for p in C.PARTS if C.warm_key(p) != keys[p]}
        finally:
            machine.clear()
            machine.update(saved)

    assert changed(cpu="Another CPU") == set(C.PARTS)
    assert changed(numba="0.9") == set(C.PARTS)
    assert changed(gpus="Another GPU") == set(C.GPU_PARTS)
    assert changed(**{"numba-cuda": "0.9"}) == set(C.GPU_PARTS)
    # the CPU kernels' sources change every part's key (the GPU kernels' sources: the test below)
    monkeypatch.setattr(C, "source_hash", lambda files=None: "other" if files is None else "gpu")
    assert all(C.warm_key(p) != keys[p] for p in C.PARTS)


def _gpu_source_copies(tmp_path) -> list:
    out = []
    for src in C.GPU_SOURCES:
        dst = tmp_path / "gpu-sources" / os.path.basename(src)
        dst.parent.mkdir(exist_ok=True)
        dst.write_bytes(Path(src).read_bytes())
        out.append(dst)
    return out


def test_every_gpu_kernel_source_is_in_the_gpu_hash(machine, monkeypatch, tmp_path):
    """The GPU kernels' store keys (:func:`mpikmeans.backends.gpu.compiled.toolchain`) and the GPU parts'
    warm markers hold the hash of :data:`GPU_SOURCES`: an edit of any of them must change it, or a kernel
    compiled from the old source is loaded after the edit.  Copies of the real sources, each edited in turn."""
    copies = _gpu_source_copies(tmp_path)
    assert sorted(c.name for c in copies) == ["fixedsums.py", "gemmk.py", "initk.py", "intrinsics.py", "rows.py",
                                             "scorek.py", "stepk.py"]
    # every module of the GPU package that compiles a kernel is among them
    gpu_dir = Path(C.__file__).parent / "backends" / "gpu"
    kernels = {f.name for f in gpu_dir.glob("*.py") if "cuda.jit(" in f.read_text()}
    assert kernels <= {c.name for c in copies}, kernels
    monkeypatch.setattr(C, "GPU_SOURCES", tuple(str(c) for c in copies))
    base = C.source_hash([str(c) for c in copies])
    keys = {p: C.warm_key(p) for p in C.PARTS}
    unchanged = []
    for c in copies:
        text = c.read_bytes()
        c.write_bytes(text.replace(b"\n", b"\n# an edit\n", 1))
        changed = {p for p in C.PARTS if C.warm_key(p) != keys[p]}
        if C.source_hash([str(x) for x in copies]) == base or changed != set(C.GPU_PARTS):
            unchanged.append(c.name)
        c.write_bytes(text)
    assert not unchanged, f"edits of {unchanged} leave the GPU sources' hash (and the GPU parts' keys) as they were"


def test_mark_warm_and_cold_parts(machine):
    assert not any(C.is_warm(p) for p in C.PARTS)
    assert C.cold_parts() == ["cpu"]
    assert C.cold_parts("float32") == ["cpu", "gpu-float32"]
    C.mark_warm("cpu", 12.34)
    assert C.is_warm("cpu") and not C.is_warm("gpu-float32")
    assert C.cold_parts() == [] and C.cold_parts("float64") == ["gpu-float64"]
    C.mark_warm("gpu-float64", 3.0)
    assert C.cold_parts("float64") == [] and C.cold_parts("float32") == ["gpu-float32"]
    marker = Path(C.cache_root()) / "warm" / f"cpu-{C.warm_key('cpu')}"
    assert marker.read_text() == "12.3\n"
    # another machine (or version) sharing the cache: its own key, so not warm for it
    machine["cpu"] = "Another CPU"
    assert not C.is_warm("cpu") and C.cold_parts() == ["cpu"]


def test_a_marker_appears_whole_or_not_at_all(machine, monkeypatch):
    """The marker is written under a temporary name and renamed into place: a reader never sees a part of
    it, and a write that fails leaves no marker (and raises nothing: best effort)."""
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((os.path.exists(dst), Path(src).read_text(), ".tmp-" in os.path.basename(src)))
        return real_replace(src, dst)

    monkeypatch.setattr(C.os, "replace", replace)
    C.mark_warm("cpu", 1.0)
    assert seen == [(False, "1.0\n", True)] and C.is_warm("cpu")
    warm_dir = Path(C.cache_root()) / "warm"
    assert [p.name for p in warm_dir.iterdir()] == [f"cpu-{C.warm_key('cpu')}"]
    monkeypatch.setattr(C.os, "replace", _failing_replace)
    C.mark_warm("gpu-float32", 1.0)  # no exception
    assert not C.is_warm("gpu-float32")
    assert not (warm_dir / f"gpu-float32-{C.warm_key('gpu-float32')}").exists()


def _failing_replace(src, dst):
    raise OSError(28, "No space left on device")


def test_a_failed_marker_write_leaves_no_temporary_file(machine, monkeypatch):
    """A cache on a full (shared) disk: the marker's temporary file is removed, as the kernel store's is."""
    monkeypatch.setattr(C.os, "replace", _failing_replace)
    C.mark_warm("cpu", 1.0)
    warm_dir = Path(C.cache_root()) / "warm"
    assert not list(warm_dir.iterdir()), list(warm_dir.iterdir())


def test_an_unwritable_cache_root_marks_nothing_and_raises_nothing(machine, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache root should be")
    monkeypatch.setenv("MPIKMEANS_CACHE_DIR", str(blocker))
    C.mark_warm("cpu", 1.0)
    assert not C.is_warm("cpu") and C.cold_parts() == ["cpu"]


_MARK = textwrap.dedent(
    r"""
    import sys
    from mpikmeans import cache as C
    for i in range(200):
        C.mark_warm("cpu", float(sys.argv[1]))
        assert C.is_warm("cpu")
    """
)


def test_many_processes_mark_one_part_at_once(tmp_path):
    env = _env(MPIKMEANS_CACHE_DIR=tmp_path / "c")
    procs = [subprocess.Popen([sys.executable, "-c", _MARK, str(j)], env=env, stderr=subprocess.PIPE, text=True)
             for j in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    files = list((tmp_path / "c" / "warm").iterdir())
    assert len(files) == 1 and files[0].name.startswith("cpu-"), files
    assert files[0].read_text() in {f"{float(j):.1f}\n" for j in range(4)}


def test_warming_flag():
    assert C.warming() is False
    try:
        assert C.warming(True) is True and C.warming() is True
    finally:
        C.warming(False)
    assert C.warming() is False
