"""The GPU step policy (:mod:`mpikmeans.backends.gpu.policy`) against the tables of its docstring, the
accumulation's shared-memory budget and integer headroom, and the removed ``tune`` dict.

Nothing here needs a GPU: the policy is pure functions of the shape.  The tables
are parsed from the module's docstring and every row is checked against
:func:`~mpikmeans.backends.gpu.policy.step_kind` and
:func:`~mpikmeans.backends.gpu.policy.step_layout` over a grid of shapes (and of
shared-memory budgets), so a table that no longer says what the code does fails.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
from pathlib import Path

import pytest

pytest.importorskip("numba")

from mpikmeans.backends.gpu import gemmk as G  # noqa: E402
from mpikmeans.backends.gpu import policy as P  # noqa: E402
from mpikmeans.backends.gpu import stepk as S  # noqa: E402
from mpikmeans.fixedsums import VBITS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: shapes the tables are checked on: both tiles, one tile and many, every way the sums take shared memory
KS = (1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 257, 1000, 1024, 2000, 5000, 20000)
MS = (1, 2, 3, 8, 33, 100, 257, 1000, 5000)
#: budgets of shared memory a block (bytes): the default, and smaller ones that reach the other rows sooner
BUDGETS = (P.SMEM_BYTES, 4096, 1024, 256)


# --------------------------------------------------------------------------------------------- the tables

def _tables(doc: str) -> list:
    """The reStructuredText simple tables of ``doc``: each a list of rows, each row a list of cell texts
    (a row's continuation lines joined to it)."""
    lines = doc.splitlines()
    tables, i = [], 0
    while i < len(lines):
        if not re.fullmatch(r"=+( +=+)+", lines[i].strip()):
            i += 1
            continue
        rule = lines[i]
        spans = [(m.start(), m.end()) for m in re.finditer(r"=+", rule)]
        # rule, header, rule, body, rule
        j = i + 1
        while lines[j].strip() != rule.strip():
            j += 1
        body_start = j + 1
        k = body_start
        while lines[k].strip() != rule.strip():
            k += 1
        rows = []
        for line in lines[body_start:k]:
            cells = []
            for c, (a, b) in enumerate(spans):
                end = spans[c + 1][0] if c + 1 < len(spans) else len(line)
                cells.append(line[a:end].strip())
            # a continuation line: its first cell blank, or (a state wrapped in the first column) only its
            # first cell written
            if rows and (not cells[0] or not any(cells[1:])):
                rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells)]
            else:
                rows.append(cells)
        tables.append(rows)
        i = k + 1
    return tables


def _doc_tables() -> tuple:
    tables = _tables(P.__doc__)
    assert len(tables) == 2, "policy's docstring should hold two tables: step_kind's and step_layout's"
    return tables[0], tables[1]


def test_the_docstring_has_both_tables_with_every_row():
    kind_rows, layout_rows = _doc_tables()
    assert len(kind_rows) == 3 and all(len(r) == 3 for r in kind_rows), kind_rows
    assert len(layout_rows) == 8 and all(len(r) == 2 for r in layout_rows), layout_rows


def test_step_kind_table_is_the_function():
    """Each row's state, read as conditions on (sums kept, bounds kept, share of labels the last step
    changed), gives the kind :func:`step_kind` answers for every input that meets them."""
    kind_rows, _ = _doc_tables()
    limit = P.BOUNDED_CHANGED
    inputs = [(s, b, c) for s in (False, True) for b in (False, True) for c in (0.0, limit, limit + 0.01, 1.0)]
    conditions = {
        "no sums kept": lambda s, b, c: not s,
        "sums kept, bounds for the last step's centres, at most a quarter": lambda s, b, c: s and b and c <= limit,
        "sums kept; no bounds": lambda s, b, c: s and (not b or c > limit),
    }
    assert limit == 0.25  # "a quarter" in the table
    covered = []
    for state, kind, _what in kind_rows:
        start = [key for key in conditions if state.startswith(key)]
        assert len(start) == 1, state
        meets = [i for i in inputs if conditions[start[0]](*i)]
        assert meets and all(P.step_kind(*i) == kind.strip("`") for i in meets), (state, kind)
        covered += meets
    assert sorted(covered) == sorted(inputs)  # the rows cover every input once
    assert {P.step_kind(*i) for i in inputs} == {P.FULL, P.DELTA, P.BOUNDED}


