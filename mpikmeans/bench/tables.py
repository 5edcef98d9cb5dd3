"""The readable tables of a ``bench runs`` result (:mod:`mpikmeans.bench.runs`), printed and written beside it."""

from __future__ import annotations


def seconds(v, digits: int = 2) -> str:
    """A figure in seconds as text ("-" for None)."""
    return "-" if v is None else f"{v:.{digits}f}"


def milliseconds(v) -> str:
    """A figure in seconds as text in milliseconds ("-" for None)."""
    return "-" if v is None else f"{1e3 * v:.1f}"


#: The matrix table's figure columns: (heading, width, the row's text).
MATRIX_COLUMNS = (
    ("iter", 5, lambda r: str(r["iterations"])),
    ("command", 9, lambda r: seconds(r["wall_s"])),
    ("total", 8, lambda r: seconds(r["timings"]["total_s"])),
    ("start", 7, lambda r: seconds(r["timings"]["startup_s"])),
    ("read", 7, lambda r: seconds(r["timings"]["read_s"])),
    ("setup", 7, lambda r: seconds(r["timings"]["setup_s"])),
    ("init", 7, lambda r: seconds(r["timings"]["init_s"])),
    ("comp", 8, lambda r: seconds(r["timings"]["compute_s"], 3)),
    ("scores", 7, lambda r: seconds(r["timings"].get("scores_s"))),
    ("write", 7, lambda r: seconds(r["timings"]["write_s"])),
    ("compile", 8, lambda r: seconds(r.get("compile_s"))),
    ("helpers", 8, lambda r: seconds(r["background_compile_s"])),
    ("it med", 8, lambda r: milliseconds(r["iteration_median_s"])),
    ("it max", 8, lambda r: milliseconds(r["iteration_slowest_s"])),
    ("@", 4, lambda r: str(r["iteration_slowest"] or "-")),
)


def matrix_table(doc: dict) -> list:
    """The matrix's rows as lines of text: phases in seconds, iterations in milliseconds, scikit-learn beside."""
    wide = max([6] + [len(r["shape"]) + 1 for r in doc["rows"]])
    lines = ["seconds (helpers: a cold run's background compiles, summed); iterations in ms (it med, it max: "
             "the median and the slowest, @: which)",
             f"{'shape':<{wide}}{'backend':<8}{'dtype':<8}{'init':<10}{'cache':<6}"
             + "".join(f"{head:>{width}}" for head, width, _ in MATRIX_COLUMNS)]
    for r in doc["rows"]:
        left = f"{r['shape']:<{wide}}{r['backend_asked']:<8}{r['dtype_asked']:<8}{r['init']:<10}{r['cache']:<6}"
        if "error" in r:
            lines.append(left + "  FAILED: " + r["error"].splitlines()[0])
        else:
            lines.append(left + "".join(f"{text(r):>{width}}" for _, width, text in MATRIX_COLUMNS))
    for name, shape in doc["shapes"].items():
        line = f"{name}: {shape['n']:,} x {shape['m']}, K = {shape['k']}"
        for what, label in (("default", f"KMeans({shape['k']}).fit"),
                            ("same_init_sample", "from the rows of --init sample (lloyd, n_init=1, tol=0)")):
            fit = (shape.get("sklearn") or {}).get(what)
            if fit is not None:
                line += f"; scikit-learn {label}: " + (fit["error"] if "error" in fit else
                                                       f"{fit['fit_s']:.2f} s ({fit['iterations']} iterations)")
        lines.append(line)
    w = doc.get("warmup") or {}
    if w.get("ran"):
        lines.append(f"warm cache prepared by `{w['command']}`: {w['seconds']:.1f} s")
    elif "error" in w:
        lines.append(f"`{w['command']}` FAILED: {w['error'].splitlines()[-1]}")
    lines.append("compile: " + "; ".join(sorted({r["compile_source"] for r in doc["rows"] if "compile_source" in r})))
    return lines


def sweep_table(doc: dict) -> list:
    """The sweep's runs as lines of text, the totals, and scikit-learn's estimate with how it was made."""
    lines = [f"{'K':>4}{'iter':>6}{'command s':>11}{'total s':>9}{'setup s':>9}{'compute s':>11}{'it max ms':>11}"]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"{r['k']:>4}  FAILED: {r['error'].splitlines()[0]}")
            continue
        t = r["timings"]
        lines.append(f"{r['k']:>4}{r['iterations']:>6}{seconds(r['wall_s']):>11}{seconds(t['total_s']):>9}"
                     f"{seconds(t['setup_s']):>9}{seconds(t['compute_s'], 3):>11}"
                     f"{milliseconds(r['iteration_slowest_s']):>11}")
    shape = doc.get("shape") or {}
    lines.append(f"{len(doc['rows'])} runs on {shape.get('n', 0):,} x {shape.get('m', 0)}: whole commands "
                 f"{doc.get('total_wall_s', 0):.1f} s, their total_s {doc.get('total_run_s', 0):.1f} s")
    one = doc.get("one_job") or {}
    if "error" in one:
        lines.append(f"K = all in one job: FAILED: {one['error'].splitlines()[0]}")
    elif one:
        t, ps = one["first"]["timings"], one["phase_sums"]
        lines.append(f"the same K in one job ({one['command']}): whole command {one['wall_s']:.1f} s; start "
                     f"{seconds(t['startup_s'])}, read {seconds(t['read_s'])}, setup {seconds(t['setup_s'])} once; "
                     f"over the K: init {ps['init_s']:.1f} s, compute {ps['compute_s']:.1f} s, scores "
                     f"{ps['scores_s']:.1f} s, write {ps['write_s']:.1f} s")
    sk = doc.get("sklearn") or {}
    if sk.get("total_fit_s") is not None:
        lines.append(f"scikit-learn KMeans(K).fit over the same K: {sk['total_fit_s']:.1f} s "
                     f"({'extrapolated' if sk['extrapolated'] else 'measured'}: {sk['how']})")
    return lines
