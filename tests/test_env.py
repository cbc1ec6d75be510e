"""plus_tvm.env: every environment variable defined once, read there and nowhere else."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from plus_tvm import env
from plus_tvm.errors import EnvVarError

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "python" / "plus_tvm", ROOT / "passes", ROOT / "schedules", ROOT / "warehouse"]
# the one function that writes: TVM's pool variables, set before TVM's pool starts (TVM reads them)
WRITER = ("threads.py", "configure_tvm_pool")


def test_each_variable_is_in_the_table_once():
    names = [v.name for v in env.VARIABLES]
    assert len(names) == len(set(names))
    constants = {v for k, v in vars(env).items() if k.isupper() and isinstance(v, str)}
    assert set(names) <= constants
    table = env.markdown_table()
    assert all(f"`{n}`" in table for n in names) and table.count("\n") == len(names) + 1
    with pytest.raises(KeyError, match="PLUS_TVM_NOT_A_VARIABLE"):
        env.raw("PLUS_TVM_NOT_A_VARIABLE")


def test_the_docs_list_the_table_as_it_is():
    docs = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
    assert env.markdown_table() in docs.read_text()


def _environment_uses(path: Path) -> list[tuple[int, str]]:
    """(line, function) of each ``os.environ`` / ``os.getenv`` in the file (``""``: module)."""
    tree = ast.parse(path.read_text(), str(path))
    uses = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in ("environ", "environb", "getenv", "getenvb")
        ):
            uses.append((node.lineno, function))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "")
    return uses


def test_no_other_module_reads_the_environment():
    found = []
    for folder in SOURCES:
        for path in folder.rglob("*.py"):
            if path == ROOT / "python" / "plus_tvm" / "env.py":
                continue
            for line, function in _environment_uses(path):
                if (path.name, function) != WRITER:
                    found.append(f"{path.relative_to(ROOT)}:{line} (in {function or 'module'})")
    assert not found, "read the environment through plus_tvm.env: " + ", ".join(found)


def test_the_cache_root_defaults_under_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv(env.CACHE_DIR, raising=False)
    monkeypatch.setenv(env.XDG_CACHE_HOME, str(tmp_path))
    assert env.cache_dir() == os.path.join(tmp_path, "plus_tvm")
    monkeypatch.delenv(env.XDG_CACHE_HOME)
    assert env.cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "plus_tvm")
    monkeypatch.setenv(env.CACHE_DIR, str(tmp_path / "mine"))
    assert env.cache_dir() == str(tmp_path / "mine")


@pytest.mark.parametrize(
    "value, enabled", [("", True), ("1", True), ("0", False), (" Off ", False), ("no", False)]
)
def test_native_switch(monkeypatch, value, enabled):
    monkeypatch.setenv(env.NATIVE, value)
    assert env.native_enabled() is enabled


def test_typed_values_and_their_defaults(monkeypatch):
    for name in (env.PREPACK_MB, env.WAREHOUSE, env.TVM_NUM_THREADS, env.OMP_NUM_THREADS):
        monkeypatch.delenv(name, raising=False)
    assert env.prepack_budget_mb() == 4096.0
    assert env.warehouse_folders() == () and env.thread_count() is None
    monkeypatch.setenv(env.PREPACK_MB, "12.5")
    assert env.prepack_budget_mb() == 12.5
    monkeypatch.setenv(env.PREPACK_MB, "lots")
    with pytest.raises(EnvVarError, match="PLUS_TVM_PREPACK_MB='lots'"):
        env.prepack_budget_mb()
    monkeypatch.setenv(env.WAREHOUSE, f" a {os.pathsep}{os.pathsep}b")
    assert env.warehouse_folders() == ("a", "b")
    monkeypatch.setenv(env.OMP_NUM_THREADS, "3")
    assert env.thread_count() == 3
    monkeypatch.setenv(env.TVM_NUM_THREADS, "x")  # not a count: the next one counts
    assert env.thread_count() == 3
