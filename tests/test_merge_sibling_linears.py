"""MergeSiblingLinears: sibling plus.linear calls on one input become one ``parts=P`` call."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
from plus_tvm.loader import load_model
from plus_tvm.passes import MergeSiblingLinears
from plus_tvm.pipeline import dispatch_phase
from plus_tvm.target import resolve_target


class Siblings(torch.nn.Module):
    """Q/K/V-style (bias) on one input; on another, a bias-less pair and a linear with a bias
    (alone: a different bias flag)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(128, n) for n in (128, 64, 96))
        self.a = torch.nn.Linear(128, 256, bias=False)
        self.b = torch.nn.Linear(128, 256, bias=False)
        self.r = torch.nn.Linear(128, 128)

    def forward(self, x):
        h = torch.tanh(x)
        qkv = torch.cat([self.q(h), self.k(h), self.v(h)], dim=-1)
        gated = torch.nn.functional.silu(self.a(x)) * self.b(x)
        res = self.r(x)  # on x with a bias: the bias-less pair on x is another group
        return res + qkv.sum(-1, keepdim=True) + gated[..., :1]


def _calls(mod: tvm.IRModule) -> list[str]:
    return [line for line in mod["main"].script().splitlines() if '"plus.linear"' in line]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Siblings().eval(), torch.randn(2, 64, 128)


def test_groups_merge_and_the_rest_stays(model):
    module, x = model
    loaded = load_model(module, (x,))
    target = resolve_target("llvm")
    options = plus_tvm.Options(dispatch_cost_model=False)
    with target:
        before = tvm.transform.Sequential(dispatch_phase(target, options))(loaded.mod)
        after = MergeSiblingLinears()(before)
    assert len(_calls(before)) == 6
    calls = _calls(after)
    assert len(calls) == 3
    assert sum("parts=3" in c for c in calls) == 1 and sum("parts=2" in c for c in calls) == 1
    assert sum("parts" not in c for c in calls) == 1  # the one left alone, unchanged
    assert "strided_slice" in after["main"].script()
    assert MergeSiblingLinears()(after).same_as(after)  # nothing left to merge: same module


@pytest.mark.parametrize("cost_model", [False, True])
def test_merged_model_matches_torch(model, cost_model):
    module, x = model
    options = plus_tvm.Options(merge_linears=True, dispatch_cost_model=cost_model)
    cm = plus_tvm.compile(module, "llvm", (x,), options=options)
    plain = plus_tvm.compile(module, "llvm", (x,), options=options.replace(merge_linears=False))
    assert cm.stats["library_calls"] <= plain.stats["library_calls"]
    with torch.no_grad():
        expected = module(x).numpy()
    for _ in range(3):  # the joined weight is packed at its second sighting
        np.testing.assert_allclose(cm(x), expected, rtol=1e-4, atol=1e-4)
    x2 = torch.randn_like(x)
    with torch.no_grad():
        np.testing.assert_allclose(cm(x2), module(x2).numpy(), rtol=1e-4, atol=1e-4)


def test_off_by_default():
    assert plus_tvm.Options().merge_linears is False
