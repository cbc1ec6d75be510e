"""ParallelSpatialLLVM: the CPU fallback for kernels GIR declines (a squeeze-excite's expand
convolution fused into the scale), checked for structure and against the unscheduled kernel."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from gir_kernels import random_args, run
from plus_tvm.options import Options
from plus_tvm.pipeline import phase_passes
from plus_tvm.schedules import GIRLLVM, ParallelSpatialLLVM
from plus_tvm.target import resolve_target
from tvm import relax, s_tir, tirx


@pytest.fixture(scope="module")
def llvm():
    return resolve_target("llvm")


def _fused(target, build) -> tirx.PrimFunc:
    """The largest fused PrimFunc that legalize + fuse make of ``build(bb)``."""
    bb = relax.BlockBuilder()
    build(bb)
    with target:
        mod = tvm.transform.Sequential(
            phase_passes(target, Options(), phases=("legalize", "fuse"))
        )(bb.get())
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    return max(funcs, key=lambda f: len(str(f)))


def _se_scale(h: int, w: int, c: int):
    """conv 1x1 (8 -> c) on a pooled [1, 1, 1, 8] + bias + sigmoid, scaling [1, h, w, c]."""

    def build(bb):
        pooled = relax.Var("pooled", relax.TensorType((1, 1, 1, 8), "float32"))
        weight = relax.Var("weight", relax.TensorType((c, 8, 1, 1), "float32"))
        bias = relax.Var("bias", relax.TensorType((c,), "float32"))
        act = relax.Var("act", relax.TensorType((1, h, w, c), "float32"))
        with bb.function("main", [pooled, weight, bias, act]):
            with bb.dataflow():
                y = bb.emit(
                    relax.op.nn.conv2d(pooled, weight, data_layout="NHWC", kernel_layout="OIHW")
                )
                y = bb.emit(relax.op.add(y, relax.op.reshape(bias, (1, 1, 1, c))))
                y = bb.emit(relax.op.sigmoid(y))
                out = bb.emit_output(relax.op.multiply(act, y))
            bb.emit_func_output(out)

    return build


def _loop_kinds(func: tirx.PrimFunc) -> dict[str, set[int]]:
    """Per block: the kinds of the loops around it."""
    sch = s_tir.Schedule(func)
    return {
        sch.get(b).name_hint: {int(sch.get(loop).kind) for loop in sch.get_loops(b)}
        for b in sch.get_child_blocks(sch.get_sblock("root"))
    }


def _check(func, target, sch):
    arrays = random_args(func)
    for want, got in zip(run(func, target, arrays), run(sch.mod["main"], target, arrays)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("h,w,c", [(56, 56, 32), (30, 30, 20), (40, 23, 24)])
def test_se_scale_runs_parallel_and_equals_unscheduled(h, w, c, llvm):
    func = _fused(llvm, _se_scale(h, w, c))
    assert "conv2d" in str(func)
    assert GIRLLVM().apply(func, llvm, False) is None  # the kernel this rule exists for
    sch = ParallelSpatialLLVM().apply(func, llvm, False)
    assert sch is not None
    kinds = set().union(*_loop_kinds(sch.mod["main"]).values())
    assert int(tirx.ForKind.PARALLEL) in kinds
    # 20 channels: not a multiple of the vector width, parallel only
    assert (int(tirx.ForKind.VECTORIZED) in kinds) == (c % 8 == 0)
    _check(func, llvm, sch)


def test_small_blocks_and_reductions_are_left_alone(llvm):
    func = _fused(llvm, _se_scale(4, 4, 8))  # 128 elements: below min_elements
    assert ParallelSpatialLLVM().apply(func, llvm, False) is None
    sch = ParallelSpatialLLVM(min_elements=64).apply(func, llvm, False)
    assert sch is not None
    _check(func, llvm, sch)
    # the reduction (the convolution) keeps its serial loops; the scale runs parallel
    kinds = _loop_kinds(sch.mod["main"])
    assert kinds["T_multiply"] >= {int(tirx.ForKind.PARALLEL)}
    assert all(
        k == {int(tirx.ForKind.SERIAL)} for name, k in kinds.items() if name.startswith("conv2d")
    )


def test_declines_other_targets_and_symbolic_sizes(llvm):
    func = _fused(llvm, _se_scale(56, 56, 32))
    cuda = resolve_target({"kind": "cuda", "arch": "sm_90"})
    assert ParallelSpatialLLVM().apply(func, cuda, False) is None

    n = tirx.Var("n", "int64")

    def build(bb):
        x = relax.Var("x", relax.TensorType((n, 4096), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(relax.op.exp(x))
            bb.emit_func_output(out)

    assert ParallelSpatialLLVM().apply(_fused(llvm, build), llvm, False) is None
