"""``clamp`` / ``clamp_min`` / ``clamp_max`` imported with torch's meaning.

TVM 0.27's converters (a) fill a missing bound with ``inf``, which an integer tensor cannot hold
(``torch.clamp(ids, min=1)``: "Cannot convert infinity to BigInt" in legalization); (b) read
``clamp_max``'s bound from the wrong argument position, so ``torch.clamp_max(x, 5)`` clamped
nothing; (c) add bound tensors of another float dtype as they are (T5 in float16 clamps with a
float32 ``torch.where`` of two numbers; torch keeps ``x``'s dtype for 0-d bounds). Here a
bound is a number or a tensor cast to ``x``'s dtype, a missing one is no bound at all, and the
clamp is ``minimum(maximum(x, min), max)`` (a float clamp by numbers: TVM's ``clip``).
``fn(node, importer) -> relax.Expr``.
"""

from __future__ import annotations

from typing import Any

from tvm import relax


def _bound(importer: Any, x: relax.Expr, value: object) -> relax.Expr | None:
    """A bound as an expression of ``x``'s dtype (None: no bound)."""
    dtype = str(x.ty.dtype)
    if value is None:
        return None
    if isinstance(value, (bool, int, float)):
        if dtype.startswith(("int", "uint")) and isinstance(value, float):
            raise ValueError("a float bound for an integer tensor")  # (torch refuses it too)
        return relax.const(value, dtype)
    bound = importer.env[value] if hasattr(value, "meta") else value
    if str(bound.ty.dtype) != dtype:
        bound = importer.block_builder.emit(relax.op.astype(bound, dtype))
    return bound


def _clamp(importer: Any, node: Any, low: object, high: object) -> relax.Expr:
    x = importer.env[node.args[0]]
    bb = importer.block_builder
    numbers = all(b is None or isinstance(b, (int, float)) for b in (low, high))
    if numbers and str(x.ty.dtype).startswith(("float", "bfloat")):
        # a float clamp by numbers stays TVM's clip (clip(x, 0, 6) is the relu6 a library
        # epilogue takes); a missing bound is an infinite one
        lo = float("-inf") if low is None else float(low)
        hi = float("inf") if high is None else float(high)
        return bb.emit(relax.op.clip(x, lo, hi))
    out = x
    lo = _bound(importer, x, low)
    if lo is not None:
        out = bb.emit(relax.op.maximum(out, lo))
    hi = _bound(importer, x, high)
    if hi is not None:
        out = bb.emit(relax.op.minimum(out, hi))
    return out


def _arg(node: Any, position: int, name: str) -> object:
    return node.args[position] if len(node.args) > position else node.kwargs.get(name)


def clamp(node: Any, importer: Any) -> relax.Expr:
    """``aten.clamp(x, min=None, max=None)`` (number or tensor bounds)."""
    return _clamp(importer, node, _arg(node, 1, "min"), _arg(node, 2, "max"))


def clamp_min(node: Any, importer: Any) -> relax.Expr:
    return _clamp(importer, node, _arg(node, 1, "min"), None)


def clamp_max(node: Any, importer: Any) -> relax.Expr:
    return _clamp(importer, node, None, _arg(node, 1, "max"))


CLAMP_CONVERTERS = {
    "clamp.default": clamp,
    "clamp.Tensor": clamp,
    "clamp_min.default": clamp_min,
    "clamp_max.default": clamp_max,
}
