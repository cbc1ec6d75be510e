"""ONNX conformance: the runner survives crashes and hangs, classifies correctly, and the CI
subset of ONNX's node tests (the first test of every operator) has no plus-only failure."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
from plus_tvm import env
from plus_tvm.conformance import case_store, runner
from plus_tvm.conformance import cases as cases_mod
from plus_tvm.conformance.cases import NodeCase, first_of_each_operator, load_cases

FAKE_WORKER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    out = os.fdopen(int(sys.argv[3]), "w", buffering=1)
    for line in sys.stdin:
        req = json.loads(line)
        name = req["name"]
        if name == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if name == "hang":
            time.sleep(60)
        status = "pass" if name.startswith("ok") or req["pipeline"] == "tvm" else "fail"
        out.write(json.dumps({"status": status, "stage": "run", "error": "x", **req}) + "\\n")
    """
)


def _fake_cases(names):
    return [NodeCase(n, "Relu", b"", (), 1e-3, 1e-7) for n in names]


def test_classes_of_the_two_outcomes():
    assert runner.classify("pass", "pass") == "both_pass"
    assert runner.classify("fail", "pass") == "plus_only_fail"
    assert runner.classify("pass", "timeout") == "tvm_only_fail"
    assert runner.classify("crash", "fail") == "both_fail"


def test_the_runner_outlives_crashing_and_hanging_workers(tmp_path, monkeypatch):
    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    cache = tmp_path / "cases.npz"
    cache.write_bytes(case_store.dumps([]))
    monkeypatch.setattr(runner, "_WORKER", str(worker))
    monkeypatch.setattr(runner, "cache_path", lambda: str(cache))
    names = ["ok1", "crash", "ok2", "hang", "ok3", "bad"]
    report = runner.run(_fake_cases(names), jobs=2, timeout_s=3.0)
    plus = {n: t["plus"]["status"] for n, t in report.tests.items()}
    assert plus == {
        "ok1": "pass",
        "crash": "crash",
        "ok2": "pass",
        "hang": "timeout",
        "ok3": "pass",
        "bad": "fail",
    }
    assert "SIGSEGV" in report.tests["crash"]["plus"]["error"]
    classes = {n: t["class"] for n, t in report.tests.items()}
    assert classes["bad"] == "plus_only_fail"  # the fake TVM side passes it
    assert classes["crash"] == classes["hang"] == "both_fail"  # both sides crash / hang
    assert report.counts()["both_pass"] == 3
    assert "plus-only failures" in runner.summary(report)


def test_the_cache_keeps_only_numeric_tests(monkeypatch, tmp_path):
    monkeypatch.setenv(env.CACHE_DIR, str(tmp_path))
    cases = load_cases()
    assert os.path.exists(cases_mod.cache_path())
    assert [c.name for c in load_cases()] == [c.name for c in cases]  # read back
    assert len(cases) > 1500
    for case in cases[:200]:
        for inputs, outputs in case.data_sets:
            for array in (*inputs, *outputs):
                assert array.dtype.name in cases_mod.NUMERIC_DTYPES
    subset = first_of_each_operator(cases)
    assert len({c.op for c in subset}) == len(subset) > 150
    assert not any(c.expanded for c in subset)


def test_ci_subset_has_no_plus_only_failure():
    """The first node test of every operator, under plus and under TVM (a few minutes)."""
    subset = first_of_each_operator(load_cases())
    report = runner.run(subset, timeout_s=180.0)
    counts = report.counts()
    plus_only = report.names("plus_only_fail")
    details = {n: report.tests[n]["plus"] for n in plus_only}
    assert not plus_only, f"plus breaks what TVM gets right: {details}"
    assert counts["plus_pass"] >= counts["tvm_pass"]
    print(runner.summary(report), file=sys.stderr)


@pytest.mark.parametrize("argv", [["--jobs", "0"], ["--timeout", "-1"], ["--pipelines", "x"]])
def test_bad_arguments_exit_2(argv):
    from plus_tvm.conformance.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def test_the_store_keeps_bfloat16_arrays_and_refuses_older_versions(tmp_path):
    import ml_dtypes
    import numpy as np

    bits = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    case = {
        "name": "t",
        "op": "Cast",
        "model": b"m",
        "data_sets": (((bits, np.ones(2, np.float16)), (bits.astype(np.float32),)),),
        "rtol": 1e-3,
        "atol": 1e-7,
    }
    path = tmp_path / "store.npz"
    path.write_bytes(case_store.dumps([case]))
    ((inputs, outputs),) = case_store.load(str(path))[0]["data_sets"]
    assert inputs[0].dtype == ml_dtypes.bfloat16 and np.array_equal(inputs[0], bits)
    assert inputs[1].dtype == np.float16 and outputs[0].dtype == np.float32
    # a store of the previous version (no bfloat16 tests in it) is stale, not damaged
    with np.load(str(path)) as store:
        old = {k: store[k] for k in store.files if k != case_store.FORMAT}
    np.savez(str(tmp_path / "old.npz"), **old)
    with pytest.raises(case_store.StaleStoreError):
        case_store.load(str(tmp_path / "old.npz"))


def test_half_precision_tests_are_kept_and_selected():
    cases = load_cases()
    half = cases_mod.half_precision(cases)
    names = {c.name for c in half}
    assert {"test_cast_FLOAT_to_BFLOAT16", "test_celu_float16", "test_attention_4d_fp16"} <= names
    assert len(half) > 60
    assert all(c.name in names for c in cases if "bfloat16" in c.name.lower())


def test_half_precision_tests_of_quick_operators_have_no_plus_only_failure():
    """The float16 / bfloat16 node tests of operators that compile in seconds (attention's are
    left to ``scripts/conformance --subset half``), under plus and under TVM."""
    slow = ("Attention", "FlexAttention", "LinearAttention", "CausalConvWithState")
    cases = [
        c for c in cases_mod.half_precision(load_cases()) if not c.expanded and c.op not in slow
    ]
    assert any("bfloat16" in c.name.lower() for c in cases)
    report = runner.run(cases, timeout_s=180.0)
    plus_only = report.names("plus_only_fail")
    details = {n: report.tests[n]["plus"] for n in plus_only}
    assert not plus_only, f"plus breaks what TVM gets right: {details}"
    counts = report.counts()
    assert counts["plus_pass"] >= counts["tvm_pass"]
    print(runner.summary(report), file=sys.stderr)
