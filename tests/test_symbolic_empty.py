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
