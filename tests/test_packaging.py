"""pyproject.toml lists every package, so a wheel (not only the editable install) is whole."""

from __future__ import annotations

import pathlib

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        "plus_tvm"
        + "".join(
            "." + part for part in init.parent.relative_to(ROOT / "python" / "plus_tvm").parts
        )
        for init in (ROOT / "python" / "plus_tvm").rglob("__init__.py")
    }
    assert found <= listed, sorted(found - listed)
    for folder in ("passes", "schedules", "warehouse"):
        assert f"plus_tvm.{folder}" in listed


def test_the_model_loaders_import_one_way():
    """zoo -> dynamic_sequence -> loader -> zoo was a cycle (scripts/import_cycles.py reads
    every import, function-level ones included)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "import_cycles", ROOT / "scripts" / "import_cycles.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    files = script.modules()
    graph = {name: script.imports(name, files) for name in files}
    assert "plus_tvm.loader" in graph["plus_tvm.dynamic_sequence"]  # (the checker sees imports)
    loaders = {"plus_tvm.zoo", "plus_tvm.dynamic_sequence", "plus_tvm.loader"}
    assert not [c for c in script.cycles(graph) if len(loaders & set(c)) > 1]
