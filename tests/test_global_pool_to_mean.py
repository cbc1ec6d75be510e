"""GlobalPoolToMean: whole-input average pools become means (exactly), others stay."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm.passes import GlobalPoolToMean
from torch import nn


def _ops(mod) -> list[str]:
    return [
        b.value.op.name
        for blk in mod["main"].body.blocks
        for b in blk.bindings
        if hasattr(b.value, "op") and hasattr(b.value.op, "name")
    ]


@pytest.mark.parametrize(
    "pool, rewritten",
    [
        (nn.AvgPool2d(1280, ceil_mode=True), True),  # transformers' EfficientNet pooler
        (nn.AvgPool2d(7), True),
        (nn.AvgPool2d(3, stride=2), False),
        (nn.AvgPool2d(7, padding=1, ceil_mode=True), False),
    ],
)
def test_global_average_pools_become_means(pool, rewritten):
    x = torch.randn(1, 16, 7, 7)
    mod, _ = plus_tvm.from_torch(pool.eval(), (x,))
    out = GlobalPoolToMean()(mod)
    assert ("relax.mean" in _ops(out)) == rewritten
    assert ("relax.nn.avg_pool2d" in _ops(out)) != rewritten
    compiled = plus_tvm.compile(pool.eval(), example_args=(x,))
    np.testing.assert_allclose(np.asarray(compiled(x)), pool(x).numpy(), rtol=1e-5, atol=1e-6)
