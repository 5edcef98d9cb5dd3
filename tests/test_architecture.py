"""docs/architecture.md is true of the code: its arrows are the real imports; one module decides input formats."""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from test_layout import MODULES, PACKAGE, _cycles, _rel, _tree, import_graph  # noqa: E402

DOC = PACKAGE.parent / "docs" / "architecture.md"
ROOT = PACKAGE.name


def _block(text: str, kind: str) -> list:
    """The non-blank lines of the fenced block ```kind in ``text``."""
    found = re.search(rf"^```{kind}\n(.*?)^```", text, re.S | re.M)
    assert found, f"no ```{kind} block in {DOC}"
    return [line.strip() for line in found.group(1).splitlines() if line.strip()]


def groups_of(text: str) -> dict:
    """Group -> the modules and packages it names (a package stands for its submodules; the root package
    for its ``__init__.py`` alone)."""
    out = {}
    for line in _block(text, "groups"):
        name, *members = line.split()
        assert name not in out, f"group {name} named twice"
        out[name] = members
    return out


def arrows_of(text: str) -> set:
    """The drawn arrows ``(a, b)``: a line ``a -> b, c`` draws ``a -> b`` and ``a -> c``."""
    out = set()
    for line in _block(text, "arrows"):
        left, right = (part.strip() for part in line.split("->"))
        out |= {(left, b.strip()) for b in right.split(",") if b.strip()}
    return out


def group_of(module: str, groups: dict) -> str | None:
    """The group naming ``module`` or its nearest package; None where none does."""
    best, length = None, -1
    for name, members in groups.items():
        for p in members:
            hit = module == p or (p != ROOT and module.startswith(p + "."))
            if hit and len(p) > length:
                best, length = name, len(p)
    return best


def real_arrows(groups: dict, graph: dict, helpers: str = "helpers") -> set:
    """The imports between two groups, neither of them the helpers, as group arrows."""
    out = set()
    for a, targets in graph.items():
        ga = group_of(a, groups)
        for b in targets:
            gb = group_of(b, groups)
            if ga and gb and ga != gb and helpers not in (ga, gb):
                out.add((ga, gb))
    return out


def arrow_errors(text: str, graph: dict) -> list:
    """What the document's picture gets wrong about ``graph`` (module -> the modules it imports)."""
    groups = groups_of(text)
    drawn, real = arrows_of(text), real_arrows(groups, graph)
    errors = [f"module {m} is in no group" for m in sorted(graph) if group_of(m, groups) is None]
    errors += [f"arrow of an unknown group: {a} -> {b}" for a, b in sorted(drawn) if {a, b} - set(groups)]
    errors += [f"drawn, but no module of {a} imports {b}: {a} -> {b}" for a, b in sorted(drawn - real)]
    errors += [f"imported, but not drawn: {a} -> {b}" for a, b in sorted(real - drawn)]
    return errors


def test_the_documents_arrows_are_the_real_imports():
    errors = arrow_errors(DOC.read_text(encoding="utf-8"), import_graph())
    assert not errors, "docs/architecture.md is out of date:\n" + "\n".join(errors)


def test_the_drawn_arrows_point_one_way():
    graph = {}
    for a, b in arrows_of(DOC.read_text(encoding="utf-8")):
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    assert _cycles(graph) == []


def test_a_wrong_or_missing_arrow_or_an_unplaced_module_is_caught():
    text = DOC.read_text(encoding="utf-8")
    graph = import_graph()
    assert arrow_errors(text, graph) == []
    wrong = text.replace("\nlloyd -> fixedsums\n", "\nlloyd -> fixedsums, comm\n", 1)
    assert arrow_errors(wrong, graph) == ["drawn, but no module of lloyd imports comm: lloyd -> comm"]
    missing = text.replace("\nscores -> fixedsums\n", "\n", 1)
    assert arrow_errors(missing, graph) == ["imported, but not drawn: scores -> fixedsums"]
    extra = {**graph, "mpikmeans.newthing": {"mpikmeans.comm"}}
    assert arrow_errors(text, extra) == ["module mpikmeans.newthing is in no group"]
    # an import inside a function counts: a backend module that imported comm would need an arrow
    sneaky = {**graph, "mpikmeans.backends.base": graph["mpikmeans.backends.base"] | {"mpikmeans.comm"}}
    assert arrow_errors(text, sneaky) == ["imported, but not drawn: backends -> comm"]


# ----------------------------------------------------------------------------- input formats

#: Names of data files whose format a check on the name would decide: inputs, their binary copies and
#: sidecars, compressed files, models.
EXTENSIONS = {".arff", ".csv", ".tsv", ".tab", ".txt", ".npy", ".npz", ".json",
              ".gz", ".bz2", ".xz", ".zst", ".lz4", ".zip", ".7z"}

#: The one module that decides a file's format from its name or content.
REGISTRY = "mpikmeans/io/formats.py"

#: Extension checks owned elsewhere, to be moved (into io.formats, or to the content's own test):
#: file -> why it is still here.
OWNED_ELSEWHERE: dict = {}


def _extension_constants(node: ast.AST) -> list:
    """The extension-like string constants of ``node`` (a constant, or a tuple, list or set of them)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)
            and i.value.lower() in EXTENSIONS]


def extension_checks(tree: ast.AST) -> list:
    """``(line, extension)`` of every test of a name's extension: ``name.endswith(".csv")``,
    ``ext == ".arff"``, ``ext in (".tsv", ".tab")``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "endswith":
            found += [(node.lineno, e) for arg in node.args for e in _extension_constants(arg)]
        elif isinstance(node, ast.Compare):
            found += [(node.lineno, e) for side in [node.left, *node.comparators] for e in _extension_constants(side)]
    return found


def test_the_extension_check_finder_finds_checks():
    code = ("a = p.lower().endswith('.csv')\nb = ext == '.arff'\nc = low.endswith(('.tsv', '.tab'))\n"
            "d = s in {'.npy', '.npz'}\n"
            "e = f.endswith('.py')\nf = os.path.splitext(p)[0] + '.json'\ng = '.csv'\n")
    assert sorted(extension_checks(ast.parse(code))) == [(1, ".csv"), (2, ".arff"), (3, ".tab"), (3, ".tsv"),
                                                         (4, ".npy"), (4, ".npz")]


def test_no_extension_check_outside_the_formats_registry():
    """io/formats.py decides what a file is; every other module asks it (``formats.detect(path).name``,
    ``header.format``, ``formats.text_output``)."""
    found = {}
    for path in MODULES:
        rel = _rel(path)
        if rel == REGISTRY:
            continue
        checks = extension_checks(_tree(path))
        if checks:
            found[rel] = checks
    unexpected = {f: c for f, c in found.items() if f not in OWNED_ELSEWHERE}
    assert not unexpected, f"extension checks outside {REGISTRY} (ask io.formats instead): {unexpected}"


def test_the_registry_itself_is_seen_by_the_finder():
    """The finder sees the registry's own checks, so an empty result elsewhere is not a blind finder."""
    assert extension_checks(_tree(Path(PACKAGE.parent / REGISTRY)))