def _expr(text: str) -> str:
    """A table's arithmetic (``24 K (M + 2)``, ``ceil(K / TC) * M * TC * 4``) as Python."""
    e = text.strip("` ")
    e = re.sub(r"(\d|\b[KMTC]+\b|\))\s+(?=[A-Za-z(])", r"\1 * ", e)  # implicit products
    return e.replace("ceil", "math.ceil")


def _predicates(rows: list) -> list:
    """One predicate ``f(k, m, tc, smem) -> bool`` per row of the layout table, read from its first cell.

    ``K <= 16``: a comparison; ``E bytes fit``: ``E <= smem``; ``otherwise``: none of the rows before it
    in its group; ``otherwise, while E bytes fit``: that and ``E`` fits; ``larger K``: none of its group.
    A group starts at each row that is none of the last three forms.
    """
    preds, group = [], []

    def bytes_fit(expr):
        code = compile(_expr(expr), expr, "eval")
        return lambda k, m, tc, smem: eval(code, {"math": math}, {"K": k, "M": m, "TC": tc}) <= smem

    for shape, _layout in rows:
        s = shape.strip()
        if s == "otherwise" or s == "larger K":
            before = list(group)
            pred = (lambda before: lambda *a: not any(p(*a) for p in before))(before)
        elif s.startswith("otherwise, while"):
            before = list(group)
            fit = bytes_fit(re.search(r"``(.+?)``", s).group(1))
            pred = (lambda before, fit: lambda *a: not any(p(*a) for p in before) and fit(*a))(before, fit)
        elif s.endswith("bytes fit"):
            group = []
            pred = bytes_fit(re.search(r"``(.+?)``", s).group(1))
        else:
            m_ = re.fullmatch(r"K\s*(<=|<|>=|>)\s*(\d+)", s)
            assert m_, f"a shape the test cannot read: {s!r}"
            group = [] if m_.group(1) in ("<=", "<") else group
            op, bound = m_.group(1), int(m_.group(2))
            pred = (lambda op, bound: lambda k, m, tc, smem: eval(f"{k} {op} {bound}"))(op, bound)
        preds.append(pred)
        group = group + [pred]
    return preds


def _claims(layout_text: str):
    """What a row's layout cell says, as a check on a :class:`~mpikmeans.backends.gpu.policy.StepLayout`."""
    t = layout_text
    if "GEMM screen" in t:
        return "gemm screen", lambda lay, m: lay.screen == P.GEMM
    tile = re.search(r"(\d+) rows x (\d+) centres", t)
    if tile:
        want = (int(tile.group(1)), int(tile.group(2)))
        return "tile", lambda lay, m: lay.tile == want
    # the register screen's staging; the GEMM screen stages its own tiles (no dynamic shared memory)
    if "every centre once" in t:
        return "resident centres", lambda lay, m: lay.screen == P.GEMM or lay.chunk >= lay.ntiles
    if "a chunk of tiles at a time" in t:
        # one tile larger than the budget is a chunk of one (the kernel opts in to it: step_layout's docstring)
        return "staged centres", lambda lay, m: lay.screen == P.GEMM or lay.chunk < lay.ntiles or lay.chunk == 1
    copies = re.search(r"every column, in up to (\d+) copies", t)
    if copies:
        top = int(copies.group(1))
        return "every column", lambda lay, m: lay.jc == m + 1 and 1 <= lay.copies <= top
    if "a chunk of columns per block" in t:
        return "column chunks", lambda lay, m: lay.jc < m + 1 and lay.copies >= 1
    if "global limbs with atomics" in t:
        return "global sums", lambda lay, m: lay.copies == 0
    raise AssertionError(f"a layout the test cannot read: {t!r}")


def _tile_of(rows, k):
    """The tile the table gives ``k`` centres (its ``TC`` feeds the byte counts)."""
    for shape, layout in rows:
        m_ = re.fullmatch(r"K\s*(<=|<|>=|>)\s*(\d+)", shape.strip())
        if m_ and eval(f"{k} {m_.group(1)} {m_.group(2)}"):
            t = re.search(r"(\d+) rows x (\d+) centres", layout)
            return int(t.group(1)), int(t.group(2))
    raise AssertionError(f"no tile row for K = {k}")


