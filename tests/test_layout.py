"""The package's layout rules (README "Layout"): who imports MPI, who prints, how big a module grows."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mpikmeans"
MODULES = sorted(PACKAGE.rglob("*.py"))


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def test_only_comm_imports_mpi4py():
    importers = set()
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            if any(n == "mpi4py" or n.startswith("mpi4py.") for n in names):
                importers.add(_rel(path))
    assert importers == {"mpikmeans/comm.py"}


def test_only_the_cli_prints():
    printers = set()
    for path in MODULES:
        if _rel(path).startswith("mpikmeans/cli/"):
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                printers.add(f"{_rel(path)}:{node.lineno}")
    assert not printers, f"print() outside mpikmeans/cli: {sorted(printers)}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {_module_name(p): p for p in MODULES}


def _imported(name: str, node: ast.AST) -> set:
    """The package's modules an import statement of module ``name`` loads (``from .x import y``: ``x.y`` where
    that is a module, else ``x``)."""
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        if node.level:
            base = name.split(".") if NAMES[name].name == "__init__.py" else name.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        wanted = [f"{module}.{a.name}" if f"{module}.{a.name}" in NAMES else module for a in node.names]
    out = set()
    for w in wanted:
        while w not in NAMES and "." in w:
            w = w.rsplit(".", 1)[0]
        if w in NAMES and w != name:
            out.add(w)
    return out


def import_graph() -> dict:
    """Module -> the package's modules it imports, wherever the import statement is (in a function too)."""
    graph = {}
    for name, path in NAMES.items():
        graph[name] = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= _imported(name, node)
    return graph


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """Data flows one way: no two modules import each other, directly or through others, not even inside
    a function (such an import only hides the cycle)."""
    cycles = _cycles(import_graph())
    assert not cycles, cycles
