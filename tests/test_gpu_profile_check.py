"""gpu_check on a bundle with two batch sizes and ``--profile``, run on the CPU: torch's CUDA
calls made no-ops, the libraries compiled for llvm, and the profiler's CPU ops standing in for
GPU kernels (torch.profiler itself, its record_function windows and events are the real ones).
What the GPU run does, short of the GPU (issue 39 items 1 and 3)."""

from __future__ import annotations

import json
import os

import torch
from _shared_gpu import cuda_on_the_cpu
from plus_tvm.gpu import bundle as gpu_bundle
from plus_tvm.gpu import check
from plus_tvm.gpu import profile as gpu_profile

REAL_KERNEL_EVENTS = gpu_profile.kernel_events


def _cpu_ops_as_kernels(function_events, mark=gpu_profile.MARK):
    """kernel_events, with the CPU ops (aten::...) taken for kernels: a CPU torch has no
    CUDA activity, and the windows still come from the real record_function ranges."""
    events = list(function_events)
    _, windows = REAL_KERNEL_EVENTS(events, mark)
    kernels = [
        gpu_profile.KernelEvent(e.name, e.time_range.start, e.time_range.end - e.time_range.start)
        for e in events
        if e.name.startswith("aten::")
    ]
    return kernels, windows


def _cuda_on_the_cpu(monkeypatch):
    cuda_on_the_cpu(monkeypatch)
    monkeypatch.setattr(check, "PROFILER_ACTIVITIES", ("CPU",))  # (this torch has no CUDA)


def test_profile_of_real_profiler_events_on_the_cpu(monkeypatch):
    """profiled(): warm-up, N windows from record_function, the events summarised; without
    GPU kernels it says so instead of a summary of nothing."""
    _cuda_on_the_cpu(monkeypatch)
    x = torch.randn(8, 8)
    no_gpu = check.profiled(lambda: x @ x, 3, 1, None)
    assert "no GPU kernel" in no_gpu["error"]
    monkeypatch.setattr(gpu_profile, "kernel_events", _cpu_ops_as_kernels)
    p = check.profiled(lambda: torch.relu(x @ x), 3, 1, None)
    assert p["inferences"] == p["windows"] == 3 and p["outside_windows"] == 0
    names = {k["name"]: k for k in p["kernels"]}
    assert names["aten::mm"]["count"] == 1 and names["aten::mm"]["kind"] == "gemm"
    assert names["aten::relu"]["count"] == 1
    assert p["busy_ms"] > 0 and p["kernel_ms"] >= p["busy_ms"]  # (nested CPU ops overlap)


def test_the_check_with_batches_and_profile_runs_end_to_end_on_the_cpu(tmp_path, monkeypatch):
    import plus_tvm.compiler

    real = plus_tvm.compiler.compile
    with monkeypatch.context() as m:
        m.setattr(
            plus_tvm.compiler, "compile", lambda mod, t, ex, **kw: real(mod, "llvm", ex, **kw)
        )
        m.setattr(gpu_bundle, "_kernel_signatures", lambda *a: {})
        m.setattr(gpu_bundle, "_pack_runtime", os.makedirs)  # (this TVM runs it here)
        out = str(tmp_path / "bundle")
        gpu_bundle.build_bundle(
            out,
            ["bert-base-tiny"],
            ["plus-auto"],
            log=lambda m: None,
            isolate=False,
            batches=[1, 2],
        )
    _cuda_on_the_cpu(monkeypatch)  # (after the build: torch.export asks torch.cuda)
    monkeypatch.setattr(gpu_profile, "kernel_events", _cpu_ops_as_kernels)
    res = str(tmp_path / "res")
    args = ["--runs", "2", "--warmup", "1", "--rounds", "1", "--peers", "eager", "--profile", "2"]
    assert check.main(["--bundle", out, "--out", res, *args]) == 0
    units = json.load(open(os.path.join(res, "gpu_check.json")))["models"]["bert-base-tiny"]
    assert list(units["dtypes"]) == ["fp32", "fp32 b2"]
    two = units["dtypes"]["fp32 b2"]
    assert two["batch"] == 2 and two["dtype"] == "fp32"
    auto = two["variants"]["plus-auto"]
    assert auto["correct"] and auto["checked_calls"] == 9 and auto["new_inputs_new_outputs"]
    eager = two["peers"]["eager"]["profile"]
    assert eager["inferences"] == 2 and eager["kernels_per_inference"] > 0
    assert "profile" in auto  # a summary, or why not (plus's CPU run may call no aten op)
    table = open(os.path.join(res, "gpu_check.md")).read()
    assert "| bert-base-tiny | fp32 | 1 |" in table and "| bert-base-tiny | fp32 | 2 |" in table
    profile_md = open(os.path.join(res, "profile.md")).read()
    assert "| bert-base-tiny fp32 b2 eager | " in profile_md
    assert "| bert-base-tiny fp32 eager | " in profile_md
    # a subset of the batches: none of the bundle's here (only the model is rebuilt)
    res1 = str(tmp_path / "res1")
    assert check.main(["--bundle", out, "--out", res1, *args, "--batches", "3"]) == 0
    only = json.load(open(os.path.join(res1, "gpu_check.json")))["models"]
    assert only.get("bert-base-tiny", {}).get("dtypes", {}) == {}