def test_step_layout_table_is_the_function(monkeypatch):
    """Over a grid of K, M and budgets: every row whose shape holds says what :func:`step_layout` gives,
    and every row holds somewhere (the grid reaches each case)."""
    _, rows = _doc_tables()
    preds = _predicates(rows)
    claims = [_claims(layout) for _shape, layout in rows]
    hit = [0] * len(rows)
    wrong = []
    for smem in BUDGETS:
        monkeypatch.setattr(P, "SMEM_BYTES", smem)
        for k in KS:
            tc = _tile_of(rows, k)[1]
            for m in MS:
                lay = P.step_layout(k, m)
                for r, (pred, (name, check)) in enumerate(zip(preds, claims)):
                    if pred(k, m, tc, smem):
                        hit[r] += 1
                        if not check(lay, m):
                            wrong.append((rows[r][0], name, k, m, smem, lay))
    assert not wrong, "the table says otherwise than step_layout:\n" + "\n".join(map(str, wrong[:10]))
    assert all(hit), [rows[r][0] for r, h in enumerate(hit) if not h]


def test_the_gemm_screen_takes_the_shapes_its_row_names_and_no_other():
    """The table's ``K > N`` row of the GEMM screen names :data:`GEMM_MIN_K`; fewer centres take the register
    screen (the table test checks the rows that hold; this checks the row that does not)."""
    _, rows = _doc_tables()
    (shape,) = [shape for shape, layout in rows if "GEMM screen" in layout]
    assert re.fullmatch(r"K > (\d+)", shape.strip()).group(1) == str(P.GEMM_MIN_K)
    for k in KS:
        for m in MS:
            lay = P.step_layout(k, m)
            assert (lay.screen == P.GEMM) == (k > P.GEMM_MIN_K), (k, m, lay)
            assert lay.screen_threads == (G.NT if lay.screen == P.GEMM else S.NT)


def test_the_tables_tiles_are_the_kernels_tiles():
    """The table's two tiles are the compiled ones (:data:`.stepk.SCREEN_TILES`), small first."""
    _, rows = _doc_tables()
    assert (_tile_of(rows, 1), _tile_of(rows, 10_000)) == tuple(S.SCREEN_TILES)


def test_each_shape_takes_one_row_of_each_group(monkeypatch):
    """The rows partition the shapes: one tile, one way of staging the centres, one way of summing."""
    _, rows = _doc_tables()
    preds = _predicates(rows)
    claims = [_claims(layout)[0] for _shape, layout in rows]
    groups = {"tile": ("tile",), "centres": ("resident centres", "staged centres"),
              "sums": ("every column", "column chunks", "global sums")}
    for smem in BUDGETS:
        monkeypatch.setattr(P, "SMEM_BYTES", smem)
        for k in KS:
            tc = _tile_of(rows, k)[1]
            for m in MS:
                true = [claims[r] for r, p in enumerate(preds) if p(k, m, tc, smem)]
                for group, names in groups.items():
                    assert sum(name in names for name in true) == 1, (group, k, m, smem, true)


# --------------------------------------------------------------------------------------------- budgets

@pytest.mark.parametrize("smem", BUDGETS + (48 * 1024 + 4, 100 * 1024, 227 * 1024))
def test_sum_layout_never_exceeds_its_budget(smem):
    for k in KS:
        for m in MS:
            jc, copies = S.sum_layout(k, m, smem)
            assert 1 <= jc <= m + 1 and 0 <= copies <= 8, (k, m, smem, jc, copies)
            # the kernel's static shared memory counts too: a launch of 48 KB dynamic beside it is refused
            assert S.sum_shared_bytes(k, jc, copies) + S.SUM_STATIC_BYTES <= smem, (k, m, smem, jc, copies)
            room = smem - S.SUM_STATIC_BYTES
            if copies == 0:  # global sums only where one column and the SSE do not fit
                assert 4 * S.SMEM_LIMBS * k * 2 > room, (k, m, smem)
            elif jc < m + 1:  # a chunk of columns only where every column does not fit
                assert S.sum_shared_bytes(k, m + 1, 1) > room and copies == 1, (k, m, smem)


