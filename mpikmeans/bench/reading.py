"""``mpikmeans bench read``: the I/O paths, gen-data MB/s per rank and the ARFF read with its parts.

For each rank count (and thread count for reading) it runs the real tool under
the MPI launcher:

* ``mpikmeans gen-data``: the writing time from its ``--report`` (process launch
  and Numba's start-up excluded), that time less its fixed cost (the time it
  reports for a 10-row file: file creation, exchanges, fsync, rename), and the
  whole command's wall time;
* ``mpikmeans run --max-iter 1``: ``read_s`` from ``summary.json`` (header,
  memory check, reading, parsing, exchanges, min/max) and ``startup_s``, the
  one-time start-up before it, shown apart and added in "incl. start-up" (a
  version without ``startup_s`` had it inside ``read_s``);

and, in one process per thread count, the read split into its parts by wrapping
the reader's functions (:mod:`mpikmeans.bench.readphases`).

With a baseline (a directory holding another version of the ``mpikmeans``
package, e.g. ``git archive HEAD mpikmeans | tar -x -C DIR``) every measurement
is also made with that version, started through ``PYTHONPATH`` and interleaved
with the current one, so that before/after figures come from the same run on a
shared machine; the generated files of both versions are compared byte for byte.
A baseline whose gen-data has no ``--report`` gets its wall time only.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

from ..errors import UsageError
from .data import gen_arff
from .harness import GenRuns, Launch, Progress, quiet, stats, warm_up

#: Starts :mod:`.readphases` as a file (``sys.argv[1]``), its arguments after it.
PHASES_BOOT = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


@dataclass
class ReadSettings(GenRuns):
    """What ``bench read`` measures (the options of the command, same names and defaults)."""

    rows: int = 2_000_000
    threads: tuple = (1, 2)
    baseline: str | None = None
    dir: str | None = None

    def check(self) -> None:
        """Raise :class:`UsageError` for settings that cannot run."""
        self.check_runs("read", (), ("threads",))
        if self.baseline is not None and not os.path.isdir(os.path.join(self.baseline, "mpikmeans")):
            raise UsageError(f"bench read: --baseline {self.baseline}: no mpikmeans package in that directory")


def package_root() -> str:
    """The directory holding this ``mpikmeans`` package (what ``PYTHONPATH`` names for it)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def package_of(launch: Launch) -> str:
    """Where the ``mpikmeans`` that ``launch`` starts lives."""
    return launch.python("-c", "import mpikmeans, os; print(os.path.dirname(mpikmeans.__file__))").stdout.strip()


def versions(baseline: str | None, launch: Launch) -> dict:
    """The launches of each version measured: ``{"baseline": ..., "current": ...}`` (baseline first)."""
    def first(directory):  # before what the environment has (on the GPU machines: a carried numpy)
        return launch.with_env(PYTHONPATH=os.pathsep.join(p for p in (directory, os.environ.get("PYTHONPATH")) if p))

    out = {"current": first(package_root())}
    if baseline:
        out = {"baseline": first(os.path.abspath(baseline)), **out}
    return out


def _has_report(launch: Launch) -> bool:
    return "--report" in launch.alone("gen-data", "--help").stdout


def _gen(launch: Launch, report: bool, ranks: int, path: str, rows: int, attrs: int, k: int) -> dict:
    if report:
        return gen_arff(launch, ranks, path, rows, attrs, k)
    ran = launch.mpi(ranks, "gen-data", path, "-n", rows, "-m", attrs, "-k", k, "-q")
    return {"bytes": os.path.getsize(path), "write_s": None, "startup_s": None, "wall_s": ran.wall_s}


def _phases(launch: Launch, data: str, threads: int, repeats: int, warm: str, out: str) -> dict:
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "readphases.py")
    launch.python("-c", PHASES_BOOT, here, data, threads, repeats, warm, out)
    with open(out) as f:
        return json.load(f)


