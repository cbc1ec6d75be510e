"""FullAsBroadcast: ``full(shape, value)`` as ``broadcast_to(value, shape)``.

TVM 0.27's legalization of ``relax.full`` hands its dtype to ``topi.full`` as a ``PrimType``
where a string is expected and fails with ``TypeError: argument of type 'PrimType' is not
iterable``: any torch model that builds a tensor with ``torch.full`` inside ``forward`` (a
causal mask of ``-inf``, a constant bias) fails to compile under TVM's pipeline and plus's
alike. ``full`` is a broadcast of its 0-d fill value (a constant fill cast to the requested
dtype when it differs), which legalizes correctly, so this pass rewrites ``full`` into that.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._dataflow_rewrite import op_name, rewrite_bindings


@tvm.transform.module_pass(opt_level=0, name="FullAsBroadcast")
class FullAsBroadcast:
    """Rewrite ``relax.full`` into ``broadcast_to`` of the fill value."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_bindings(mod, _broadcast, relax.transform.Normalize())


def _broadcast(
    binding: relax.VarBinding, _state: dict, bb: relax.BlockBuilder
) -> relax.Expr | None:
    call = binding.value
    if op_name(call) != "relax.full":
        return None
    shape, fill = call.args
    dtype = str(binding.var.ty.dtype)
    if str(fill.ty.dtype) != dtype:
        if not isinstance(fill, tvm.ir.expr.Constant):
            return None  # a computed fill of another dtype: left to TVM
        fill = relax.const(fill.value.numpy().astype(dtype), dtype)
    return bb.normalize(relax.op.broadcast_to(fill, shape))