def test_step_layout_shared_memory_stays_in_the_budget(monkeypatch):
    for smem in BUDGETS:
        monkeypatch.setattr(P, "SMEM_BYTES", smem)
        for k in KS:
            for m in MS:
                lay = P.step_layout(k, m)
                assert lay.sum_smem == S.sum_shared_bytes(k, lay.jc, lay.copies) <= smem - S.SUM_STATIC_BYTES, \
                    (k, m, smem, lay)
                tile_bytes = m * lay.tile[1] * 4
                # the register screen takes one tile at least (the kernel opts in past the default where that
                # is more); the GEMM screen's shared memory is static
                want = 0 if lay.screen == P.GEMM else lay.chunk * tile_bytes
                assert lay.screen_smem == want <= max(smem, tile_bytes), (k, m, smem, lay)
                assert lay.ntiles * lay.tile[1] >= k > (lay.ntiles - 1) * lay.tile[1]
                assert 1 <= lay.chunk <= lay.ntiles


def test_the_sums_of_k_32_and_64_on_100_attributes_fit_beside_the_static_counter():
    # their columns filled exactly 48 KB of dynamic shared memory: the launch beside the kernel's static
    # counter failed on the H200 (CUDA_ERROR_INVALID_VALUE, K = 32 of the K sweep)
    for k in (32, 64):
        lay = P.step_layout(k, 100)
        assert lay.sum_smem + S.SUM_STATIC_BYTES <= 48 * 1024, lay


def test_the_default_budget_needs_no_opt_in():
    """48 KB a block: the limit a kernel gets without opting in, so two blocks share a multiprocessor."""
    assert P.SMEM_BYTES == 48 * 1024


