"""The notebooks under notebooks/ run top to bottom (their code cells, in one namespace)."""

from __future__ import annotations

import json
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cells = json.loads(path.read_text())["cells"]
    code = [("".join(c["source"]), i) for i, c in enumerate(cells) if c["cell_type"] == "code"]
    assert code, f"{path.name} has no code cells"
    namespace: dict = {}
    for source, index in code:
        exec(compile(source, f"{path.name}[cell {index}]", "exec"), namespace)  # noqa: S102
    # The quickstart's first cell leaves a compiled model whose HTML shows the fused groups.
    if path.stem == "quickstart":
        html = namespace["compiled"]._repr_html_()
        assert "fused groups" in html and "kernels" in html


def test_there_is_a_notebook():
    assert NOTEBOOKS
