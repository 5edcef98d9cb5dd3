"""Plots of the benchmark sweeps (matplotlib, the ``plots`` extra).

One figure per question the specification asks (§5.7, appendix 3): compute time
against processes, rows N, attributes M and clusters K, each with the CPU and GPU
series and the tools a user would pick instead on the same axes; and read time
against processes.  Sizes that span decades get log axes; the process sweeps get
an ideal-scaling line from the one-process point; error bars span the repeats'
minimum and maximum around the median; a caption names the machine, dtype and sizes.
A ``bench runs`` result is drawn as each run's phases side by side, or its K
sweep's seconds against K beside scikit-learn's (:func:`plot_runs`).
"""

from __future__ import annotations

import json
import os

from ..errors import UsageError
from .harness import read_result
from .sweeps import SWEEPS, read_csv

#: Colour and marker per series, the same in every figure.
STYLE = {
    "mpikmeans cpu": ("tab:blue", "o", "-"),
    "scikit-learn": ("tab:cyan", "s", ":"),
    "mpikmeans gpu": ("tab:red", "D", "-"),
    "PyTorch (cuBLAS)": ("tab:orange", "^", ":"),
}

XLABEL = {"ranks": "MPI processes", "n": "rows N", "m": "attributes M", "k": "clusters K"}


def _series(rows: list, name: str, x: str) -> tuple[list, list, list, list]:
    pts = sorted((r[x], r["ms_per_iter"], r["ms_per_iter_min"], r["ms_per_iter_max"])
                 for r in rows if r["series"] == name)
    return [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts], [p[3] for p in pts]


def _label(name: str, rows: list, sweep: str) -> str:
    if sweep != "procs":
        if name == "mpikmeans cpu":
            thr = next((r["threads"] for r in rows if r["series"] == name), None)
            return f"mpikmeans CPU (1 rank, {thr} threads)" if thr else "mpikmeans CPU"
        if name == "scikit-learn":
            thr = next((r["threads"] for r in rows if r["series"] == name), None)
            return f"scikit-learn Lloyd ({thr} threads)" if thr else "scikit-learn Lloyd"
        return {"mpikmeans gpu": "mpikmeans GPU (1 GPU)", "PyTorch (cuBLAS)": "PyTorch GEMM form (1 GPU)"}[name]
    return {"mpikmeans cpu": "mpikmeans CPU (1 thread per rank)",
            "scikit-learn": "scikit-learn Lloyd (threads = processes)",
            "mpikmeans gpu": "mpikmeans GPU (1 GPU per rank)",
            "PyTorch (cuBLAS)": "PyTorch GEMM form (1 GPU)"}[name]


def caption(meta: dict, rows: list, sweep: str) -> str:
    """The figure's caption: machine, dtype, fixed sizes, iterations, repeats, command."""
    mach = meta.get("machine", {})
    gpus = mach.get("gpus") or []
    gpu = f", {len(gpus)}× {gpus[0]}" if gpus else ", no GPU"
    settings = meta.get("settings", {})
    spec = meta.get("sweeps", {}).get(sweep, {})
    fixed = ", ".join(f"{p.upper()} = {spec[p]:,}" for p in ("n", "m", "k") if spec.get(p))
    dtypes = sorted({r["dtype"] for r in rows if r["backend"] == "gpu"})
    dt = f"GPU data {'/'.join(dtypes)}, sums float64; CPU float64" if dtypes else "float64"
    return (f"{mach.get('host', '?')}: {mach.get('cores', '?')} cores{gpu}. {fixed}; {dt}; "
            f"{settings.get('iterations', '?')} Lloyd iterations from the same centres, median of "
            f"{settings.get('repeats', '?')} runs (bars: min–max). {meta.get('date', '')}\n"
            f"$ {meta.get('command', '')}")


def _finish(fig, ax, meta, rows, sweep, path_stem) -> list:
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.005, caption(meta, rows, sweep), fontsize=6.5, va="bottom", ha="left", wrap=True)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    out = []
    for ext in ("png", "svg"):
        fig.savefig(f"{path_stem}.{ext}", dpi=130)
        out.append(f"{path_stem}.{ext}")
    return out


