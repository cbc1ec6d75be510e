"""Import cycles among plus_tvm's modules, read from the source (nothing is imported).

Every ``import`` / ``from ... import`` of a plus_tvm module counts, at module level and inside
functions (a cycle through a function-level import still ties the modules together: neither
can be understood, moved or tested without the other). ``from . import name`` counts as an
import of the submodule ``name`` where one exists, else of the package. Imports under
``if TYPE_CHECKING:`` are left out (they never run).

    python scripts/import_cycles.py            # every cycle (strongly connected component)
    python scripts/import_cycles.py zoo loader # exit 1 if these modules share a cycle

Exit status: 0 without a cycle among the modules named (or at all, when none are named), 1
otherwise.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the package's source folders (pyproject's package-dir)
FOLDERS = {
    "plus_tvm": ROOT / "python" / "plus_tvm",
    "plus_tvm.passes": ROOT / "passes",
    "plus_tvm.schedules": ROOT / "schedules",
    "plus_tvm.warehouse": ROOT / "warehouse",
}


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
                continue
            name = ".".join([package, *parts])
            if package == "plus_tvm" and parts and f"plus_tvm.{parts[0]}" in FOLDERS:
                continue  # (a folder mapped elsewhere)
            found[name] = path
    return found


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return files[name].name == "__init__.py"


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def imports(name: str, files: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports."""
    tree = ast.parse(files[name].read_text(), str(files[name]))
    skip = _type_checking_lines(tree)
    package = name if _is_package(name, files) else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str) -> None:
        while target and target not in files:  # ``a.b.func`` -> ``a.b``
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("plus_tvm"):
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith("plus_tvm"):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                add(sub if sub in files else module)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main(argv: list[str]) -> int:
    files = modules()
    graph = {name: imports(name, files) for name in files}
    found = cycles(graph)
    wanted = {n if n.startswith("plus_tvm") else f"plus_tvm.{n}" for n in argv}
    bad = [c for c in found if not wanted or len(wanted & set(c)) > 1]
    for component in bad:
        print(f"cycle of {len(component)} modules: {', '.join(component)}")
    if not bad:
        print("no import cycle" + (f" among {', '.join(sorted(wanted))}" if wanted else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
