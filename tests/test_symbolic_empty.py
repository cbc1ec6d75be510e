"""``torch.empty`` / ``empty_permuted`` of a symbolic size (transformers' mixture-of-experts
layers allocate their output so under a symbolic batch), and fusion around tensors whose shape
is a composite of symbolic sizes (``[2 * b, d]``): the import converts the size, the fused
functions stay well formed (the tests' strict pass context checks every pass), the results
equal torch's for several batch sizes of one compile."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
from torch.export import Dim


class EmptyFill(torch.nn.Module):
    def forward(self, x):
        buf = torch.empty_permuted((x.shape[0] * 2, x.shape[1]), (1, 0), dtype=x.dtype)
        buf.copy_(torch.cat([x, x * 2]))
        # reductions over the [2 * b, d] buffer: a group whose input shape defines no size
        return buf.sum(0) + buf.reshape(-1, 2, x.shape[1]).sum(1).mean(0)


class EmptyThenWrite(torch.nn.Module):
    def forward(self, x):
        out = torch.empty((x.shape[0], 2 * x.shape[1]), dtype=x.dtype)
        out[:, : x.shape[1]] = x.exp()
        out[:, x.shape[1] :] = -x
        return out.cumsum(-1)


@pytest.mark.parametrize("module", [EmptyFill(), EmptyThenWrite()], ids=lambda m: type(m).__name__)
def test_empty_of_a_symbolic_size_compiles_once_for_every_batch(module):
    compiled = plus_tvm.compile(
        module, example_args=(torch.randn(3, 8),), dynamic_shapes={"x": {0: Dim("b", max=64)}}
    )
    for batch in (3, 5, 1, 17):
        x = torch.randn(batch, 8)
        np.testing.assert_allclose(
            np.asarray(compiled(x)), module(x).numpy(), rtol=1e-5, atol=1e-5, err_msg=str(batch)
        )


class _MLP(torch.nn.Module):
    """GPT-2's MLP: the linear's result comes out flattened (``[b * n, 64]``) and the GELU chain
    reads it back as ``[b, n, 64]``: the group's input defines neither ``b`` nor ``n``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 64)
        self.proj = torch.nn.Linear(64, 16)

    def forward(self, x):
        h = self.fc(x)  # GPT-2's NewGELUActivation, written out
        h = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.proj(h)


def test_a_chain_over_sizes_of_the_inputs_is_fused_under_two_symbolic_sizes():
    """The GELU chain between the two linears is one kernel, its sizes handed in as a shape
    parameter (it was left unfused: nine kernels, each a round trip through memory), and the
    result equals torch's for several batch sizes and lengths of one compile."""
    torch.manual_seed(0)
    module = _MLP().eval()
    dims = {"x": {0: Dim("b", max=8), 1: Dim("n", max=64)}}
    compiled = plus_tvm.compile(module, example_args=(torch.randn(2, 5, 16),), dynamic_shapes=dims)
    tir = compiled.stats["kernels"] - compiled.stats["library_calls"]
    assert tir <= 2, (compiled.stats["kernels"], compiled.stats["library_calls"])
    for batch, length in ((2, 5), (1, 1), (3, 17), (8, 64)):
        x = torch.randn(batch, length, 16)
        np.testing.assert_allclose(
            np.asarray(compiled(x)), module(x).detach().numpy(), rtol=1e-5, atol=1e-5
        )
