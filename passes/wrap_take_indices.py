"""WrapTakeIndices: ``take`` never reads outside its table.

TVM's importers emit ``take`` (embedding lookups, ONNX Gather, torch indexing) in ``fast``
mode: no bounds check, so an index outside ``[0, n)`` reads neighbouring memory or segfaults,
and a negative index such as torch's ``x[..., [-2]]`` is never wrapped. This pass rewrites
every ``fast`` take into ``wrap`` mode: ``-n..-1`` select from the end as in torch and numpy, and
no index can leave the table. (Model *inputs* used as indices are also checked before the
model runs, with an error naming the input and its valid range: see
:mod:`plus_tvm.index_inputs`.) The index arithmetic is invariant in the gathered rows' inner
loop, so the cost is a few integer operations per index.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._dataflow_rewrite import op_name, rewrite_bindings


@tvm.transform.module_pass(opt_level=0, name="WrapTakeIndices")
class WrapTakeIndices:
    """Rewrite ``take(..., mode="fast")`` into ``mode="wrap"`` in every Relax function."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_bindings(mod, _wrapped, relax.transform.Normalize())


def _wrapped(binding: relax.VarBinding, _state: dict, bb: relax.BlockBuilder) -> relax.Expr | None:
    call = binding.value
    if op_name(call) != "relax.take" or str(call.attrs.mode) != "fast":
        return None
    axis = call.attrs.axis
    axis = None if axis is None else int(axis)
    return bb.normalize(relax.op.take(call.args[0], call.args[1], axis, "wrap"))
