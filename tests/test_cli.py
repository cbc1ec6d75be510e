"""The plus-tvm command line: commands, JSON contract, exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from plus_tvm import cli, zoo

STATS_KEYS = {
    "model",
    "target",
    "pipeline",
    "ops",
    "kernels",
    "fusion_ratio",
    "library_calls",
    "patterns",
    "compile_s",
}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_zoo_list_names_every_model(capsys):
    code, out, _ = run_cli(capsys, "zoo", "list")
    assert code == 0
    for name in zoo.names():
        assert f"zoo:{name} " in out


def test_zoo_export_writes_an_onnx_file_that_imports(tmp_path, capsys):
    path = tmp_path / "vgg.onnx"
    code, out, _ = run_cli(capsys, "zoo", "export", "zoo:vgg16-tiny", "-o", str(path))
    assert code == 0 and str(path) in out
    code, out, _ = run_cli(capsys, "run", str(path), "--json")
    assert code == 0
    result = json.loads(out)
    assert result["reference"] == "onnxruntime" and result["max_abs_err"] < 1e-4
    assert result["outputs"][0]["shape"] == [1, 10]


def test_inspect_json_follows_the_stats_contract(capsys):
    code, out, _ = run_cli(capsys, "inspect", "zoo:bert-base-tiny", "--json")
    assert code == 0
    stats = json.loads(out)
    assert STATS_KEYS <= set(stats)
    assert stats["pipeline"] == "plus" and stats["model"] == "bert-base-tiny"
    assert 0 < stats["kernels"] < stats["ops"]
    assert stats["fusion_ratio"] == pytest.approx(stats["ops"] / stats["kernels"], rel=2e-3)
    # library dispatch (PluS): every library call belongs to a warehouse entry
    assert stats["library_calls"] > 0
    assert stats["library_calls"] == sum(stats["patterns"].values())
    assert {"gemm_epilogue", "attention"} <= set(stats["patterns"])
    assert stats["groups"] and all(g["ops"] for g in stats["groups"])


def test_inspect_tvm_pipeline_reports_tvm_fusion(capsys):
    _, out_plus, _ = run_cli(capsys, "inspect", "zoo:bert-base-tiny", "--json")
    code, out_tvm, _ = run_cli(
        capsys, "inspect", "zoo:bert-base-tiny", "--json", "--pipeline", "tvm"
    )
    assert code == 0
    plus, tvm_ = json.loads(out_plus), json.loads(out_tvm)
    assert tvm_["pipeline"] == "tvm"
    assert tvm_["ops"] == plus["ops"]
    # plus dispatches to libraries and fuses with mapping-type rules and plan search (paper
    # 004): fewer kernels than TVM's FuseOps; with --opt fusion=tvm --opt dispatch=false it
    # runs FuseOps alone, after phase 1's view canonicalization (CanonicalizeBatchMatmul,
    # SimplifyViews: the attention's matmuls over the 4-D operands, without the reshapes
    # torch's decomposition puts around them), so at most TVM's kernels.
    assert plus["kernels"] < tvm_["kernels"]
    _, out_same, _ = run_cli(
        capsys,
        "inspect",
        "zoo:bert-base-tiny",
        "--json",
        "--opt",
        "fusion=tvm",
        "--opt",
        "dispatch=false",
    )
    assert plus["kernels"] < json.loads(out_same)["kernels"] <= tvm_["kernels"]


def test_opt_sets_options_and_rejects_unavailable_values(capsys):
    code, out, _ = run_cli(
        capsys, "inspect", "zoo:bert-base-tiny", "--json", "--opt", "fold_constants=false"
    )
    assert code == 0
    assert json.loads(out)["options"]["fold_constants"] is False
    code, _, err = run_cli(capsys, "inspect", "zoo:bert-base-tiny", "--opt", "cuda_graph=maybe")
    assert code == 2
    assert "cuda_graph" in err and "Traceback" not in err
    code, _, err = run_cli(
        capsys, "inspect", "zoo:bert-base-tiny", "--opt", "fusion_max_group_size=x"
    )
    assert code == 2 and "fusion_max_group_size" in err
    code, _, err = run_cli(capsys, "inspect", "zoo:bert-base-tiny", "--opt", "nonsense=1")
    assert code == 2 and "nonsense" in err


@pytest.mark.parametrize(
    "model, needle",
    [
        ("zoo:no-such-model", "no-such-model"),
        ("missing.onnx", "missing.onnx"),
        ("python:no_such_module_xyz:f", "no_such_module_xyz"),
        ("what-is-this", "what-is-this"),
    ],
)
def test_bad_model_references_exit_2_naming_the_problem(capsys, model, needle):
    code, _, err = run_cli(capsys, "inspect", model)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1


def test_corrupt_onnx_exits_2(tmp_path, capsys):
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(os.urandom(512))
    code, _, err = run_cli(capsys, "inspect", str(bad))
    assert code == 2 and "corrupt.onnx" in err


def test_bad_target_exits_2(capsys):
    code, _, err = run_cli(capsys, "inspect", "zoo:bert-base-tiny", "--target", "tpu9000")
    assert code == 2 and "tpu9000" in err


def test_errors_print_no_traceback_in_a_real_process():
    proc = subprocess.run(
        [sys.executable, "-m", "plus_tvm.cli", "inspect", "zoo:nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "nope" in proc.stderr


def test_compile_then_run_library_matches_direct_run(tmp_path, capsys):
    lib = str(tmp_path / "model.so")
    code, out, _ = run_cli(capsys, "compile", "zoo:gpt2-tiny", "-o", lib, "--json")
    assert code == 0 and json.loads(out)["kernels"] > 0
    assert os.path.exists(lib) and os.path.exists(lib + ".params")
    inputs = tmp_path / "in.npz"
    _, example = zoo.load("gpt2-tiny")
    np.savez(inputs, input_ids=example[0].numpy())
    code, out, _ = run_cli(
        capsys, "run", lib, "--inputs", str(inputs), "--json", "--output", str(tmp_path / "out.npz")
    )
    assert code == 0
    lib_out = np.load(tmp_path / "out.npz")["output0"]
    code, out, _ = run_cli(capsys, "run", "zoo:gpt2-tiny", "--json")
    assert code == 0
    direct = json.loads(out)
    assert direct["reference"] == "torch"
    assert direct["max_abs_err"] < 1e-4
    import torch

    module, _ = zoo.load("gpt2-tiny")
    with torch.no_grad():
        ref = module(*example).numpy()
    np.testing.assert_allclose(lib_out, ref, atol=1e-4, rtol=0)


def test_run_rejects_inputs_of_the_wrong_shape(tmp_path, capsys):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, input_ids=np.zeros((1, 3), dtype="int64"))
    code, _, err = run_cli(capsys, "run", "zoo:bert-base-tiny", "--inputs", str(inputs))
    assert code == 2
    assert "input_ids" in err and "shape" in err


def test_bench_writes_json_and_plot(tmp_path, capsys):
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    code, out, _ = run_cli(
        capsys,
        "bench",
        "zoo:bert-base-tiny",
        "--compare",
        "plus,tvm,torch,onnxruntime",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--json",
        str(out_json),
        "--plot",
        str(out_png),
        "--no-progress",
    )
    assert code == 0
    result = json.loads(out_json.read_text())
    assert set(result["backends"]) == {"plus", "tvm", "torch", "onnxruntime"}
    for name, entry in result["backends"].items():
        assert entry["status"] == "ok", (name, entry)
        assert entry["runs"] == 3 and entry["median_ms"] > 0
        assert entry["max_abs_err"] < 1e-4, name
    plus_ms = result["backends"]["plus"]["median_ms"]
    for peer in ("tvm", "torch", "onnxruntime"):
        expect = result["backends"][peer]["median_ms"] / plus_ms
        assert result["speedup"][peer] == pytest.approx(expect, rel=2e-3)
    assert result["stats"]["kernels"] == result["backends"]["plus"]["kernels"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "onnxruntime" in out and "plus speedup" in out


def test_a_closed_output_pipe_stops_quietly():
    """``plus-tvm ... | head``: the reader goes away, the command stops with 141 (128 +
    SIGPIPE) and no "internal error" line (before: exit 1, "internal error: BrokenPipeError")."""
    import subprocess
    import sys

    code = (
        "import sys, plus_tvm.cli as c\n"
        "def gone(_args):\n"
        "    raise BrokenPipeError(32, 'Broken pipe')\n"
        "c.COMMANDS['zoo'] = gone\n"
        "sys.exit(c.main(['zoo', 'list']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 141, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
