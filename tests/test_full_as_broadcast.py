"""FullAsBroadcast: ``torch.full`` inside ``forward`` compiles (TVM 0.27 cannot legalize
``relax.full``) and gives torch's values, in the fill's dtype or a cast of it."""

from __future__ import annotations

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
from plus_tvm.passes import FullAsBroadcast
from tvm import relax


class CausalScores(torch.nn.Module):
    def forward(self, x):
        n = x.shape[1]
        mask = torch.full((n, n), float("-inf")).triu(1)
        return torch.softmax(x @ x.transpose(-1, -2) + mask, -1)


def test_a_mask_built_with_full_in_forward_compiles_and_is_exact():
    x = torch.randn(1, 6, 4)
    compiled = plus_tvm.compile(CausalScores().eval(), example_args=(x,))
    with torch.no_grad():
        ref = CausalScores()(x).numpy()
    np.testing.assert_allclose(np.asarray(compiled(x.numpy())), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fill, dtype", [(2.5, "float32"), (3, "float32"), (7, "int64")])
def test_full_becomes_a_broadcast_of_its_value(fill, dtype):
    fill_dtype = "int64" if isinstance(fill, int) else "float32"
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            full = relax.op.full([2, 3], relax.const(fill, fill_dtype), dtype)
            out = bb.emit_output(full)
        bb.emit_func_output(out)
    mod = bb.get()
    new = FullAsBroadcast()(mod)
    ops = [
        b.value.op.name
        for blk in new["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
    ]
    assert "relax.full" not in ops and "relax.broadcast_to" in ops
    vm = relax.VirtualMachine(tvm.compile(new, "llvm"), tvm.cpu())
    got = vm["main"]().numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, np.full((2, 3), fill, dtype))
