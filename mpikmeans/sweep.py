"""A K sweep in one job: ``mpikmeans run DATA -k 2:64`` (collective).

The data is read, scaled and loaded into the backend once
(:func:`mpikmeans.runner.run_job` does that and hands this module one
function that fits a K); then every K is clustered from its own
initialisation with ``--seed``, exactly as ``run -k K --seed S`` would (the
same centres and labels), and its results go to ``<output-dir>/k<K>/``:
``centers.csv``, ``labels.txt``, ``model.json``, ``summary.json``.  At the end
``sweep.csv`` holds one line per K (K, SSE, iterations, the quality scores,
seconds) and ``sweep.png`` draws the SSE and the scores against K with the
knee marked (where matplotlib, the ``plots`` extra, is installed; otherwise a
warning says so and the table is written alone).

**The knee** (:func:`kneedle`) is the offline Kneedle rule (Satopää et al.,
2011) on the SSE against K: K and the SSE are each scaled to [0, 1] over the
sweep; the knee is the K where the scaled SSE lies farthest below the
straight line from the first K's point to the last's (the largest
``(1 - k') - sse'``; the smallest such K on a tie).  Fewer than 3 K, or an
SSE that never falls below that line, have no knee.

**Stopped and resumed.**  A stop signal or the walltime ends the sweep as it
ends a run: the K being fitted is saved in the checkpoint, with its K among
its settings.  ``--resume CHECKPOINT`` (and the same ``-k`` and settings)
keeps every K whose ``k<K>/summary.json`` is there (a K's results appear
whole, summary last), goes on with the checkpoint's K where it stopped, and
fits the others; the table is then made from every K's summary, so it is
the uninterrupted sweep's (but for the seconds).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from dataclasses import dataclass, field

from .checkpoint import check_compatible
from .config import NOTICE, format_k
from .errors import RunError, UsageError
from .io.output import (CENTERS, CLUSTERED, LABELS, MODEL, RESULT_FILES, SUMMARY, SWEEP_PLOT, SWEEP_TABLE,
                        ResultsDir, write_atomic)
from .scores import SCORE_NAMES

log = logging.getLogger("mpikmeans")

#: The quality scores' columns of sweep.csv, in the scores' own order
SCORE_COLUMNS = SCORE_NAMES
#: How sweep.csv and the log name the knee rule
KNEE_RULE = "Kneedle knee of SSE"
#: A K's directory: ``k<K>``
_K_DIR = re.compile(r"^k([0-9]+)$")
#: Settings a kept K's summary.json must share with the sweep that resumes it (summary key, setting)
_SAME = (("seed", "seed"), ("init", "init"), ("n_init", "n_init"), ("tol", "tol"), ("empty_cluster", "empty_cluster"),
         ("nominal", "nominal"))


def k_dir(out_dir: str, k: int) -> str:
    """Where a sweep's K goes: ``<out_dir>/k<K>``."""
    return os.path.join(out_dir, f"k{k}")


def kneedle(ks, sse) -> int | None:
    """The knee of a decreasing SSE curve: the offline Kneedle rule (see the module's docstring).

    Parameters
    ----------
    ks : sequence of int, length p
        Increasing K values.
    sse : sequence of float, length p

    Returns
    -------
    int or None
        The K of the knee; None for fewer than 3 K, a flat SSE, or an SSE
        that never falls below the chord from its first point to its last.
    """
    if len(ks) < 3:
        return None
    k_lo, k_hi = float(ks[0]), float(ks[-1])
    s_lo, s_hi = float(min(sse)), float(max(sse))
    if k_hi == k_lo or s_hi == s_lo:
        return None
    best, best_gap = None, 0.0
    for k, s in zip(ks, sse):
        kn = (k - k_lo) / (k_hi - k_lo)
        sn = (s - s_lo) / (s_hi - s_lo)
        gap = (1.0 - kn) - sn
        if gap > best_gap:
            best, best_gap = int(k), gap
    return best


#: Which way each score points: the best K has the largest value (+1) or the smallest (-1)
SCORE_BEST = {"calinski_harabasz": 1, "davies_bouldin": -1, "silhouette_sqeuclidean": 1, "silhouette_sample": 1}


