"""``aten.mul.Tensor`` of two boolean tensors as a logical and.

torch multiplies bool tensors in bool (``True * False == False``); TVM 0.27's converter emits a
multiply in the bool dtype, which LLVM's code generation refuses (``CreateMul ... kDLFloat``).
torch's decomposition of ``isfinite`` produces one (``(x == x) * (x.abs() != inf)``), so any
model asking ``torch.isfinite(h).all()`` (BART's float16 clamp) meets it.
"""

from __future__ import annotations

import operator
from typing import Any

from tvm import relax

__all__ = ["BOOL_ARITH_CONVERTERS", "mul_bool_as_and"]


def _dtype(value: object) -> str | None:
    ty = getattr(value, "ty", None) if isinstance(value, relax.Expr) else None
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


def mul_bool_as_and(node: Any, importer: Any) -> relax.Expr:
    """``mul.Tensor``: two bool operands give their logical and; anything else TVM's own."""
    lhs, rhs = importer.retrieve_args(node)[:2]
    if _dtype(lhs) == "bool" and _dtype(rhs) == "bool":
        return importer.block_builder.emit(relax.op.logical_and(lhs, rhs))
    return importer._binary_op(relax.op.multiply, operator.mul)(node)  # (0.27's own)


BOOL_ARITH_CONVERTERS = {"mul.Tensor": mul_bool_as_and}
