"""The mixture-of-experts converters (``plus_tvm.moe_converters``) and the typed ``//``
scalar (``torch_fixes.div_mode_typed_scalar``): each compiled through the plus pipeline and
compared with torch on inputs chosen to hit every rule (bin edges, values outside the range,
NaN, a constant input, empty groups, rows past the last offset, negative integers)."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
from torch import nn


class Histc(nn.Module):
    def __init__(self, bins: int, lo: float, hi: float) -> None:
        super().__init__()
        self.bins, self.lo, self.hi = bins, lo, hi

    def forward(self, x):
        return torch.histc(x, bins=self.bins, min=self.lo, max=self.hi)


def _histc_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    edges = torch.linspace(-1.0, 2.0, 8)  # every bin edge of bins=7 over [-1, 2], both ends
    spread = torch.rand(57, generator=g) * 5 - 2  # about half outside [-1, 2]
    nan = torch.tensor([float("nan"), -1.0, 2.0, 2.0000002, -1.0000001, 0.0, 0.5])
    return [torch.cat([edges, spread, nan]).reshape(8, 9)]


@pytest.mark.parametrize("bins,lo,hi", [(7, -1.0, 2.0), (4, 0.0, 3.0), (5, 0.0, 0.0)])
def test_histc_matches_torch(bins, lo, hi):
    model = Histc(bins, lo, hi)
    x = _histc_inputs()[0]
    if lo == hi:  # the data's range: NaN-free data (torch's min/max of NaN data is NaN)
        x = torch.nan_to_num(x, nan=0.25)
    compiled = plus_tvm.compile(model, example_args=(x,))
    for data in (x, torch.round(x * 3) / 3):
        np.testing.assert_array_equal(compiled(data), model(data).numpy())


def test_histc_of_constant_data_widens_the_range():
    model = Histc(3, 0.0, 0.0)
    x = torch.full((6,), 4.0)
    compiled = plus_tvm.compile(model, example_args=(x,))
    expected = model(x).numpy()
    assert expected.tolist() == [0.0, 6.0, 0.0]  # [3, 5] in three bins
    np.testing.assert_array_equal(compiled(x), expected)


class GroupedMM(nn.Module):
    def forward(self, x, w, offs):
        return torch.ops.transformers.grouped_mm_fallback(x, w, offs=offs)


@pytest.mark.parametrize(
    "offs",
    [
        [3, 3, 7, 10],  # an empty group in the middle
        [0, 4, 4, 10],  # empty first group
        [2, 5, 6, 7],  # rows 7..9 belong to no expert: zero
        [10, 10, 10, 10],  # one expert takes every row
    ],
)
def test_grouped_mm_matches_the_transformers_op(offs):
    pytest.importorskip("transformers.integrations.moe")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 6, generator=g)
    w = torch.randn(4, 6, 5, generator=g)
    model = GroupedMM()
    example = torch.tensor([3, 3, 7, 10], dtype=torch.int32)
    compiled = plus_tvm.compile(model, example_args=(x, w, example))
    o = torch.tensor(offs, dtype=torch.int32)
    np.testing.assert_allclose(compiled(x, w, o), model(x, w, o).numpy(), rtol=1e-5, atol=1e-5)


class FloorDiv(nn.Module):
    def __init__(self, divisor, mode: str) -> None:
        super().__init__()
        self.divisor, self.mode = divisor, mode

    def forward(self, x):
        return torch.div(x, self.divisor, rounding_mode=self.mode)


@pytest.mark.parametrize(
    "dtype,divisor,mode",
    [
        (torch.int64, 3, "floor"),
        (torch.int64, 3, "trunc"),
        (torch.int32, -2, "floor"),
        (torch.float32, 2, "floor"),
        (torch.float32, 2.5, "trunc"),
    ],
)
def test_division_by_a_python_number_keeps_the_tensor_dtype(dtype, divisor, mode):
    x = torch.arange(-7, 8).to(dtype) * (1 if not dtype.is_floating_point else 1.3)
    model = FloorDiv(divisor, mode)
    compiled = plus_tvm.compile(model, example_args=(x,))
    expected = model(x).numpy()
    got = np.asarray(compiled(x))
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
