"""Max pooling with the stride left out (python/plus_tvm/torch_pool_converters.py): torch reads
the empty stride list ``max_pool2d(x, 2, padding=1)`` exports as the kernel size; TVM 0.27
refused it ("The input strides length is expected to be 2")."""

from __future__ import annotations

import plus_tvm
import pytest
import torch
from torch.nn import functional


class Pools(torch.nn.Module):
    def __init__(self, pool, **kw) -> None:
        super().__init__()
        self.pool, self.kw = pool, kw

    def forward(self, x):
        return self.pool(x, 2, **self.kw)  # no stride: the kernel size


@pytest.mark.parametrize(
    ("pool", "shape"),
    [(functional.max_pool2d, (1, 3, 7, 8)), (functional.max_pool3d, (1, 2, 5, 4, 6))],
    ids=["2d", "3d"],
)
@pytest.mark.parametrize("kw", [{"padding": 1}, {"padding": 1, "ceil_mode": True}, {}], ids=str)
def test_max_pool_without_a_stride_matches_torch(pool, shape, kw):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    x.view(-1)[::7] = float("nan")
    model = Pools(pool, **kw)
    cm = plus_tvm.compile(model, example_args=(x,), target="llvm")
    torch.testing.assert_close(cm(x), model(x), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    ("pool", "shape"),
    [(functional.max_pool2d, (1, 2, 4, 4)), (functional.max_pool3d, (1, 2, 4, 4, 4))],
    ids=["2d", "3d"],
)
def test_max_pool_indices_are_refused_by_name_not_returned_as_zeros(pool, shape):
    """TVM 0.27 returned float zeros for ``return_indices=True``."""

    class WithIndices(torch.nn.Module):
        def forward(self, x):
            values, indices = pool(x, 2, return_indices=True)
            return values, indices

    x = torch.randn(shape)
    with pytest.raises(plus_tvm.errors.UnsupportedOperatorError, match=r"with_indices.*indices"):
        plus_tvm.compile(WithIndices(), example_args=(x,), target="llvm")
