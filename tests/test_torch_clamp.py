"""clamp / clamp_min / clamp_max as torch means them (python/plus_tvm/torch_clamp.py)."""

from __future__ import annotations

import plus_tvm
import pytest
import torch


class Clamps(torch.nn.Module):
    def forward(self, ids, x):
        return (
            torch.clamp(ids, min=1),  # an integer clamp with one bound: an internal error once
            torch.clamp_min(ids, 2),
            torch.clamp_max(x, 0.5),  # 0.27 read its bound from the wrong position: no clamp
            torch.clamp(x, min=torch.tensor(-0.25)),  # a tensor bound
            torch.clamp(x, 0.0, 0.2),  # numbers: TVM's clip (relu6's form)
        )


def test_clamps_match_torch_nan_included():
    args = (torch.tensor([0, 3, 5]), torch.tensor([0.1, 0.7, -1.0, float("nan")]))
    cm = plus_tvm.compile(Clamps(), example_args=args)
    for got, want in zip(cm(*args), Clamps()(*args)):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_a_float16_clamp_by_a_float32_tensor_keeps_float16():
    class T5Clamp(torch.nn.Module):  # T5's overflow guard in float16
        def forward(self, h):
            bound = torch.where(torch.isinf(h).any(), 65504.0 - 1000, 65504.0)
            return torch.clamp(h, min=-bound, max=bound)

    h = torch.tensor([1.0, -70000.0, 3.0], dtype=torch.float16)
    got = plus_tvm.compile(T5Clamp(), example_args=(h,))(h)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, T5Clamp()(h))


@pytest.mark.parametrize("act", [torch.nn.Hardswish(), torch.nn.Hardsigmoid()])
def test_a_convolution_then_a_hard_activation_compiles(act):
    """hardswish after a convolution was an internal error in the binder's scalar check
    ('int' object has no attribute 'numpy'): MobileNetV3's stem."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), act).eval()
    x = torch.randn(1, 3, 16, 16)
    cm = plus_tvm.compile(model, example_args=(x,))
    torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-5)
