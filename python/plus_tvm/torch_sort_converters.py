"""``sort`` / ``argsort`` / ``topk`` / ``median`` of float tensors with torch's NaN order.

torch orders NaN above every number (``+inf`` included): an ascending sort puts the NaNs last,
a descending one first, and ``topk`` takes them as the largest values. TVM 0.27 sorts with
``<`` / ``>``, which are false for a NaN, so a NaN left the comparison sort's order undefined:
a row holding a NaN came back unsorted (``[1, nan, -inf, 2, 3]``), ``topk`` picked finite values
past a NaN. Here the order is two stable sorts (TVM's CPU sort is ``std::stable_sort``):

    first  = argsort(where(isnan(x), inf, x))         NaN tied with +inf, in row order
    second = argsort(isnan(x) gathered at first)      NaN last (first when descending)
    order  = first gathered at second

the values are ``x`` gathered at the order and ``topk`` its first ``k``; ``median`` (the lower
one, as torch's) is NaN with the index of the first NaN in a row holding one. Half-precision rows
are ordered by their exact float32 values; integer and bool rows keep TVM's converters.
``fn(node, importer) -> relax.Expr`` for the importer's ``custom_convert_map``.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

__all__ = ["SORT_CONVERTERS"]

_HALF = ("float16", "bfloat16")


def _arg(node: Any, position: int, name: str, default: object) -> object:
    return node.args[position] if len(node.args) > position else node.kwargs.get(name, default)


def _is_float(x: relax.Expr) -> bool:
    return str(x.ty.dtype).startswith(("float", "bfloat"))


def nan_order(bb: Any, x: relax.Expr, axis: int, descending: bool) -> relax.Expr:
    """The int64 order that sorts ``x`` along ``axis`` with NaN above ``+inf`` (docstring)."""
    work = bb.emit(relax.op.astype(x, "float32")) if str(x.ty.dtype) in _HALF else x
    nan = bb.emit(relax.op.isnan(work))
    key = bb.emit(relax.op.where(nan, relax.const(float("inf"), str(work.ty.dtype)), work))
    first = bb.emit(relax.op.argsort(key, axis, descending, "int64"))
    nan_at = bb.emit(relax.op.gather_elements(relax.op.astype(nan, "int32"), first, axis))
    second = bb.emit(relax.op.argsort(nan_at, axis, descending, "int64"))
    return bb.emit(relax.op.gather_elements(first, second, axis))


def _original(importer: Any, key: str) -> Any:
    return type(importer).create_convert_map(importer)[key]


def _axis(x: relax.Expr, dim: int) -> int:
    return dim + x.ty.ndim if dim < 0 else dim


def sort(node: Any, importer: Any) -> relax.Expr:
    """``sort.default``: ``(values, indices)``."""
    x = importer.env[node.args[0]]
    if not _is_float(x) or x.ty.ndim == 0:
        return _original(importer, "sort.default")(node)
    bb = importer.block_builder
    axis = _axis(x, _arg(node, 1, "dim", -1))
    order = nan_order(bb, x, axis, bool(_arg(node, 2, "descending", False)))
    values = bb.emit(relax.op.gather_elements(x, order, axis))
    return bb.emit(relax.Tuple([values, order]))


def argsort(node: Any, importer: Any) -> relax.Expr:
    """``argsort.default``."""
    x = importer.env[node.args[0]]
    if not _is_float(x) or x.ty.ndim == 0:
        return _original(importer, "argsort.default")(node)
    axis = _axis(x, _arg(node, 1, "dim", -1))
    return nan_order(importer.block_builder, x, axis, bool(_arg(node, 2, "descending", False)))


def topk(node: Any, importer: Any) -> relax.Expr:
    """``topk.default``: ``(values, indices)``, the first ``k`` of the NaN-aware order."""
    x = importer.env[node.args[0]]
    if not _is_float(x) or x.ty.ndim == 0 or not bool(_arg(node, 4, "sorted", True)):
        return _original(importer, "topk.default")(node)
    bb = importer.block_builder
    k = _arg(node, 1, "k", 1)
    axis = _axis(x, _arg(node, 2, "dim", -1))
    order = nan_order(bb, x, axis, descending=bool(_arg(node, 3, "largest", True)))
    order = bb.emit(relax.op.strided_slice(order, [axis], [0], [k]))
    values = bb.emit(relax.op.gather_elements(x, order, axis))
    return bb.emit(relax.Tuple([values, order]))


def _median_index(bb: Any, x: relax.Expr, axis: int) -> relax.Expr | None:
    """The (keepdim) int64 index of the lower median along ``axis``, that of the first NaN in
    a row holding one (torch's median is NaN there); None when the shape is unknown."""
    if x.ty.shape is None:
        return None
    order = nan_order(bb, x, axis, descending=False)
    size = x.ty.shape.values[axis]
    if isinstance(size, tvm.tirx.IntImm):
        middle = (int(size) - 1) // 2
        index = bb.emit(relax.op.strided_slice(order, [axis], [middle], [middle + 1]))
    else:  # a symbolic size: the middle position computed at run time
        sizes = bb.emit(relax.op.shape_to_tensor(bb.emit(relax.op.shape_of(x))))
        size = bb.emit(relax.op.take(sizes, relax.const(axis, "int64"), axis=0))
        one, two = relax.const(1, "int64"), relax.const(2, "int64")
        middle = bb.emit(relax.op.floor_divide(relax.op.subtract(size, one), two))
        middle = bb.emit(relax.op.reshape(middle, [1]))
        index = bb.emit(relax.op.take(order, middle, axis=axis))
    work = bb.emit(relax.op.astype(x, "float32")) if str(x.ty.dtype) in _HALF else x
    nan = bb.emit(relax.op.astype(relax.op.isnan(work), "int8"))
    has_nan = bb.emit(relax.op.astype(relax.op.max(nan, [axis], True), "bool"))
    first_nan = bb.emit(relax.op.argmax(nan, axis, True))  # (TOPI: the lowest index of the 1s)
    return bb.emit(relax.op.where(has_nan, first_nan, index))


def median_dim(node: Any, importer: Any) -> relax.Expr:
    """``median.dim``: ``(values, indices)``, the lower median, NaN for a row holding one."""
    x = importer.env[node.args[0]]
    if not _is_float(x) or x.ty.ndim == 0:
        return _original(importer, "median.dim")(node)
    bb = importer.block_builder
    axis = _axis(x, _arg(node, 1, "dim", -1))
    index = _median_index(bb, x, axis)
    if index is None:
        return _original(importer, "median.dim")(node)
    values = bb.emit(relax.op.gather_elements(x, index, axis))
    if not bool(_arg(node, 2, "keepdim", False)):
        values = bb.emit(relax.op.squeeze(values, [axis]))
        index = bb.emit(relax.op.squeeze(index, [axis]))
    return bb.emit(relax.Tuple([values, index]))


def median(node: Any, importer: Any) -> relax.Expr:
    """``median.default``: the lower median of every element, NaN when one is NaN."""
    x = importer.env[node.args[0]]
    if not _is_float(x) or x.ty.ndim == 0:
        return _original(importer, "median.default")(node)
    bb = importer.block_builder
    flat = bb.emit(relax.op.reshape(x, [-1]))
    index = _median_index(bb, flat, 0)
    if index is None:
        return _original(importer, "median.default")(node)
    value = bb.emit(relax.op.gather_elements(flat, index, 0))
    return bb.emit(relax.op.reshape(value, []))


SORT_CONVERTERS = {
    "median.dim": median_dim,
    "median.default": median,
    "sort.default": sort,
    "argsort.default": argsort,
    "topk.default": topk,
}
