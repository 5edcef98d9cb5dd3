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


def test_no_module_over_600_lines():
    long = {_rel(p): n for p in MODULES if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, long
