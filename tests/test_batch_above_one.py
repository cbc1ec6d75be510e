"""A batch above 1 reaches the same warehouse entries as batch 1: ``CanonicalizeBatchMatmul``
(matmuls over the 4-D operands torch flattened; a weight broadcast over the batch) and
``SinkRowReshapes`` (row regroupings moved below a linear's epilogue), each checked on its own
and end to end against torch."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
from _shared_arch import arch_stats
from plus_tvm import arch_suite
from plus_tvm.loader import load_model
from plus_tvm.passes import CanonicalizeBatchMatmul, SinkRowReshapes
from torch import nn


class _Attention(nn.Module):
    def forward(self, q, k, v, mask):
        return ((q @ k.transpose(-1, -2)) * 0.3 + mask).softmax(-1) @ v


class _Block(nn.Module):
    """A linear on non-contiguous 3-D input (torch: a batched matmul by a broadcast weight),
    then bias, GELU, a second linear, residual and LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.ln = nn.LayerNorm(16)

    def forward(self, x):
        x = x.transpose(0, 1)  # [S, B, D] -> [B, S, D], not viewable as rows
        return self.ln(self.fc2(torch.nn.functional.gelu(self.fc1(x))) + x)


def test_batch_matmul_runs_over_the_unflattened_operands():
    q, k, v = (torch.randn(3, 4, 9, 8) for _ in range(3))
    mod = load_model(_Attention().eval(), (q, k, v, torch.zeros(3, 1, 9, 9))).mod
    before = mod.script()
    rewrite = CanonicalizeBatchMatmul()
    out = rewrite(mod)
    assert mod.script() == before  # the input module is never mutated
    assert rewrite.rewritten == 2
    products = [ln for ln in out.script().splitlines() if "R.matmul" in ln]
    assert len(products) == 2 and all("R.Tensor((3, 4, 9," in ln for ln in products), products


def test_broadcast_weight_is_dropped_and_the_block_is_one_linear_chain():
    torch.manual_seed(0)
    model = _Block().eval()
    x = torch.randn(5, 3, 16)
    mod = load_model(model, (x,)).mod
    weight_copy = "R.shape([3, 16, 32])"  # fc1's [16, 32] weight broadcast over the batch
    assert weight_copy in mod.script()
    rewrite = CanonicalizeBatchMatmul()
    out = rewrite(mod)
    assert rewrite.rewritten == 1 and weight_copy not in out.script()
    compiled = plus_tvm.compile(
        model, example_args=(x,), options=plus_tvm.Options(dispatch_cost_model=False)
    )
    patterns = compiled.stats["patterns"]
    assert patterns.get("gemm_epilogue") == 1 and patterns.get("gemm_layernorm") == 1, patterns
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_allclose(np.asarray(compiled(x)), ref, rtol=1e-5, atol=1e-5)


def test_row_reshapes_sink_below_row_wise_operators_only():
    class Rows(nn.Module):
        def forward(self, y, res, bias):
            r = y.reshape(2, 6, 8)  # rows regrouped
            z = torch.nn.functional.layer_norm(torch.relu(r + bias) + res, (8,))
            return z.sum(-1)  # not keepdims: the reshape stops here

    y, res, bias = torch.randn(12, 8), torch.randn(2, 6, 8), torch.randn(8)
    mod = load_model(Rows().eval(), (y, res, bias)).mod
    rewrite = SinkRowReshapes()
    out = rewrite(mod)
    assert rewrite.sunk == 4  # add, relu, add, layer_norm
    text = out.script()
    assert 'R.Tensor((12, 8), dtype="float32") = R.nn.layer_norm' in text
    compiled = plus_tvm.compile(Rows().eval(), example_args=(y, res, bias))
    ref = Rows()(y, res, bias).numpy()
    np.testing.assert_allclose(np.asarray(compiled(y, res, bias)), ref, rtol=1e-5, atol=1e-5)


def test_unit_dimension_reshapes_stay():
    class Unit(nn.Module):
        def forward(self, y):
            return torch.relu(y.reshape(1, 12, 8))

    mod = load_model(Unit().eval(), (torch.randn(12, 8),)).mod
    rewrite = SinkRowReshapes()
    assert rewrite(mod).same_as(mod) and rewrite.sunk == 0


@pytest.mark.parametrize("name", ["bert", "t5"])
def test_transformer_at_batch_two_keeps_its_entries(name):
    model, inputs = arch_suite.load(name)
    one = arch_stats(name)  # (inspect's statistics, from test_arch_suite's shared compile)
    two = tuple(torch.cat([t, t]) for t in inputs)
    compiled = plus_tvm.compile(model, example_args=two)
    assert compiled.stats["patterns"] == one["patterns"]
    assert compiled.stats["kernels"] <= one["kernels"] + 4
    x = tuple(
        torch.cat([a, b])
        for a, b in zip(*(arch_suite.inputs_of(arch_suite.ENTRIES[name], s) for s in (0, 1)))
    )
    with torch.no_grad():
        ref = model(*x).numpy()
    np.testing.assert_allclose(np.asarray(compiled(*x)), ref, rtol=1e-4, atol=1e-4)
