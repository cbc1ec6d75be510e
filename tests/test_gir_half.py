"""GIR on half-precision kernels: element-wise and data-movement kernels are planned (a
reduction over half buffers keeps TVM's schedule) and compute as torch does (a bfloat16
argument of exp / sigmoid / tanh keeps TVM's function: its fast form, bound with Let, read
the raw bits of bfloat16 loads)."""

from __future__ import annotations

import plus_tvm
import pytest
import torch
from plus_tvm.gir.search import plan_for_rule
from plus_tvm.target import host_target
from tvm import te, tirx


class _HalfActivations(torch.nn.Module):
    """The element-wise kernels of half models: LLaMA's SiLU gate, GPT-2's tanh GELU, a
    BatchNorm + SiLU (EfficientNet), each large enough to be planned and vectorized."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(64)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gate = torch.nn.functional.silu(x) * y
        gelu = torch.nn.functional.gelu(x, approximate="tanh") + y
        bn = torch.nn.functional.silu(self.bn(x.transpose(1, 2)))
        return gate, gelu, bn


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_element_wise_kernels_planned_by_gir_compute_as_torch(dtype):
    torch.manual_seed(0)
    model = _HalfActivations().eval().to(dtype)
    x, y = (torch.randn(2, 256, 64).to(dtype) * 3 for _ in range(2))
    cm = plus_tvm.compile(model, "llvm", example_args=(x, y))
    for got, want in zip(cm(x, y), model(x, y)):
        assert got.dtype == dtype
        err = (got.float() - want.float()).abs().max() / want.float().abs().max()
        assert err < 0.02, err  # a few units in the last place; a misread load is far off


def _half_elementwise():
    a = te.placeholder((64, 256), "bfloat16", name="a")
    b = te.compute(
        a.shape, lambda i, j: tirx.sigmoid(a[i, j].astype("float32")).astype("bfloat16")
    )
    return te.create_prim_func([a, b])


def _half_reduction():
    a = te.placeholder((64, 256), "bfloat16", name="a")
    k = te.reduce_axis((0, 256), name="k")
    b = te.compute((64,), lambda i: te.sum(a[i, k].astype("float32"), axis=k))
    return te.create_prim_func([a, b])


def test_half_element_wise_kernels_are_planned_and_half_reductions_are_not():
    target = host_target()
    assert plan_for_rule(_half_elementwise(), target, "llvm") is not None
    why: list[str] = []
    assert plan_for_rule(_half_reduction(), target, "llvm", why=why) is None
    assert why == ["a reduction over half-precision buffers"]