def best_by_score(columns: list, rows: list) -> dict:
    """Each score's own answer: the K of its best value (the largest Calinski–Harabasz and silhouettes,
    the smallest Davies–Bouldin; the smallest K on a tie), for the scores the sweep has.

    Parameters
    ----------
    columns : list of str
        :func:`sweep_rows`'s columns.
    rows : list of list

    Returns
    -------
    dict
        score name -> K (scores with no value at any K are left out).
    """
    out = {}
    for name, sign in SCORE_BEST.items():
        if name not in columns:
            continue
        j = columns.index(name)
        values = [(sign * r[j], -r[0]) for r in rows if r[j] is not None and math.isfinite(r[j])]
        if values:
            out[name] = -max(values)[1]
    return out


@dataclass
class SweepPlan:
    """What a sweep does, decided before the data is read (the same on every rank).

    Attributes
    ----------
    out_dir : str
    ks : tuple of int
    done : tuple of int
        K values kept from the sweep this one resumes (complete ``k<K>/``).
    results : dict
        ``{K: ResultsDir}`` of the K values to fit.
    resume_k : int or None
        The K the ``--resume`` checkpoint goes on with (None: none, or it was done).
    resumed : object or None
        That checkpoint (:func:`mpikmeans.checkpoint.load`'s).
    """

    out_dir: str
    ks: tuple
    done: tuple = ()
    results: dict = field(default_factory=dict)
    resume_k: int | None = None
    resumed: object = None


@dataclass
class SweepOutcome:
    """How a sweep ended.

    Attributes
    ----------
    table : dict or None
        :func:`finish_sweep`'s result (None: stopped).
    stopped_at : int or None
        The K a stop signal came at (its fit's outcome in ``outcome``, or None
        when it came between two K).
    outcome : object or None
        The stopped K's :class:`mpikmeans.runner.RunOutcome`.
    done : list of int
        K values with complete results.
    """

    table: dict | None = None
    stopped_at: int | None = None
    outcome: object = None
    done: list = field(default_factory=list)


def _old_k_dirs(out_dir: str) -> list:
    """The ``k<K>`` directories already in ``out_dir`` that hold a K's results, by K."""
    try:
        names = os.listdir(out_dir)
    except OSError:
        return []
    found = []
    for name in names:
        match = _K_DIR.match(name)
        if match and os.path.exists(os.path.join(out_dir, name, SUMMARY)):
            found.append(int(match.group(1)))
    return sorted(found)


def _check_kept(path: str, summary: dict, cfg, data: str) -> None:
    """A kept K's summary.json was made by a sweep with this one's settings (rank 0)."""
    mine = {"data": os.path.abspath(data), **{key: getattr(cfg, name) for key, name in _SAME},
            "normalize": cfg.normalize, "missing": cfg.missing, "scores": cfg.scores != "none"}
    theirs = {key: summary.get(key) for key, _ in _SAME}
    theirs.update({"data": summary.get("data"), "normalize": (summary.get("normalize") or {}).get("method"),
                   "missing": (summary.get("missing") or {}).get("policy"), "scores": "scores" in summary})
    for key, value in mine.items():
        if theirs.get(key) != value:
            raise UsageError(f"--resume: {path} was made with {key} {theirs.get(key)!r}, this sweep has {value!r}: "
                             "give the settings of the sweep it resumes, or start afresh with --overwrite")