@pytest.mark.parametrize("n", [1, 2047, 2048, 2049, 10**6, 5 * 10**7])
def test_the_grids_cover_every_row_and_column(n):
    for k, m in ((8, 3), (100, 100), (5000, 257), (1000, 1000)):
        lay = P.step_layout(k, m)
        gx, gy = lay.sum_grid(n, m)
        assert (gx - 1) * S.SUM_ROWS < n <= gx * S.SUM_ROWS
        assert (gy - 1) * lay.jc < m + 1 <= gy * lay.jc
        blocks = lay.screen_grid(n, 132)
        rows_a_block = G.BM if lay.screen == P.GEMM else S.NT * lay.tile[0]
        assert 1 <= blocks <= max(1, -(-n // rows_a_block)) and blocks <= 8 * 132


def test_int32_limb_headroom():
    """A block adds at most SUM_ROWS limbs into one int32 shared entry (a row adds to an entry once, with
    either sign), each limb at most ``2**20 - 1`` in magnitude: the sum stays within int32.  Six 20-bit
    limbs hold a value's two integers.  (``SUM_ROWS * 2**20`` is ``2**31`` itself: the bound holds because a
    limb is below ``2**20``.)"""
    assert S.SUM_ROWS * (2**20 - 1) <= 2**31 - 1
    assert S._L20 == 2**20 - 1 and S.SMEM_LIMBS == 6
    assert 3 * 20 >= VBITS + 1  # h (|h| <= 2**VBITS, signed) and l (< 2**VBITS) in three limbs each


# --------------------------------------------------------------------------------------------- the removed tune dict

#: The keys of the GPU backend's ``tune`` dict before it was removed (the baseline's
#: ``GPUBackend`` docstring, ``plan.choose_plan`` and ``launches``): none may be left.
REMOVED_TUNE_KEYS = ("JC", "NT", "R", "TC", "blocks", "bounds", "bounds_rpt", "centre_groups", "centres_shared",
                     "delta", "diag_skip_pass2", "gemm", "graph", "idx64", "launch", "lineinfo", "maxreg", "profile",
                     "rc_blocks", "rc_threads", "rowmajor", "smem_budget", "split", "sum_mode", "sums_assign",
                     "sums_centres", "sums_group_rows", "sums_maxreg", "sums_stage_bytes", "sums_wb", "tf32",
                     "tf32_cascade")
#: keys that are ordinary words or names elsewhere (``NT`` is still a block size, ``delta`` a step kind):
#: found only as keys (``"delta":``, ``["delta"]``, ``.get("delta"``); the others anywhere as words
_COMMON = ("JC", "NT", "R", "TC", "blocks", "bounds", "delta", "gemm", "graph", "launch", "profile", "split",
           "tf32")
_WORDS = re.compile(r"\b(" + "|".join(k for k in REMOVED_TUNE_KEYS if k not in _COMMON) + r")\b")
_KEYS = re.compile(r"""(["'])(%(k)s)\1\s*:|\[\s*(["'])(%(k)s)\3\s*\]|\.get\(\s*(["'])(%(k)s)\5"""
                   % {"k": "|".join(_COMMON)})
#: the dict itself: ``tune=``, ``tune[...]``, ``tune.get``, ``"tune"``, ``--tune``, ``gpu_warm_tune``
_TUNE = re.compile(r"""\btune\s*(=|\[|\.\w+\(|:\s*dict)|(["'])tune\2|--tune\b|\w_tune\b""")
#: where the keys must be gone (the issue: code and docs)
PLACES = ("mpikmeans", "README.md", "docs", "BENCHMARKS.md", "bench/GPU_NOTES.md")
_TEXT = (".py", ".md", ".rst", ".txt", ".yaml", ".yml", ".toml", ".cfg", ".json", ".sh", ".pbs", ".sbatch")


def _files(place: str) -> list:
    path = ROOT / place
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _TEXT and "__pycache__" not in p.parts)


#: in Python, the name alone (a parameter or variable called ``tune``); prose may say "tune" as a verb
_TUNE_NAME = re.compile(r"\btune\b")


def tune_mention(line: str, python: bool):
    """The text in ``line`` that names the tune dict or one of its removed keys, or None."""
    m = _TUNE.search(line) or _WORDS.search(line) or _KEYS.search(line) or (python and _TUNE_NAME.search(line))
    return m.group(0) if m else None


def tune_mentions(path: Path) -> list:
    """``path:line: text`` of every line of ``path`` that names the tune dict or one of its removed keys."""
    found = []
    for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        hit = tune_mention(line, path.suffix == ".py")
        if hit:
            found.append(f"{path.relative_to(ROOT)}:{i}: {hit!r} in {line.strip()[:140]}")
    return found


def test_the_scanner_finds_what_it_should():
    """The scanner can fail: it finds each form the dict and its keys were written in, not the words alone."""
    cases = [
        ('be = GPUBackend(tune={"split": True})', False, True),
        ("plan = choose_plan(k, m, tune)", True, True),
        ("plan = choose_plan(k, m, tune)", False, False),
        ("tune.get('bounds', 'auto')", False, True),
        ('NT = int(tune.get("NT", 256))', True, True),
        ('`{"maxreg": 168, "blocks": 3}`', False, True),
        ('BENCH_VARIANTS=\'{"A":[{},{"R":1}]}\'', False, True),
        ("the rows by `ldc32`/`ldc64` (`idx64` forces the 64-bit form)", False, True),
        ("a `diag_skip_pass2` switch", False, True),
        ("warmup.gpu_warm_tune gives it the run's plan", False, True),
        ("--variants '[{}, {\"delta\": \"never\"}]'", False, True),
        ("a delta step adds only what moved; NT threads a block; the split of the rows; R rows", True, False),
        ("kind = DELTA if sums_kept else FULL; lay = step_layout(k, m)", True, False),
        ("no knob to fine-tune the kernels", False, False),
        ('"--tune" is gone', False, True),
    ]
    for text, python, want in cases:
        assert bool(tune_mention(text, python)) == want, text


@pytest.mark.parametrize("place", PLACES)
def test_no_removed_tune_key_is_left(place):
    files = _files(place)
    assert files, f"{place}: nothing to read"
    found = [hit for f in files for hit in tune_mentions(f)]
    assert not found, f"{len(found)} mention(s) of the removed tune dict:\n" + "\n".join(found[:40])


def test_the_gpu_backend_takes_no_tune_and_the_removed_modules_are_gone():
    from mpikmeans.backends.gpu import GPUBackend

    assert "tune" not in inspect.signature(GPUBackend).parameters
    gone = ("plan", "kernels", "gemm", "gemmcentres", "tensor", "sums", "bylabel", "bounds", "recheck", "kept",
            "launches", "initpasses")
    gpu = ROOT / "mpikmeans" / "backends" / "gpu"
    assert not [g for g in gone if (gpu / f"{g}.py").exists()]
    # and nothing imports them
    for f in gpu.glob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level and node.module in gone:
                pytest.fail(f"{f.name} imports .{node.module}")