def _time_axis(ax, plt, rows, sweep, x):
    for name in STYLE:
        xs, ys, lo, hi = _series(rows, name, x)
        if not xs:
            continue
        colour, marker, line = STYLE[name]
        err = [[y - a for y, a in zip(ys, lo)], [b - y for y, b in zip(ys, hi)]]
        ax.errorbar(xs, ys, yerr=err, color=colour, marker=marker, linestyle=line, capsize=3,
                    label=_label(name, rows, sweep))
        if sweep == "procs" and name.startswith("mpikmeans") and len(xs) > 1 and xs[0] == 1:
            ax.plot(xs, [ys[0] / p for p in xs], color=colour, linestyle="--", linewidth=0.8, alpha=0.7,
                    label=f"ideal ({name.split()[1].upper()})")
    ax.set_xscale("log", base=2 if sweep == "procs" else 10)
    ax.set_yscale("log")
    ax.set_xlabel(XLABEL[x])
    ax.set_ylabel("milliseconds per Lloyd iteration")


def plot_sweep(rows: list, meta: dict, sweep: str, out_dir: str) -> list:
    """Draw one sweep's figures as PNG and SVG.

    Parameters
    ----------
    rows : list of dict
        The sweep's CSV rows (:func:`mpikmeans.bench.sweeps.read_csv`).
    meta : dict
        ``meta.json`` of the run (machine, settings, command).
    sweep : str
        One of :data:`mpikmeans.bench.sweeps.SWEEPS`.
    out_dir : str

    Returns
    -------
    list of str
        Files written.
    """
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text in the SVGs: searchable, smaller
    import matplotlib.pyplot as plt

    written = []
    x = "ranks" if sweep == "procs" else sweep
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    _time_axis(ax, plt, rows, sweep, x)
    title = {"procs": "Compute time against MPI processes", "n": "Compute time against rows N",
             "m": "Compute time against attributes M", "k": "Compute time against clusters K"}[sweep]
    ax.set_title(title)
    ints = sorted({r[x] for r in rows})
    if sweep == "procs":
        ax.set_xticks(ints, [str(v) for v in ints])
    written += _finish(fig, ax, meta, rows, sweep, os.path.join(out_dir, f"{sweep}_compute" if sweep == "procs"
                                                                else sweep))
    plt.close(fig)

    if sweep == "procs":
        fig, ax = plt.subplots(figsize=(7.5, 5.2))
        for name in ("mpikmeans cpu", "mpikmeans gpu"):
            pts = sorted((r["ranks"], r["read_s"], r["read_s_min"], r["read_s_max"], r["read_MB_per_s"])
                         for r in rows if r["series"] == name and r["read_s"] is not None)
            if not pts:
                continue
            colour, marker, _ = STYLE[name]
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            threads = "1 thread per rank" if name == "mpikmeans cpu" else "cores / ranks threads"
            ax.errorbar(xs, ys, yerr=err, color=colour, marker=marker, capsize=3,
                        label=f"read, {name.split()[1].upper()} runs ({threads})")
            if xs[0] == 1 and len(xs) > 1:
                ax.plot(xs, [ys[0] / p for p in xs], color=colour, linestyle="--", linewidth=0.8, alpha=0.7,
                        label="ideal")
            for p in pts:
                ax.annotate(f"{p[4]:.0f} MB/s", (p[0], p[1]), textcoords="offset points", xytext=(4, 6), fontsize=7,
                            color=colour)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ints, [str(v) for v in ints])
        ax.set_xlabel(XLABEL["ranks"])
        ax.set_ylabel("seconds to read and parse the ARFF file")
        size = next((r["read_MB_per_s"] * r["read_s"] for r in rows if r["read_s"]), 0)
        ax.set_title(f"Read time against MPI processes ({size:,.0f} MB of ARFF text)")
        written += _finish(fig, ax, meta, rows, sweep, os.path.join(out_dir, "procs_read"))
        plt.close(fig)
    return written


def plot_all(out_dir: str) -> list:
    """Draw every sweep found in ``out_dir`` (its CSVs and ``meta.json``).

    Returns
    -------
    list of str
        Files written.
    """
    with open(os.path.join(out_dir, "meta.json")) as f:
        meta = json.load(f)
    written = []
    for sweep in SWEEPS:
        path = os.path.join(out_dir, f"{sweep}.csv")
        if os.path.exists(path):
            written += plot_sweep(read_csv(path), meta, sweep, out_dir)
    return written


