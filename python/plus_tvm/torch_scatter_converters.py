"""``scatter_add`` and ``scatter_reduce``, which TVM 0.27's torch importer has no converter for.

Both become Relax's ``scatter_elements``, whose kernel runs the indexed axis in a serial loop,
so duplicate indices accumulate as in torch. ``index`` is checked against ``[0, n)`` with the
node's name (torch counts no index from the end here); ``src`` is cut to ``index``'s shape
(torch reads only that part of it). ``scatter_reduce(x, dim, index, src, reduce,
include_self=True)`` follows ATen's CPU kernel:

- ``sum`` / ``prod`` / ``amax`` / ``amin``: the reduction of ``x``'s element (unless
  ``include_self=False``: then the positions ``index`` names start from the reduction's
  identity, ``0``, ``1``, the lowest or the highest value of the dtype) and the ``src``
  values scattered there; positions no index names keep ``x``'s value;
- ``mean``: the sum divided by the count of values summed (``x``'s element counted when
  ``include_self``), floor division for integer dtypes; positions no index names keep ``x``.

``fn(node, importer) -> relax.Expr`` for the importer's ``custom_convert_map``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import relax

from .errors import InputRefusedError
from .torch_index_converters import _checked

__all__ = ["SCATTER_CONVERTERS"]

_REDUCTIONS = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "mean": "add"}


def _arg(node: Any, position: int, name: str, default: object = None) -> object:
    return node.args[position] if len(node.args) > position else node.kwargs.get(name, default)


def _operands(node: Any, importer: Any, op: str) -> tuple:
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    rank = x.ty.ndim
    dim = int(_arg(node, 1, "dim"))
    dim = dim + rank if dim < 0 else dim
    index = importer.env[_arg(node, 2, "index")]
    src = importer.env[_arg(node, 3, "src")]
    extent = list(x.ty.shape.values)[dim]
    index = _checked(importer, node, index, extent, op)
    if str(src.ty.dtype) != str(x.ty.dtype):
        src = bb.emit(relax.op.astype(src, str(x.ty.dtype)))
    idims, sdims = list(index.ty.shape.values), list(src.ty.shape.values)
    if any(not _same(a, b) for a, b in zip(idims, sdims)):  # torch reads src[:index.shape]
        src = bb.emit(
            relax.op.strided_slice(src, list(range(rank)), [0] * rank, idims, assume_inbound=True)
        )
    return x, dim, index, src


def _same(a: object, b: object) -> bool:
    try:
        return int(a) == int(b)
    except TypeError:
        return a.same_as(b)


def scatter_add(node: Any, importer: Any) -> relax.Expr:
    """``aten.scatter_add(x, dim, index, src)``: ``x[index[i][j]][j] += src[i][j]`` (dim 0)."""
    x, dim, index, src = _operands(node, importer, "scatter_add")
    return importer.block_builder.emit(relax.op.scatter_elements(x, index, src, dim, "add"))


def _identity(reduce: str, dtype: str) -> relax.Expr:
    if reduce in ("sum", "mean"):
        value: object = 0
    elif reduce == "prod":
        value = 1
    elif dtype == "bool":
        value = reduce == "amin"
    elif dtype.startswith(("float", "bfloat")):
        value = float("-inf") if reduce == "amax" else float("inf")
    else:
        info = np.iinfo(dtype)
        value = int(info.min) if reduce == "amax" else int(info.max)
    return relax.const(value, dtype)


def scatter_reduce(node: Any, importer: Any) -> relax.Expr:
    """``aten.scatter_reduce.two(x, dim, index, src, reduce, include_self=True)``."""
    bb = importer.block_builder
    reduce = str(_arg(node, 4, "reduce"))
    if reduce not in _REDUCTIONS:
        raise InputRefusedError(
            f"scatter_reduce: reduce must be one of {', '.join(_REDUCTIONS)}, got {reduce!r}"
        )
    include_self = bool(_arg(node, 5, "include_self", True))
    x, dim, index, src = _operands(node, importer, "scatter_reduce")
    dtype = str(x.ty.dtype)
    counts = None
    if reduce == "mean" or not include_self:
        # how many src values land on each position of x
        ones = bb.emit(relax.op.ones_like(src, "int64"))
        start = relax.op.zeros_like(x, "int64")
        counts = bb.emit(relax.op.scatter_elements(start, index, ones, dim, "add"))
    base = x
    if not include_self:
        named = bb.emit(relax.op.greater(counts, relax.const(0, "int64")))
        base = bb.emit(relax.op.where(named, _identity(reduce, dtype), x))
    out = bb.emit(relax.op.scatter_elements(base, index, src, dim, _REDUCTIONS[reduce]))
    if reduce != "mean":
        return out
    total = counts
    if include_self:
        total = bb.emit(relax.op.add(counts, relax.const(1, "int64")))
    divisor = bb.emit(relax.op.astype(relax.op.maximum(total, relax.const(1, "int64")), dtype))
    if dtype.startswith(("float", "bfloat")):
        mean = bb.emit(relax.op.divide(out, divisor))
    else:
        mean = bb.emit(relax.op.floor_divide(out, divisor))
    named = bb.emit(relax.op.greater(counts, relax.const(0, "int64")))
    return bb.emit(relax.op.where(named, mean, x))


SCATTER_CONVERTERS = {
    "scatter_add.default": scatter_add,
    "scatter_reduce.two": scatter_reduce,
}