def plan_sweep(comm, cfg, out_dir: str, data: str, settings_for, resumed=None, own=()) -> SweepPlan:
    """Check the output directory and the resumed state before any work (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    cfg : RunConfig
        A sweep's (``cfg.k`` a tuple).
    out_dir : str
    data : str
    settings_for : callable(int) -> dict
        The binding settings of a checkpoint of K (known before the read).
    resumed : object, optional
        The ``--resume`` checkpoint, read.
    own : iterable of str
        This run's other files (checkpoint, resume file) that may lie in ``out_dir``.

    Returns
    -------
    SweepPlan

    Raises
    ------
    UsageError
        ``out_dir`` holds a single run's results, or a sweep's without
        ``--resume`` or ``--overwrite``; a kept K was made with other settings;
        the checkpoint is of a K outside the sweep, or of other settings.
    """
    ks = tuple(cfg.k)

    def look():
        if os.path.exists(out_dir) and not os.path.isdir(out_dir):
            raise UsageError(f"{out_dir}: exists and is not a directory: choose another --output-dir")
        single = [f for f in (CENTERS, LABELS, CLUSTERED, MODEL, SUMMARY) if os.path.exists(os.path.join(out_dir, f))]
        if single:
            raise UsageError(f"{out_dir} holds the results of a single run ({', '.join(single)}); a K sweep writes "
                             "k<K>/ directories and sweep.csv beside them: choose another --output-dir")
        old = _old_k_dirs(out_dir)
        if cfg.resume:
            done = []
            for k in old:
                if k in ks:
                    path = os.path.join(k_dir(out_dir, k), SUMMARY)
                    try:
                        with open(path) as f:
                            summary = json.load(f)
                    except (OSError, ValueError):
                        continue  # fitted again
                    _check_kept(path, summary, cfg, data)
                    done.append(k)
            return tuple(done)
        if not cfg.overwrite and (old or os.path.exists(os.path.join(out_dir, SWEEP_TABLE))):
            shown = f"{SWEEP_TABLE}, " if os.path.exists(os.path.join(out_dir, SWEEP_TABLE)) else ""
            shown += ", ".join(f"k{k}/" for k in old[:5]) + (" ..." if len(old) > 5 else "")
            raise UsageError(f"{out_dir} already holds a K sweep's results ({shown.rstrip(', ')}); go on with it "
                             "with --resume CHECKPOINT, replace it with --overwrite, or choose another --output-dir")
        return ()

    done = comm.from_root(look)
    resume_k = None
    if resumed is not None:
        resume_k = resumed.settings.get("k")
        if resume_k not in ks:
            raise UsageError(f"--resume {cfg.resume}: a checkpoint of K = {resume_k}, which is not in -k "
                             f"{format_k(ks)}", collective=True)
        comm.from_root(lambda: check_compatible(cfg.resume, resumed.settings, settings_for(resume_k)))
        if resume_k in done:
            resume_k, resumed = None, None
    results = {k: ResultsDir(comm, k_dir(out_dir, k), cfg.overwrite, own=own, data=data) for k in ks if k not in done}
    return SweepPlan(out_dir, ks, done, results, resume_k, resumed)


def run_sweep(comm, cfg, plan: SweepPlan, fit_k, stopped) -> SweepOutcome:
    """Fit every K of the plan not done yet, in increasing order, then write the table (collective).

    Parameters
    ----------
    comm : Comm or SerialComm
    cfg : RunConfig
    plan : SweepPlan
    fit_k : callable(int, ResultsDir, checkpoint or None) -> RunOutcome
        Fits one K from its own initialisation (or from the checkpoint) and
        publishes its results.
    stopped : callable() -> int
        The stop signal any rank has had (collective), 0 for none.

    Returns
    -------
    SweepOutcome
    """
    done = list(plan.done)
    if done:
        log.log(NOTICE, "K sweep resumed: K = %s kept (their k<K>/ are complete)", ", ".join(map(str, done)))
    todo = [k for k in plan.ks if k not in plan.done]
    for i, k in enumerate(todo):
        if stopped():  # a signal while the last K's results were written: they are whole, the next K not begun
            return SweepOutcome(stopped_at=k, done=sorted(done))
        results = plan.results[k]
        try:
            outcome = fit_k(k, results, plan.resumed if k == plan.resume_k else None)
        except BaseException:
            results.discard()
            raise
        if outcome.interrupted_by:
            return SweepOutcome(stopped_at=k, outcome=outcome, done=sorted(done))
        done.append(k)
        s = outcome.summary
        log.log(NOTICE, "K = %d: SSE %.10g, %d iterations, %.2f s (%d of %d)", k, s["inertia"], s["iterations"],
                s["timings"]["total_s"], len(plan.done) + i + 1, len(plan.ks))
    return SweepOutcome(table=finish_sweep(comm, cfg, plan), done=sorted(done))


def sweep_rows(out_dir: str, ks, scores: bool) -> tuple[list, list]:
    """The table of a finished sweep from its K's summary.json files (rank 0).

    Returns
    -------
    columns : list of str
        ``k, sse, iterations``, the scores' names (when computed), ``seconds``.
    rows : list of list
        One per K: int K, float SSE, int iterations, each score (float or
        None), the K's own seconds (``timings.total_s``).
    """
    columns = ["k", "sse", "iterations"] + (list(SCORE_COLUMNS) if scores else []) + ["seconds"]
    rows = []
    for k in ks:
        with open(os.path.join(k_dir(out_dir, k), SUMMARY)) as f:
            s = json.load(f)
        row = [int(k), float(s["inertia"]), int(s["iterations"])]
        if scores:
            row += [s.get("scores", {}).get(name) for name in SCORE_COLUMNS]
        rows.append(row + [float(s["timings"]["total_s"])])
    return columns, rows


