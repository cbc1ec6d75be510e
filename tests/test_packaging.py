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
