"""RecomputeReductionCUDA: a squeeze-excite gate runs as one thread per element on GPUs.

dlight's reduction rules gave EfficientNet-B0's first gate (``x[1, 32, 112, 112] *
sigmoid(conv1x1(s[1, 8, 1, 1]) + b)``) a grid of 2 thread blocks: 183 us on an H200. The rule
spreads the epilogue over the whole grid and recomputes the 8-term reduction per thread."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tvm
from gir_kernels import fused_primfunc, random_args, run, run_cuda
from plus_tvm.passes import ApplyScheduleRules
from plus_tvm.schedules import RecomputeReductionCUDA
from plus_tvm.target import resolve_target
from tvm.s_tir import dlight as dl


@pytest.fixture(scope="module")
def sm90():
    return resolve_target({"kind": "cuda", "arch": "sm_90"})


def _extents(func, thread: str) -> list[int]:
    """The extents of the loops bound to ``thread`` in the printed schedule."""
    pattern = r"T\.thread_binding\(T\.int64\((\d+)\), thread=\"" + re.escape(thread)
    return [int(n) for n in re.findall(pattern, func.script())]


@pytest.mark.parametrize("shape", [[1, 32, 112, 112], [1, 144, 28, 28], [1, 7, 29, 31]])
def test_gate_spreads_over_the_grid(shape, sm90):
    func = fused_primfunc("se_gate", shape, sm90)
    sch = RecomputeReductionCUDA(min_elements=512).apply(func, sm90, False)
    assert sch is not None
    out = sch.mod["main"]
    points = int(np.prod(shape))
    assert _extents(out, "blockIdx.x") == [-(-points // 256)]  # the whole output, not 2 blocks
    assert _extents(out, "threadIdx.x") == [256]
    text = out.script()
    assert 'scope="local"' in text  # each thread keeps its reduced value in a register
    ex = tvm.compile(tvm.IRModule({"main": out.with_attr("global_symbol", "main")}), sm90)
    src = ex.mod.imports[0].inspect_source()
    assert "__global__" in src and "__shared__" not in src


def test_pipeline_takes_the_gate_before_dlight(sm90):
    func = fused_primfunc("se_gate", [1, 32, 112, 112], sm90)
    mod = tvm.IRModule({"gate": func})
    with sm90:
        out = ApplyScheduleRules(RecomputeReductionCUDA(), dl.gpu.Reduction(), dl.gpu.Fallback())(
            mod
        )
    report = json.loads(out.attrs["plus.schedule"])
    assert report["scheduled"] == {"RecomputeReductionCUDA": 1}


@pytest.mark.parametrize(
    "kind, shape, why",
    [
        ("rmsnorm", [128, 256], "reduces the tensor it scales"),  # each row read once: dlight's
        ("softmax", [32, 1000], "reduces the tensor it scales"),
        ("layernorm", [4, 8192], "reduces the tensor it scales"),
        ("se_gate", [1, 4, 4, 4], "reduces the tensor it scales"),  # 64 elements: too small
        ("gelu", [512, 768], "no reduction"),
        ("rowsum", [512, 768], "a single block"),  # the reduction is the output
    ],
)
def test_declines_what_dlight_does_better(kind, shape, why, sm90):
    func = fused_primfunc(kind, shape, sm90)
    sch, reason = RecomputeReductionCUDA().apply_with_reason(func, sm90)
    assert sch is None
    assert why in reason, reason


def test_cpu_targets_are_not_ours():
    llvm = resolve_target("llvm")
    func = fused_primfunc("se_gate", [1, 32, 56, 56], llvm)
    sch, reason = RecomputeReductionCUDA().apply_with_reason(func, llvm)
    assert sch is None and "not a GPU" in reason


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [[1, 32, 112, 112], [1, 7, 29, 31]])
def test_gate_numerics_on_gpu(shape):
    target = resolve_target("cuda")
    func = fused_primfunc("se_gate", shape, target)
    sch = RecomputeReductionCUDA(min_elements=512).apply(func, target, False)
    arrays = random_args(func)
    got = run_cuda(sch.mod["main"], arrays)
    want = run(func, resolve_target("llvm"), arrays)
    np.testing.assert_allclose(got[-1], want[-1], rtol=1e-5, atol=1e-5)