def run_read(settings: ReadSettings, launch: Launch, progress: Progress = quiet) -> dict:
    """Measure; the results (the keys of the former ``scripts/bench_io.py``'s JSON).

    Parameters
    ----------
    settings : ReadSettings
    launch : Launch
        Its working directory is replaced by the work directory (not a checkout,
        whose package ``python -m`` would import before ``PYTHONPATH``'s).
    progress : callable

    Returns
    -------
    dict
        ``rows``, ``attrs``, ``k``, ``cpus``, ``packages`` (where each version's
        package is), ``gen`` (one entry per gen-data command: ``version``,
        ``ranks``, ``bytes``, ``write_s``, ``fixed_s``, ``wall_s``), ``read`` (per
        run: ``version``, ``ranks``, ``threads``, ``read_s``, ``startup_s``),
        ``phases`` (per version and thread count), ``same_bytes`` (with a baseline).

    Raises
    ------
    UsageError
        The baseline imports the same package as the current version.
    """
    settings.check()
    s = settings
    work = s.dir or tempfile.mkdtemp(prefix="mpikmeans-io-")
    os.makedirs(work, exist_ok=True)
    launch = Launch(launch.launcher, launch.timeout_s, launch.env, work)
    try:
        return _measure(s, versions(s.baseline, launch), work, progress)
    finally:
        if not s.dir:
            shutil.rmtree(work, ignore_errors=True)


def _measure(s: ReadSettings, variants: dict, work: str, progress: Progress) -> dict:
    results = {"cpus": os.cpu_count(), "rows": s.rows, "attrs": s.attrs, "k": s.k, "packages": {},
               "gen": [], "read": [], "phases": []}
    results["packages"] = {name: package_of(launch) for name, launch in variants.items()}
    if len(set(results["packages"].values())) != len(variants):
        raise UsageError(f"bench read: the versions import the same package: {results['packages']}")
    report = {}
    for name, launch in variants.items():  # load every kernel once, so no timing includes the compiler
        report[name] = _has_report(launch)
        progress(f"{name}: {results['packages'][name]}" + ("" if report[name] else
                 " (its gen-data has no --report: wall time only)"))
        warm_up(launch, os.path.join(work, f"warm-{name}"), ["cpu"])
    files = {}
    for ranks in s.ranks:
        for _ in range(s.repeats):
            for name, launch in variants.items():
                path = os.path.join(work, f"{name}.arff")
                fixed = _gen(launch, report[name], ranks, os.path.join(work, f"tiny-{name}.arff"), 10, s.attrs, s.k)
                fig = _gen(launch, report[name], ranks, path, s.rows, s.attrs, s.k)
                files[name] = path
                results["gen"].append({"version": name, "ranks": ranks, "bytes": fig["bytes"],
                                       "write_s": fig["write_s"], "fixed_s": fixed["write_s"], "wall_s": fig["wall_s"]})
                if fig["write_s"] is not None:
                    mb = fig["bytes"] / 1e6
                    progress(f"gen-data  {name:9s} ranks={ranks} {mb / fig['write_s'] / ranks:6.0f} MB/s/rank, "
                             f"{mb / max(fig['write_s'] - fixed['write_s'], 1e-9) / ranks:6.0f} excl. fixed cost "
                             f"(write {fig['write_s']:.2f} s, fixed {fixed['write_s']:.2f} s, "
                             f"whole command {fig['wall_s']:.2f} s)")
                else:
                    progress(f"gen-data  {name:9s} ranks={ranks} whole command {fig['wall_s']:.2f} s")
        if len(files) == 2:
            same = filecmp.cmp(*files.values(), shallow=False)
            results.setdefault("same_bytes", []).append(same)
            progress(f"gen-data  files of both versions identical: {same}")
    data = files["current"]
    size = os.path.getsize(data)
    for ranks in s.ranks:
        for threads in s.threads:
            for _ in range(s.repeats):
                for name, launch in variants.items():
                    out = os.path.join(work, f"out-{name}")
                    launch.mpi(ranks, "run", data, "-k", s.k, "--max-iter", 1, "--backend", "cpu",
                               "--threads", threads, "-o", out, "--overwrite", "-q")
                    with open(os.path.join(out, "summary.json")) as f:
                        timings = json.load(f)["timings"]
                    read_s, startup_s = timings["read_s"], timings.get("startup_s")
                    results["read"].append({"version": name, "ranks": ranks, "threads": threads, "read_s": read_s,
                                            "startup_s": startup_s})
                    alone = (f"{size / 1e6 / read_s / ranks:6.0f} MB/s/rank reading alone, "
                             if startup_s is not None else "")
                    progress(f"read      {name:9s} ranks={ranks} threads={threads} {alone}"
                             f"{size / 1e6 / (read_s + (startup_s or 0.0)) / ranks:6.0f} incl. start-up "
                             f"(read_s {read_s:.3f}, startup_s "
                             f"{'in read_s' if startup_s is None else f'{startup_s:.3f}'})")
    for threads in s.threads:
        for name, launch in variants.items():
            p = _phases(launch, data, threads, s.repeats, os.path.join(work, f"warm-{name}", "warm.arff"),
                        os.path.join(work, f"phases-{name}.json"))
            results["phases"].append({"version": name, "threads": threads, **p})
            parts = "  ".join(f"{k} {v:.3f}" for k, v in p["parts_s"].items())
            progress(f"phases    {name:9s} 1 rank, threads={threads}: {p['MB_per_s']:.0f} MB/s, {p['total_s']:.3f} s "
                     f"(cpu {p['cpu_s']:.2f} s): {parts}")
    results["file_bytes"] = size
    return results


