"""``amax`` / ``amin``, which TVM 0.27's torch importer has no converter for (Reformer's
attention takes ``amax`` of its scores), and the whole-tensor ``max()`` / ``min()`` and
element-wise ``maximum`` / ``minimum`` of bool tensors, which 0.27 fails to compile ("Cannot
decide min_value for bool" in legalization, a float compare on ``i1`` in code generation).

``torch.amax(x, dim=(), keepdim=False)`` reduces over ``dim`` (every axis when it is empty),
negative dims counted from the end, keeping ``x``'s dtype: Relax's ``max`` / ``min``. Bool
tensors are reduced or compared as 0/1 integers and returned as bool. A float NaN reaches the
result through ``PropagateNaN`` (the pipeline pass); a row of infinities keeps its infinity
(TOPI's reduction starts from the lowest finite value). ``fn(node, importer) -> relax.Expr`` for
the importer's ``custom_convert_map``.
"""

from __future__ import annotations

from typing import Any

from tvm import relax, tirx

__all__ = ["MINMAX_CONVERTERS"]


def _arg(node: Any, position: int, name: str, default: object) -> object:
    return node.args[position] if len(node.args) > position else node.kwargs.get(name, default)


def _reduce(largest: bool) -> Any:
    reduce = relax.op.max if largest else relax.op.min

    def convert(node: Any, importer: Any) -> relax.Expr:
        bb = importer.block_builder
        x = importer.env[node.args[0]]
        dims = _arg(node, 1, "dim", [])
        keepdim = bool(_arg(node, 2, "keepdim", False))
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        rank = x.ty.ndim
        axes = sorted({d + rank if d < 0 else d for d in dims}) if dims else None
        if rank == 0:
            return x  # torch: a 0-d tensor reduces to itself
        dtype = str(x.ty.dtype)
        work = bb.emit(relax.op.astype(x, "int8")) if dtype == "bool" else x
        out = bb.emit(reduce(work, axes, keepdim))
        if dtype == "bool":
            return bb.emit(relax.op.astype(out, "bool"))
        if dtype.startswith(("float", "bfloat")):
            return _infinite_extreme(bb, x, out, axes, keepdim, largest)
        return out

    return convert


def _infinite_extreme(
    bb: Any, x: relax.Expr, out: relax.Expr, axes: list | None, keepdim: bool, largest: bool
) -> relax.Expr:
    """``out`` with a result at the reducer's starting value made ``-inf`` (``+inf``) unless
    some reduced value really is that finite extreme. TOPI's max starts from the lowest
    *finite* value, so the max of a row of ``-inf`` was ``-3.4e38`` (float16: ``-65504``);
    ONNX's ``ReduceMax`` has the same fix (``onnx_import/converters/reduce_extremes.py``)."""
    dtype = str(x.ty.dtype)
    bound = relax.const((tirx.min_value if largest else tirx.max_value)(dtype).value, dtype)
    at_bound = bb.emit(relax.op.astype(relax.op.equal(x, bound), "int8"))
    present = bb.emit(relax.op.astype(relax.op.max(at_bound, axes, keepdim), "bool"))
    infinite = relax.const(float("-inf") if largest else float("inf"), dtype)
    fixed = bb.emit(relax.op.where(present, bound, infinite))
    return bb.emit(relax.op.where(relax.op.equal(out, bound), fixed, out))


def _elementwise(op: Any, original: str) -> Any:
    def convert(node: Any, importer: Any) -> relax.Expr:
        bb = importer.block_builder
        lhs, rhs = (importer.env.get(a) if hasattr(a, "meta") else a for a in node.args[:2])
        if not all(_is_bool(v) for v in (lhs, rhs)):
            return type(importer).create_convert_map(importer)[original](node)
        as_int = [bb.emit(relax.op.astype(v, "int8")) for v in (lhs, rhs)]
        return bb.emit(relax.op.astype(bb.emit(op(*as_int)), "bool"))

    return convert


def _is_bool(value: object) -> bool:
    ty = getattr(value, "ty", None)
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "bool"


MINMAX_CONVERTERS = {
    "amax.default": _reduce(largest=True),
    "amin.default": _reduce(largest=False),
    "max.default": _reduce(largest=True),  # (no dim: every axis)
    "min.default": _reduce(largest=False),
    "maximum.default": _elementwise(relax.op.maximum, "maximum.default"),
    "minimum.default": _elementwise(relax.op.minimum, "minimum.default"),
    "max.other": _elementwise(relax.op.maximum, "max.other"),
    "min.other": _elementwise(relax.op.minimum, "min.other"),
}