def table_csv(columns: list, rows: list) -> bytes:
    """sweep.csv's bytes: a header line, then one line per K; floats at ``repr`` precision, None empty."""
    def field_text(v):
        if v is None:
            return ""
        return repr(float(v)) if isinstance(v, float) else str(v)

    lines = [",".join(columns)] + [",".join(field_text(v) for v in row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def finish_sweep(comm, cfg, plan: SweepPlan) -> dict:
    """Write sweep.csv and sweep.png from every K's results (rank 0 writes; collective).

    With ``--overwrite``, ``k<K>/`` directories of an earlier sweep whose K is
    not in this one are removed (the directory never mixes two sweeps).

    Returns
    -------
    dict
        ``columns``, ``rows`` (see :func:`sweep_rows`), ``knee`` (int or None),
        ``rule``, ``best`` (:func:`best_by_score`), ``plot`` (whether sweep.png
        was written), ``out_dir``.
    """
    def write():
        scores = cfg.scores != "none"
        columns, rows = sweep_rows(plan.out_dir, plan.ks, scores)
        knee = kneedle([r[0] for r in rows], [r[1] for r in rows])
        try:
            write_atomic(os.path.join(plan.out_dir, SWEEP_TABLE), table_csv(columns, rows))
        except OSError as exc:
            raise RunError(f"{plan.out_dir}: cannot write {SWEEP_TABLE}: {exc.strerror}") from None
        best = best_by_score(columns, rows)
        plot = _plot(os.path.join(plan.out_dir, SWEEP_PLOT), columns, rows, knee, best)
        if cfg.overwrite:
            for k in _old_k_dirs(plan.out_dir):
                if k not in plan.ks and _only_results(k_dir(plan.out_dir, k)):
                    shutil.rmtree(k_dir(plan.out_dir, k), ignore_errors=True)
        return {"columns": columns, "rows": rows, "knee": knee, "rule": KNEE_RULE, "best": best, "plot": plot,
                "out_dir": plan.out_dir}

    return comm.from_root(write)


def _only_results(path: str) -> bool:
    try:
        return all(name in RESULT_FILES for name in os.listdir(path))
    except OSError:
        return False


def _plot(path: str, columns: list, rows: list, knee: int | None, best: dict) -> bool:
    """sweep.png: the SSE and each score against K, the knee marked (and each score's best K); False (and a
    warning) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'mpikmeans[plots]'): %s not drawn, %s written",
                    SWEEP_PLOT, SWEEP_TABLE)
        return False
    ks = [r[0] for r in rows]
    panels = [(j, name) for j, name in enumerate(columns) if name not in ("k", "iterations", "seconds")]
    panels = [(j, name) for j, name in panels if any(r[j] is not None for r in rows)]
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(6.4, 1.9 * len(panels) + 0.8), squeeze=False)
    for ax, (j, name) in zip(axes[:, 0], panels):
        pts = [(k, r[j]) for k, r in zip(ks, rows) if r[j] is not None and math.isfinite(r[j])]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3)
        ax.set_ylabel(name.replace("_", " ").replace("silhouette ", "silh. "), fontsize=8)
        ax.grid(alpha=0.3)
        if knee is not None:
            ax.axvline(knee, color="tab:red", linestyle="--", linewidth=1)
        if name in best:
            kb = best[name]
            ax.plot([kb], [next(r[j] for r in rows if r[0] == kb)], marker="o", markersize=7, fillstyle="none",
                    color="tab:green", label=f"best: K = {kb}")
            ax.legend(fontsize=7, loc="best")
    axes[0, 0].set_title(f"K sweep: suggested K = {knee} ({KNEE_RULE})" if knee is not None else
                         "K sweep: no knee of SSE (see sweep.csv)", fontsize=9)
    axes[-1, 0].set_xlabel("K")
    fig.tight_layout()
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp-{os.getpid()}.png")
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise RunError(f"{path}: cannot write: {exc.strerror}") from None
    finally:
        plt.close(fig)
    return True


__all__ = ["KNEE_RULE", "SCORE_BEST", "SCORE_COLUMNS", "SweepOutcome", "SweepPlan", "best_by_score", "finish_sweep",
           "k_dir", "kneedle", "plan_sweep", "run_sweep", "sweep_rows", "table_csv"]
