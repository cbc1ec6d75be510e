"""``torch.arange`` with a negative step, which TVM 0.27 sizes wrongly.

Relax's ``arange(12, -12, -1)`` has 26 elements instead of 24 (its length formula rounds
towards the wrong side for a negative step), so every shape computed from it disagrees with
torch's: Funnel's relative positions (``arange(12, -12, -1)``) then fail "broadcast_to expects
... 24 while ... 26". Here a negative step is imported as the negation of the positive-step
range, ``arange(start, end, step) == -arange(-start, -end, -step)`` (exact in integers and in
floating point), in torch's result dtype (the node's; integers are negated in int64 and cast,
so unsigned results stay right). Positive steps and symbolic bounds keep TVM's converter.
``fn(node, importer) -> relax.Expr`` for the importer's ``custom_convert_map``.
"""

from __future__ import annotations

from typing import Any

from tvm import relax

__all__ = ["ARANGE_CONVERTERS"]


def _bounds(node: Any) -> tuple[object, object, object]:
    args = list(node.args)
    if len(args) == 1:
        start, end, step = 0, args[0], 1
    else:
        start, end = args[0], args[1]
        step = args[2] if len(args) > 2 else 1
    start = node.kwargs.get("start", start)
    end = node.kwargs.get("end", end)
    step = node.kwargs.get("step", step)
    return start, end, step


def arange(node: Any, importer: Any) -> relax.Expr:
    """``aten.arange`` (``.default``, ``.start``, ``.start_step``)."""
    from .torch_fixes import _original

    start, end, step = _bounds(node)
    numbers = all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, end, step)
    )
    val = node.meta.get("val")
    if not numbers or step >= 0 or val is None:
        return _original(importer, node.target.__name__)(node)
    dtype = importer._convert_data_type(val.dtype)
    work = dtype if dtype.startswith(("float", "bfloat")) else "int64"
    bb = importer.block_builder
    up = bb.emit(relax.op.arange(-start, -end, -step, dtype=work))
    out = bb.emit(relax.op.negative(up))
    return out if work == dtype else bb.emit(relax.op.astype(out, dtype))


ARANGE_CONVERTERS = {
    "arange.default": arange,
    "arange.start": arange,
    "arange.start_step": arange,
}
