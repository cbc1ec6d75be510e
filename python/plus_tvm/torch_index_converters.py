"""torch's indexing operators imported with torch's bounds: an index out of range raises.

TVM 0.27 imports ``embedding``, ``gather``, ``scatter`` and ``index_select`` as gathers and
scatters without bounds checks (and ``embedding`` casts its indices to int32 first, so an id
of ``2**32 + 3`` would read row 3). These converters emit the same ops with their index
operand put through ``plus.check_indices`` (:mod:`plus_tvm.runtime.index_check`) against
torch's range for the op, ``[0, n)`` (torch counts no index from the end for these), naming
the node and its source line; ``CheckIndexBounds`` then leaves them alone and checks every
other indexing op with the kernel's own range. Indices keep their dtype (int64).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from .runtime import index_check

Converter = Any


def _checked(
    importer: Any,
    node: Any,
    index: relax.Expr,
    extent: object,
    torch_op: str,
    negative: bool = False,
) -> relax.Expr:
    """``index`` put through ``plus.check_indices``: ``[0, extent)``, or ``[-extent, extent)``
    with ``negative``, naming the node."""
    from .frontend import node_location

    where = f"'{node.name}'{node_location(node)}"
    config = index_check.config_text(torch_op, where, negative=negative, last=False)
    check = relax.call_pure_packed(
        index_check.NAME,
        index,
        relax.ShapeExpr([extent]),
        tvm.ir.StringImm(config),
        ty_args=index.ty,
    )
    return importer.block_builder.emit(check)


def _axis_extent(data: relax.Expr, dim: int) -> object:
    dims = list(data.ty.shape.values)
    return dims[dim]


def embedding(node: Any, importer: Any) -> relax.Expr:
    """``aten.embedding(weight, indices, ...)``: rows of ``weight``, ids in ``[0, rows)``."""
    weight = importer.env[node.args[0]]
    indices = importer.env[node.args[1]]
    indices = _checked(importer, node, indices, _axis_extent(weight, 0), "embedding")
    bb = importer.block_builder
    if indices.ty.ndim == 1:
        return bb.emit(relax.op.take(weight, indices, axis=0))
    shape = list(indices.ty.shape.values)
    flat = bb.emit(relax.op.reshape(indices, [-1]))
    rows = bb.emit(relax.op.take(weight, flat, axis=0))
    return bb.emit(relax.op.reshape(rows, [*shape, weight.ty.shape.values[-1]]))


def _arg(node: Any, position: int, name: str, default: object = None) -> object:
    """An argument given by position or by keyword."""
    return node.args[position] if len(node.args) > position else node.kwargs.get(name, default)


def _dim(node: Any, rank: int) -> int:
    dim = _arg(node, 1, "dim", 0)
    return dim + rank if dim < 0 else dim


def gather(node: Any, importer: Any) -> relax.Expr:
    """``aten.gather(x, dim, index)``: ``index`` in ``[0, x.shape[dim])``."""
    x = importer.env[node.args[0]]
    dim = _dim(node, x.ty.ndim)
    index = importer.env[_arg(node, 2, "index")]
    index = _checked(importer, node, index, _axis_extent(x, dim), "gather")
    return importer.block_builder.emit(relax.op.gather_elements(x, index, axis=dim))


def scatter(node: Any, importer: Any) -> relax.Expr:
    """``aten.scatter(x, dim, index, src | value)``: ``index`` in ``[0, x.shape[dim])``."""
    x = importer.env[node.args[0]]
    dim = _dim(node, x.ty.ndim)
    index = importer.env[_arg(node, 2, "index")]
    index = _checked(importer, node, index, _axis_extent(x, dim), "scatter")
    src = _arg(node, 3, "src", node.kwargs.get("value"))
    bb = importer.block_builder
    if isinstance(src, (int, float)):  # scatter.value
        fill = relax.const(src, str(x.ty.dtype))
        src = bb.emit(relax.op.broadcast_to(fill, importer.shape_of(index)))
    else:
        src = importer.env[src]
    return bb.emit(relax.op.scatter_elements(x, index, src, axis=dim))


def index_select(node: Any, importer: Any) -> relax.Expr:
    """``aten.index_select(x, dim, index)``: ``index`` in ``[0, x.shape[dim])``."""
    x = importer.env[node.args[0]]
    dim = _dim(node, x.ty.ndim)
    index = importer.env[_arg(node, 2, "index")]
    index = _checked(importer, node, index, _axis_extent(x, dim), "index_select")
    return importer.block_builder.emit(relax.op.take(x, index, axis=dim))


#: ATen overload -> converter
INDEX_CONVERTERS: dict[str, Converter] = {
    "embedding.default": embedding,
    "gather.default": gather,
    "scatter.src": scatter,
    "scatter.value": scatter,
    "index_select.default": index_select,
}
