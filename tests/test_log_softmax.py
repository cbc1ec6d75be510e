"""plus.log_softmax: the kernel, its binder and warehouse entry (one library implementation,
added as a unit: kernel file, binder, entry, this test)."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm.runtime import KERNELS
from plus_tvm.runtime.log_softmax import LOG_SOFTMAX_SPEC
from torch import nn


class LogSoftmax(nn.Module):
    def __init__(self, dim: int = -1, scale: float = 1.0) -> None:
        super().__init__()
        self.dim, self.scale = dim, scale

    def forward(self, x):
        return torch.log_softmax(x * self.scale, self.dim)


def test_kernel_matches_torch_on_rows_with_extremes():
    x = torch.randn(6, 300) * 30
    x[0, :] = -1e30  # a row of equal, very negative values
    x[1, 5] = float("inf")
    x[2, 7] = float("nan")
    out = torch.empty_like(x)
    KERNELS["plus.log_softmax"].run(LOG_SOFTMAX_SPEC.parse("axis=-1"), (x,), out)
    torch.testing.assert_close(out, torch.log_softmax(x, -1), equal_nan=True)


def test_large_rows_go_to_the_library_exactly():
    model, x = LogSoftmax(scale=2.0), torch.randn(64, 4096)
    compiled = plus_tvm.compile(model, example_args=(x,))
    assert compiled.stats["patterns"] == {"log_softmax": 1}
    got = np.asarray(compiled(x))
    np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,dim", [((2, 8), -1), ((64, 4096, 2), 1)])
def test_small_rows_or_another_axis_stay_generated(shape, dim):
    """Tiny rows: the crossing costs more than the work (TIR kept); a reduction over another
    axis is not the entry's last-axis form."""
    model, x = LogSoftmax(dim), torch.randn(*shape)
    compiled = plus_tvm.compile(model, example_args=(x,))
    assert "log_softmax" not in compiled.stats["patterns"]
    got = np.asarray(compiled(x))
    np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-5)
