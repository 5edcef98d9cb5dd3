"""Plots of the benchmark sweeps (matplotlib, the ``plots`` extra).

One figure per question the specification asks (§5.7, appendix 3): compute time
against processes, rows N, attributes M and clusters K, each with the CPU and GPU
series and the tools a user would pick instead on the same axes; and read time
against processes.  Sizes that span decades get log axes; the process sweeps get
an ideal-scaling line from the one-process point; error bars span the repeats'
minimum and maximum around the median; a caption names the machine, dtype and sizes.
"""

from __future__ import annotations

import json
import os

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
