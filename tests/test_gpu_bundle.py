"""The GPU bundle (compile here, run there) builds on a machine without a GPU, stays under the
size a device call carries, holds a runtime-only TVM, and its check refuses clearly without a
GPU; the table reports plus and TVM's baseline separately."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest
from plus_tvm.gpu import bundle as gpu_bundle
from plus_tvm.gpu.check import kernel_table, plus_failures, table

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("b") / "bundle")
    manifest = gpu_bundle.build_bundle(
        out, ["bert-base-tiny"], ["plus-off"], log=lambda m: None, isolate=False
    )
    return out, manifest


def test_bundle_holds_libraries_inputs_and_a_runtime_only_tvm(built):
    out, manifest = built
    assert manifest["bytes"] <= gpu_bundle.LIMIT_BYTES
    record = json.load(open(os.path.join(out, "manifest.json")))["models"]["bert-base-tiny"]
    assert list(record["dtypes"]) == ["fp32"]  # the default: float32 only, as before
    variant = record["dtypes"]["fp32"]["variants"]["plus-off"]
    lib = os.path.join(out, variant["library"])
    meta = json.load(open(lib + ".json"))
    assert meta["target"]["kind"] == "cuda" and meta["target"]["arch"] == "sm_90"
    assert meta["external"], "weights travel as names, taken from the rebuilt torch model"
    assert record["state"] == "state.pt" and record["input_sets"] == 3
    sigs = variant["kernel_signatures"]  # for gpu_check --kernels
    assert sigs and all(e["launches"] >= 1 and e["args"] for e in sigs.values())
    assert all(
        isinstance(shape, list) and dtype for e in sigs.values() for shape, dtype in e["args"]
    )
    with tarfile.open(os.path.join(out, "runtime", "tvm_runtime.tar.gz")) as tar:
        names = tar.getnames()
    assert "tvm/lib/libtvm_runtime.so" in names and "tvm/lib/libtvm_runtime_cuda.so" in names
    assert not any("libtvm_compiler" in n for n in names)
    wheels = [f for f in os.listdir(os.path.join(out, "runtime")) if f.endswith(".whl")]
    assert sorted(w.split("-")[0] for w in wheels) == ["apache_tvm_ffi", "ml_dtypes"]
    assert all("cp312" in w for w in wheels)
    assert os.access(os.path.join(out, "run.sh"), os.X_OK)


def test_check_says_clearly_that_it_needs_a_gpu(built):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the check runs for real there")
    out, _ = built
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "scripts", "gpu_check"),
            "--bundle",
            out,
            "--out",
            out + "-results",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr


def test_unknown_variant_or_model_fails_before_any_work(tmp_path):
    with pytest.raises(gpu_bundle.PlusError, match="unknown variant"):
        gpu_bundle.build_bundle(str(tmp_path / "x"), ["bert-base-tiny"], ["plus-fast"])
    with pytest.raises(Exception, match="unknown zoo model"):
        gpu_bundle.build_bundle(str(tmp_path / "x"), ["no-such-model"], ["plus-off"])
    assert not os.path.exists(tmp_path / "x")


def test_table_separates_plus_from_the_tvm_baseline():
    row = {"median_ms": 1.0, "max_rel_err": 1e-7, "correct": True}
    results = {
        "models": {
            "m": {
                "variants": {
                    "plus-off": dict(row, median_ms=4.0),
                    "plus-always": dict(row, median_ms=2.0),
                    "plus-auto": dict(row, round_spread=0.04),
                    "plus-gir": dict(row, median_ms=1.6, round_spread=0.02),
                    "tvm": {"median_ms": 2.0, "max_rel_err": float("inf"), "correct": False},
                },
                "peers": {"eager": {"median_ms": 3.0}, "compile-ro": {"median_ms": 0.5}},
            }
        }
    }
    lines = table(results).splitlines()
    assert len({ln.count("|") for ln in lines}) == 1  # header, rule and rows line up
    # auto vs off, always vs off, gir vs always, auto vs torch, auto vs compile (not timed),
    # auto vs compile ro; the error, the widest round spread, correctness of plus and of TVM
    # (a result of the float32-only format: torch's own error is not measured there)
    expected = "| 4.00x | 2.00x | 1.25x | 3.00x | - | 0.50x | 1.0e-07 | - | 4.0% | yes | NO |"
    assert lines[-1].startswith("| m | fp32 |") and expected in lines[-1]
    assert plus_failures(results) == []  # TVM's wrong baseline is not a failure of the check
    results["models"]["m"]["variants"]["plus-auto"] = dict(row, correct=False)
    assert plus_failures(results) == ["m fp32"]


def test_kernel_table_compares_the_same_kernels_of_two_variants():
    results = {
        "models": {
            "m": {
                "variants": {
                    "plus-always": {"kernel_ms": {"k1": 0.2, "k2": 0.1, "only_a": 1.0}},
                    "plus-gir": {"kernel_ms": {"k1": 0.1, "k2": 0.2, "only_b": 1.0}},
                }
            }
        }
    }
    lines = kernel_table(results, "plus-always", "plus-gir").splitlines()
    assert lines[2] == "| m | fp32 | k1 | 0.2000 | 0.1000 | 2.00x |"  # slowest under a first
    assert lines[3] == "| m | fp32 | k2 | 0.1000 | 0.2000 | 0.50x |"
    assert lines[4] == "| m | fp32 | all 2 | 0.3000 | 0.3000 | 1.00x |"


def test_variants_are_timed_in_rounds_in_turn():
    import argparse
    import time

    from plus_tvm.gpu.check import _more_rounds

    order = []
    timers = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    rows = {"a": {"median_ms": 5.0}, "b": {"median_ms": 1.0}}
    args = argparse.Namespace(rounds=3, runs=2, deadline=time.time() + 60)
    _more_rounds(rows, timers, args)
    assert len(rows["a"]["round_ms"]) == len(rows["b"]["round_ms"]) == 3
    assert order[:4] == ["a", "a", "a", "a"] and order[4:8] == ["b"] * 4  # a's round, then b's
    assert order[8:12] == ["a"] * 4  # in turn: A B A B
    # the median of the round medians: the first round's 5 ms and two near-zero rounds
    assert rows["a"]["median_ms"] < 1.0 and rows["a"]["round_spread"] > 1.0
    late = {"a": {"median_ms": 2.0}}
    _more_rounds(late, {"a": lambda: None}, argparse.Namespace(rounds=3, runs=2, deadline=0.0))
    assert late["a"]["round_ms"] == [2.0] and late["a"]["median_ms"] == 2.0  # no time left


def test_batches_compile_each_model_at_each_batch(tmp_path, monkeypatch):
    """``--batches 1,2``: each model at each batch, batch 1 where format 2 had it (a bundle
    without batches reads as batch 1), larger batches in their own folders, their inputs drawn
    again on the GPU side from the seeds the manifest names (rows from their own seeds)."""
    monkeypatch.setattr(gpu_bundle, "_pack_runtime", os.makedirs)  # (tested with `built`)

    def in_process(cmd, result, variants):  # the child's command line, run here (faster)
        assert cmd[1:3] == ["-m", "plus_tvm.gpu.bundle"]
        assert gpu_bundle._child_main(cmd[3:]) == 0
        return json.load(open(result))

    monkeypatch.setattr(gpu_bundle, "run_child", in_process)
    out = str(tmp_path / "bundle")
    manifest = gpu_bundle.build_bundle(
        out, ["bert-base-tiny"], ["plus-off"], log=lambda m: None, batches=[1, 2]
    )
    saved = json.load(open(os.path.join(out, "manifest.json")))
    assert saved["batches"] == [1, 2] and manifest["bytes"] <= gpu_bundle.LIMIT_BYTES
    units = saved["models"]["bert-base-tiny"]["dtypes"]
    assert list(units) == ["fp32", "fp32 b2"]
    assert (
        gpu_bundle.split_label("fp32 b2")
        == ("fp32", 2)
        == (
            units["fp32 b2"]["dtype"],
            units["fp32 b2"]["batch"],
        )
    )
    assert gpu_bundle.split_label("bf16") == ("bf16", 1)
    one, two = (units[k]["variants"]["plus-off"] for k in ("fp32", "fp32 b2"))
    assert "error" not in two, two.get("error")
    assert one["library"].endswith("bert-base-tiny/fp32/plus-off.so")
    assert two["library"].endswith("bert-base-tiny/b2/fp32/plus-off.so")
    shapes = [
        json.load(open(os.path.join(out, v["library"] + ".json")))["inputs"] for v in (one, two)
    ]
    assert [i["shape"] for i in shapes[0]] == [[1, 16]] and [i["shape"] for i in shapes[1]] == [
        [2, 16]
    ]
    entry = gpu_bundle.zoo.get("bert-base-tiny")
    rows = gpu_bundle.batch_inputs(entry, units["fp32 b2"]["input_seeds"][0], 2)[0]
    assert rows.shape == (2, 16) and not (rows[0] == rows[1]).all()
    assert (rows[0] == entry.example_inputs(gpu_bundle.INPUT_SEEDS[0])[0][0]).all()
    assert not os.path.exists(os.path.join(out, "models", "bert-base-tiny", "inputs_b2.npz"))


def test_bad_batches_fail_before_any_work(tmp_path):
    for batches in ([], [0], [1, 1], [-4]):
        with pytest.raises(gpu_bundle.PlusError, match="batches"):
            gpu_bundle.build_bundle(
                str(tmp_path / "x"), ["bert-base-tiny"], ["plus-off"], batches=batches
            )
    assert not os.path.exists(tmp_path / "x")
