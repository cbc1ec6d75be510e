"""``argmax`` / ``argmin`` and ``max.dim`` / ``min.dim`` (values and indices) as torch gives
them, NaN and infinities included.

torch takes NaN as larger than every number for ``max`` / ``argmax`` and smaller than every
number for ``min`` / ``argmin``: a row holding a NaN has the NaN as its value and the index of
its *first* NaN; otherwise the index is that of the first extreme value (ties: the lowest
index; ``-0.0`` and ``0.0`` tie). TVM 0.27 breaks this silently: TOPI's argmax compares with
``>``, false for a NaN, so a NaN is skipped; it starts from (index -1, the lowest *finite*
value) and keeps the lower index of equal values, so a row of ``-inf`` (or of the lowest
finite value, or an integer row of the dtype's minimum) gets index -1; ``max.dim`` is a
``topk`` of one (a sort that puts NaN wherever) and ``min.dim`` has no converter. The
``PropagateNaN`` pass fixes ``max`` / ``min`` in TIR, not the index select of an argmax
reduction, so the rule is built here from Relax ops, for every target:

    key   = 2 where x is NaN, 1 where x is the reducer's starting value, else 0   (int8)
    index = where(argmax(x) < 0 or max(key) == 2, argmax(key), argmax(x))

``argmax(key)`` is the first NaN, else the first value at the start, else 0 (a row of
infinities); ``argmin`` alike, from the highest finite value. Half dtypes are compared as their
exact float32 values (TVM has no ``isnan`` for bfloat16, and its bfloat16 legalization fails on
argmax's reducer); bool inputs as 0/1 integers (LLVM refuses float compares on ``i1``; torch's
``argmax`` refuses bool, its ``max.dim`` takes it). The values of ``max.dim`` / ``min.dim`` are
``x`` gathered at the index, so a value is NaN (or infinite) exactly when torch's is.
``fn(node, importer) -> relax.Expr`` for the importer's ``custom_convert_map``.
"""

from __future__ import annotations

from typing import Any

from tvm import relax, tirx

__all__ = ["ARG_EXTREME_CONVERTERS"]

_HALF = ("float16", "bfloat16")


def _arg(node: Any, position: int, name: str, default: object) -> object:
    return node.args[position] if len(node.args) > position else node.kwargs.get(name, default)


def _index(bb: Any, x: relax.Expr, axis: int | None, keepdim: bool, largest: bool) -> relax.Expr:
    """The int64 index of the extreme of ``x`` along ``axis`` (None: of the flattened tensor),
    a NaN counting as the extreme, the first one winning (module docstring)."""
    dtype = str(x.ty.dtype)
    find = relax.op.argmax if largest else relax.op.argmin
    if dtype == "bool":  # (0 and 1: never the reducer's starting value)
        return bb.emit(find(bb.emit(relax.op.astype(x, "int8")), axis, keepdim))
    # half: exact in float32; TVM's bfloat16 legalization fails on argmax's reducer
    work = bb.emit(relax.op.astype(x, "float32")) if dtype in _HALF else x
    index = bb.emit(find(work, axis, keepdim))
    wdtype = str(work.ty.dtype)
    start = (tirx.min_value if largest else tirx.max_value)(wdtype).value
    key = relax.op.astype(relax.op.equal(work, relax.const(start, wdtype)), "int8")
    take = relax.op.less(index, relax.const(0, "int64"))  # nothing beat the starting value
    if wdtype.startswith("float"):
        key = relax.op.where(relax.op.isnan(work), relax.const(2, "int8"), key)
    key = bb.emit(key)
    # the first NaN, else the first value at the starting value, else 0 (all infinite)
    first = bb.emit(relax.op.argmax(key, axis, keepdim))
    if wdtype.startswith("float"):
        has_nan = relax.op.equal(relax.op.max(key, axis, keepdim), relax.const(2, "int8"))
        take = relax.op.logical_or(take, bb.emit(has_nan))
    return bb.emit(relax.op.where(bb.emit(take), first, index))


def _axis(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim  # (torch.export has checked the range)


def _arg_extreme(largest: bool) -> Any:
    """``argmax.default`` / ``argmin.default``."""

    def convert(node: Any, importer: Any) -> relax.Expr:
        bb = importer.block_builder
        x = importer.env[node.args[0]]
        dim = _arg(node, 1, "dim", None)
        keepdim = bool(_arg(node, 2, "keepdim", False))
        rank = x.ty.ndim
        if rank == 0:
            return relax.const(0, "int64")  # torch: a 0-d tensor's index is 0
        axis = None if dim is None else _axis(dim, rank)
        return _index(bb, x, axis, keepdim, largest)

    convert.__name__ = "argmax" if largest else "argmin"
    return convert


def _extreme_dim(largest: bool) -> Any:
    """``max.dim`` / ``min.dim``: ``(values, indices)``."""

    def convert(node: Any, importer: Any) -> relax.Expr:
        bb = importer.block_builder
        x = importer.env[node.args[0]]
        dim = _arg(node, 1, "dim", None)
        keepdim = bool(_arg(node, 2, "keepdim", False))
        rank = x.ty.ndim
        if rank == 0:  # torch: the tensor itself, index 0
            return bb.emit(relax.Tuple([x, relax.const(0, "int64")]))
        axis = _axis(dim, rank)
        index = _index(bb, x, axis, True, largest)
        values = bb.emit(relax.op.gather_elements(x, index, axis))
        if not keepdim:
            values = bb.emit(relax.op.squeeze(values, [axis]))
            index = bb.emit(relax.op.squeeze(index, [axis]))
        return bb.emit(relax.Tuple([values, index]))

    convert.__name__ = "max_dim" if largest else "min_dim"
    return convert


ARG_EXTREME_CONVERTERS = {
    "argmax.default": _arg_extreme(largest=True),
    "argmin.default": _arg_extreme(largest=False),
    "max.dim": _extreme_dim(largest=True),
    "min.dim": _extreme_dim(largest=False),
}
