"""InfiniteExtremeIdentity: a max pool / max reduction over a window of -inf returns -inf, as
torch does (TOPI starts them, and pads a pool, with the lowest finite value: -3.4e38)."""

from __future__ import annotations

import plus_tvm
import pytest
import torch
import tvm
from plus_tvm.passes import InfiniteExtremeIdentity
from plus_tvm.tir_blocks import blocks, nodes, stores
from tvm import te, tirx, topi


def _pool_input(dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(1, 16, 12, 12).to(dtype)
    x[0, 3, :4, :4] = -float("inf")  # whole windows of -inf, at the padded corner too
    x[0, 5, 5:8, 5:8] = -float("inf")
    x[0, 7] = -float("inf")  # a whole channel
    x[0, 9, 2, 2] = float("inf")
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_max_pool_over_minus_infinity_gives_minus_infinity(dtype):
    x = _pool_input(dtype)
    model = torch.nn.Sequential(torch.nn.MaxPool2d(3, 2, 1), torch.nn.MaxPool2d(2)).eval()
    want = model(x)
    assert (want == -float("inf")).sum() >= 9  # the case is in the data
    got = plus_tvm.compile(model, example_args=(x,))(x)
    assert got.dtype == dtype
    assert torch.equal(got, want)


def test_a_row_max_of_minus_infinity_gives_minus_infinity():
    class RowMax(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.max_pool1d(x, 4) + x.amax(-1, keepdim=True)

    x = torch.randn(2, 64, 256)
    x[0, 3] = -float("inf")
    x[1, 5, :8] = -float("inf")
    model = RowMax().eval()
    got = plus_tvm.compile(model, example_args=(x,))(x)
    assert torch.equal(got, model(x))


def _pool_func(fill_param: bool = False) -> tirx.PrimFunc:
    x = te.placeholder((1, 8, 8, 16), "float32", name="x")
    y = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max", layout="NHWC")
    return te.create_prim_func([x, y]).with_attr("global_symbol", "main")


def _constants(func: tirx.PrimFunc) -> set[float]:
    """The float constants ``func`` stores (in block bodies and inits)."""
    found = set()
    for block in blocks(func.body):
        for stmt in (block.body, block.init):
            for store in stores(stmt) if stmt is not None else ():
                for node in nodes(store.value):
                    if isinstance(node, tirx.FloatImm):
                        found.add(float(node.value))
    return found


def test_the_start_and_the_padding_become_infinite_and_nothing_else():
    func = _pool_func()
    lowest = float(tirx.min_value("float32").value)
    assert lowest in _constants(func)
    out = InfiniteExtremeIdentity()(tvm.IRModule({"main": func}))["main"]
    assert lowest not in _constants(out)
    assert -float("inf") in _constants(out)


def test_a_lowest_value_that_is_not_a_start_or_a_padding_is_kept():
    """clamp(x, min=lowest) stores the bound as a value of an element-wise max: the result is
    not an accumulation, so -3.4e38 stays (torch's clamp of -inf gives -3.4e38)."""
    x = te.placeholder((64,), "float32", name="x")
    lowest = tirx.min_value("float32")
    y = te.compute((64,), lambda i: tirx.max(x[i], lowest), name="y")
    func = te.create_prim_func([x, y]).with_attr("global_symbol", "main")
    mod = tvm.IRModule({"main": func})
    assert InfiniteExtremeIdentity()(mod).same_as(mod)
