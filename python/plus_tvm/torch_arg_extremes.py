"""``argmax`` / ``argmin`` and ``max.dim`` / ``min.dim`` (values and indices) with torch's
NaN rule.

torch takes NaN as larger than every number for ``max`` / ``argmax`` and smaller than every
number for ``min`` / ``argmin``: a row holding a NaN has the NaN as its value and the index of
its *first* NaN; otherwise the index is that of the first extreme value (ties: the lowest
index; ``-0.0`` and ``0.0`` tie). TVM 0.27's converters break this silently: ``argmax`` /
``argmin`` compare with ``>`` / ``<``, which are false for a NaN, so a NaN is skipped or its
row's index is arbitrary; ``max.dim`` is a ``topk`` of one (a sort that sorts NaN wherever), and
``min.dim`` has no converter at all. ``PropagateNaN`` (the pipeline pass) fixes ``max`` / ``min``
in TIR, not the index select of an argmax reduction, so the NaN rule is built here from Relax
ops, for every target:

    nan   = isnan(x) as int8
    index = where(max(nan) > 0, argmax(nan), argmax(x))

(``argmax`` of the 0/1 mask is its first 1: TOPI's argmax keeps the lowest index of equal
values; half dtypes are compared as their exact float32 values: TVM has no ``isnan`` for
bfloat16, and its bfloat16 legalization fails on argmax's reducer). The values of ``max.dim``
/ ``min.dim`` are ``x`` gathered at the index, so a value is NaN exactly when torch's is.
Integer inputs take the plain ``argmax``; bool inputs are compared as 0/1 integers (LLVM
refuses float compares on ``i1``; torch's ``argmax`` refuses bool, its ``max.dim`` takes it).
``fn(node, importer) -> relax.Expr`` for the importer's ``custom_convert_map``.
"""

from __future__ import annotations

from typing import Any

from tvm import relax

__all__ = ["ARG_EXTREME_CONVERTERS"]

_HALF = ("float16", "bfloat16")


def _arg(node: Any, position: int, name: str, default: object) -> object:
    return node.args[position] if len(node.args) > position else node.kwargs.get(name, default)


def _index(bb: Any, x: relax.Expr, axis: int | None, keepdim: bool, largest: bool) -> relax.Expr:
    """The int64 index of the extreme of ``x`` along ``axis`` (None: of the flattened tensor),
    a NaN counting as the extreme, the first one winning."""
    dtype = str(x.ty.dtype)
    find = relax.op.argmax if largest else relax.op.argmin
    if dtype == "bool":
        work = bb.emit(relax.op.astype(x, "int8"))
    elif dtype in _HALF:  # (exact; TVM's bfloat16 legalization fails on argmax's reducer)
        work = bb.emit(relax.op.astype(x, "float32"))
    else:
        work = x
    index = bb.emit(find(work, axis, keepdim))
    if not dtype.startswith(("float", "bfloat")):
        return index
    nan = bb.emit(relax.op.astype(relax.op.isnan(work), "int8"))
    first_nan = bb.emit(relax.op.argmax(nan, axis, keepdim))
    has_nan = bb.emit(relax.op.astype(relax.op.max(nan, axis, keepdim), "bool"))
    return bb.emit(relax.op.where(has_nan, first_nan, index))


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