#: The phases of a run drawn side by side, with their colours (``bench runs``).
RUN_PHASES = (("startup_s", "start-up", "tab:gray"), ("read_s", "read", "tab:green"),
              ("setup_s", "set-up", "tab:purple"), ("init_s", "init", "tab:orange"),
              ("compute_s", "compute", "tab:red"), ("write_s", "write", "tab:brown"))


def _runs_caption(doc: dict) -> str:
    mach = doc.get("machine", {})
    gpus = mach.get("gpus") or []
    gpu = f", {len(gpus)}× {gpus[0]}" if gpus else ", no GPU"
    return (f"{mach.get('host', '?')}: {mach.get('cores', '?')} cores{gpu}. {doc.get('date', '')}, "
            f"commit {doc.get('commit', '?')}\n$ {doc.get('command', '')}")


def plot_runs(path: str) -> list:
    """Draw a ``bench runs`` result (PNG and SVG beside it): each run's phases, or the K sweep.

    Parameters
    ----------
    path : str
        The JSON result of ``mpikmeans bench runs`` (with or without ``--sweep``).

    Returns
    -------
    list of str
        Files written.

    Raises
    ------
    UsageError
        The file is not a ``bench runs`` result.
    """
    doc = read_result(path)
    if doc.get("bench") not in ("runs", "runs-sweep"):
        raise UsageError(f"{path}: not a result of `mpikmeans bench runs` (bench: {doc.get('bench')!r})")
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if "error" not in r]
    stem = os.path.splitext(path)[0]
    if doc["bench"] == "runs-sweep":
        fig, ax = plt.subplots(figsize=(7.5, 5.2))
        ks = [r["k"] for r in rows]
        ax.plot(ks, [r["wall_s"] for r in rows], "o-", color=STYLE["mpikmeans gpu"][0] if doc["settings"]
                ["backends"][0] == "gpu" else STYLE["mpikmeans cpu"][0], label="mpikmeans run, whole command")
        ax.plot(ks, [r["timings"]["total_s"] for r in rows], ".:", color="tab:gray", label="its total_s")
        fits = {int(k): f["fit_s"] for k, f in (doc.get("sklearn") or {}).get("fits", {}).items() if "fit_s" in f}
        if fits:
            xs = sorted(fits)
            ax.plot(xs, [fits[k] for k in xs], "s--", color=STYLE["scikit-learn"][0],
                    label="scikit-learn KMeans(K).fit" + (" (measured here; linear between)" if len(xs) < len(ks)
                                                          else ""))
        ax.set_xlabel("clusters K")
        ax.set_ylabel("seconds")
        ax.set_yscale("log")
        shape = doc.get("shape") or {}
        ax.set_title(f"One run per K on {shape.get('n', 0):,} x {shape.get('m', 0)}: "
                     f"{doc.get('total_wall_s', 0):.0f} s in all")
    else:
        fig, ax = plt.subplots(figsize=(10, 2.4 + 0.28 * len(rows)))
        labels = [f"{r['shape']} {r['backend_asked']} {r['dtype_asked']} {r['init']} {r['cache']}" for r in rows]
        left = [0.0] * len(rows)
        for key, name, colour in RUN_PHASES:
            widths = [r["timings"].get(key) or 0.0 for r in rows]
            ax.barh(range(len(rows)), widths, left=left, color=colour, label=name)
            left = [a + b for a, b in zip(left, widths)]
        ax.plot([r["wall_s"] for r in rows], range(len(rows)), "k|", markersize=12, label="whole command")
        sk = [((doc["shapes"].get(r["shape"], {}).get("sklearn") or {}).get("default") or {}).get("fit_s")
              for r in rows]
        ax.plot([v if v is not None else float("nan") for v in sk], range(len(rows)), "D", color="tab:cyan",
                label="scikit-learn KMeans(K).fit")
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("seconds (phases stacked; log scale)")
        ax.set_title("Whole runs, phase by phase")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.text(0.01, 0.005, _runs_caption(doc), fontsize=6.5, va="bottom", ha="left", wrap=True)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    out = []
    for ext in ("png", "svg"):
        fig.savefig(f"{stem}.{ext}", dpi=130)
        out.append(f"{stem}.{ext}")
    plt.close(fig)
    return out
