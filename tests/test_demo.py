"""The main job (``scripts/demo``) on a tiny model: it runs, checks numerics, prints the table."""

from __future__ import annotations

from plus_tvm import demo


def test_demo_runs_on_a_tiny_model(capsys):
    code = demo.main(["zoo:bert-base-tiny", "--runs", "1", "--budget", "5"])
    out = capsys.readouterr().out
    assert code == 0
    for row in ("kernels, plus pipeline", "plus speedup over onnxruntime", "library calls"):
        assert row in out
    assert "gemm_epilogue x" in out and "attention x" in out