def _median(rows: list, key: str):
    values = [r[key] for r in rows if r.get(key) is not None]
    return stats(values)["median"] if values else None


def read_table(doc: dict) -> list:
    """Medians per point and version as lines (what ``bench read`` prints at the end)."""
    size = doc["file_bytes"]
    names = list(doc["packages"])
    lines = [f"{doc['rows']} rows x {doc['attrs']} attributes, {size / 1e6:.0f} MB, {doc['cpus']} CPUs; "
             f"medians of {doc['settings'].get('repeats')}, MB/s per rank",
             "gen:  as reported / excluding its fixed cost (a 10-row run's reported time) [fixed cost, s]",
             "read: reading alone (read_s) / including the one-time start-up (read_s + startup_s) [startup_s]"]
    for kind, keys in (("gen", ("ranks",)), ("read", ("ranks", "threads"))):
        for point in sorted({tuple(r[k] for k in keys) for r in doc[kind]}):
            row = []
            for name in names:
                rs = [r for r in doc[kind] if r["version"] == name and tuple(r[k] for k in keys) == point]
                ranks = point[0]
                if kind == "gen":
                    mb = rs[0]["bytes"] / 1e6
                    secs, once = _median(rs, "write_s"), _median(rs, "fixed_s")
                    if secs is None:
                        row.append(f"{name} wall {_median(rs, 'wall_s'):.2f} s")
                        continue
                    row.append(f"{name} {mb / secs / ranks:6.0f} / {mb / max(secs - once, 1e-9) / ranks:6.0f} "
                               f"[{once:.2f}]")
                else:
                    secs, once = _median(rs, "read_s"), _median(rs, "startup_s")
                    alone = "     -" if once is None else f"{size / 1e6 / secs / ranks:6.0f}"
                    row.append(f"{name} {alone} / {size / 1e6 / (secs + (once or 0.0)) / ranks:6.0f} "
                               f"[{'in read_s' if once is None else f'{once:.2f}'}]")
            lines.append(f"{kind:5s} " + " ".join(f"{k}={v}" for k, v in zip(keys, point)) + ":  " + "   ".join(row))
    return lines
