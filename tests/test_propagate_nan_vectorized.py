"""PropagateNaN keeps a vectorized loop vectorized: its NaN test must not make TVM scalarize it.

A channels-last max pool (ResNet's stem pool, scheduled by ParallelSpatialLLVM with its channel
loop vectorized) is rewritten by PropagateNaN and built for the host CPU. ``tirx.isnan`` made
TVM 0.27's vectorizer scalarize the loop (one scalar compare and branch per lane, 6x slower);
the bit test that replaced it keeps vector compares and selects. The result must still be
torch's, NaN and infinities included, in float32 and float64 (a half-precision max compares
in float32: the same test).
"""

from __future__ import annotations

import re

import pytest
import torch
import tvm
from plus_tvm.passes.propagate_nan import PropagateNaN
from plus_tvm.schedules.parallel_spatial_llvm import ParallelSpatialLLVM
from plus_tvm.target import host_target
from tvm import te, topi


def _pool_func(dtype: str) -> tvm.tirx.PrimFunc:
    x = te.placeholder((1, 18, 18, 32), dtype, name="x")
    y = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max", layout="NHWC")
    return te.create_prim_func([x, y]).with_attr("global_symbol", "main")


def _build(dtype: str) -> tuple[tvm.runtime.Module, str]:
    target = host_target()
    with target:
        sch, why = ParallelSpatialLLVM(min_elements=1024).apply_with_reason(
            _pool_func(dtype), target
        )
    assert sch is not None, why
    mod = PropagateNaN()(tvm.IRModule({"main": sch.mod["main"]}))
    lib = tvm.compile(mod, target=target)
    return lib, lib.mod.inspect_source("ll")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_nan_keeping_max_pool_stays_vectorized_and_equals_torch(dtype):
    lib, llvm_ir = _build(dtype)
    # the max is taken on vectors, and no NaN test is made one lane at a time
    assert re.search(r"select <\d+ x i1>", llvm_ir), "the pool's max was not vectorized"
    assert not re.search(r"fcmp uno float ", llvm_ir), "a NaN test was scalarized"

    torch.manual_seed(0)
    tdtype = getattr(torch, dtype)
    x = torch.randn(1, 18, 18, 32).to(tdtype)
    x[0, 4, 5, 3] = float("nan")  # in two windows (column 5 is in windows 2 and 3)
    x[0, 17, 17, 31] = float("nan")  # the last corner (padded windows)
    x[0, 0, 0, 0] = float("nan")  # the first corner
    x[0, 9, 9, 7] = float("inf")
    x[0, 9, 10, 8] = -float("inf")
    want = torch.nn.functional.max_pool2d(x.permute(0, 3, 1, 2).float(), 3, 2, 1)
    want = want.permute(0, 2, 3, 1).to(tdtype)
    dev = tvm.cpu()
    xs = tvm.runtime.tensor(x.numpy(), dev)
    out = tvm.runtime.empty(tuple(want.shape), dtype, dev)
    lib["main"](xs, out)
    got = torch.from_dlpack(out).clone()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert int(torch.isnan(want).sum()) == 4
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
