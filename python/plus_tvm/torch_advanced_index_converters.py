"""torch's advanced indexing (``x[i, :, j]``, ``x[mask]``, ``y[mask] = v``, ``index_put``)
imported with torch's semantics.

TVM 0.27's converters for ``aten.index.Tensor`` and ``aten.index_put`` get several cases wrong:

- ``index.Tensor`` with a slice between or before index tensors (``x[:, i, j]``,
  ``x[i, :, j]``) reshapes the slice's ``arange`` to ``[n, 1, ...]`` whatever its place, so
  shapes do not broadcast ("index_tensor: cannot broadcast index shapes": ConvBERT's
  ``F.unfold``) or index tensors are combined as an outer product (wrong values);
- a boolean index (``h[mask]``) is passed to ``take`` as it is ("requires integer dtype");
- ``index_put`` needs one index per data axis ("IndexPut requires the number of index tensors
  (1) to match"): ``index_add``, which torch decomposes into ``index_put(accumulate=True)``,
  and ``x[i] += v`` fail; a boolean index (``y[mask] = 0``) is refused; and TVM's kernel adds
  in a parallel loop, so duplicate indices with ``accumulate=True`` race.

Here, following torch's rules (``torch/_refs``, ``aten/native/TensorAdvancedIndexing``):

- integer index tensors broadcast together to a shape ``B``; when they sit on adjacent axes,
  ``B`` takes their place in the result, else it comes first; every other axis is a slice.
  ``index.Tensor`` becomes one ``index_tensor`` with an index per axis, each placed on its
  result axes (``CheckIndexBounds`` checks ``[-n, n)`` and maps negatives; a single index
  tensor too: as a ``take``, an index that is a model input was refused when negative);
- ``index_put`` is a ``scatter_elements`` over the flattened tensor at the flat offsets of the
  indexed elements (``add`` for ``accumulate=True``: a serial loop, so duplicates add up as in
  torch), each index checked against ``[-n, n)`` with the node's name and negatives mapped;
- a boolean mask over axes ``p .. p+k`` selects its ``True`` positions in row-major order:
  ``x[mask]`` is a gather at ``nonzero(mask)`` (its length is known only as the model runs);
  ``y[mask] = v`` is a ``where`` over the mask with ``v`` broadcast, or with the ``k``-th
  value taken for the ``k``-th ``True`` position when ``v`` has one value per position
  (``y[mask] = z[mask]``); ``accumulate=True`` adds instead.

A boolean mask combined with integer index tensors in the same indexing, or two masks, is
refused with an :class:`~plus_tvm.errors.UnsupportedOperatorError` naming the node.
``fn(node, importer) -> relax.Expr`` for the importer's ``custom_convert_map``.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from .errors import UnsupportedOperatorError
from .torch_index_converters import _checked

__all__ = ["ADVANCED_INDEX_CONVERTERS", "index_put", "index_tensor"]


def _refuse(node: Any, what: str) -> UnsupportedOperatorError:
    from .frontend import node_location

    return UnsupportedOperatorError(
        f"torch operator {node.target} at node '{node.name}'{node_location(node)}: {what} "
        "is not supported"
    )


def _is_mask(expr: relax.Expr) -> bool:
    return str(expr.ty.dtype) in ("bool", "uint8")  # (uint8 indices are masks in torch)


def _dims(expr: relax.Expr) -> list:
    return list(expr.ty.shape.values)


def _slots(node: Any, importer: Any, x: relax.Expr, indices: Any) -> tuple[list, Any]:
    """Per data axis: None (a slice) or an integer index tensor; and the mask, if any, as
    ``(first axis, mask)``."""
    rank = x.ty.ndim
    slots: list = []
    mask = None
    for index in indices:
        expr = importer.env[index] if index is not None else None
        if expr is not None and _is_mask(expr):
            if mask is not None:
                raise _refuse(node, "indexing with two boolean masks")
            if expr.ty.ndim == 0:
                raise _refuse(node, "a 0-d boolean index")
            if str(expr.ty.dtype) != "bool":
                expr = importer.block_builder.emit(relax.op.astype(expr, "bool"))
            mask = (len(slots), expr)
            slots.extend([None] * expr.ty.ndim)
        else:
            slots.append(expr)
    if len(slots) > rank:
        raise _refuse(node, f"{len(slots)} indices for a {rank}-d tensor")
    slots.extend([None] * (rank - len(slots)))
    if mask is not None and any(s is not None for s in slots):
        raise _refuse(node, "a boolean mask combined with integer index tensors")
    return slots, mask


def _placed(bb: relax.BlockBuilder, expr: relax.Expr, rank: int, at: int, total: int) -> relax.Expr:
    """``expr`` (rank ``rank``, right-aligned to ``rank`` axes) with unit axes so that its axes
    are ``at .. at + rank`` of a ``total``-d tensor."""
    if expr.ty.ndim < rank:  # broadcast rule: missing leading axes are 1
        expr = relax.op.expand_dims(expr, list(range(rank - expr.ty.ndim)))
    extra = list(range(at)) + list(range(at + rank, total))
    if extra:
        expr = relax.op.expand_dims(expr, extra)
    return bb.emit(expr)


def _layout(slots: list) -> tuple[list[int], int, bool]:
    """Indexed axes, the broadcast rank of their index tensors, whether they are adjacent."""
    axes = [d for d, s in enumerate(slots) if s is not None]
    rank = max(slots[d].ty.ndim for d in axes)
    adjacent = axes == list(range(axes[0], axes[-1] + 1))
    return axes, rank, adjacent


def _per_axis_indices(bb: relax.BlockBuilder, x: relax.Expr, slots: list) -> list[relax.Expr]:
    """One int64 index per data axis, placed on the axes of the indexing's result."""
    axes, brank, adjacent = _layout(slots)
    dims = _dims(x)
    sliced = [d for d in range(len(slots)) if slots[d] is None]
    total = len(sliced) + brank
    bpos = axes[0] if adjacent else 0
    out = []
    for d, slot in enumerate(slots):
        if slot is not None:
            index = slot
            if str(index.ty.dtype) != "int64":
                index = bb.emit(relax.op.astype(index, "int64"))
            out.append(_placed(bb, index, brank, bpos, total))
            continue
        if adjacent:  # slices before the indexed axes, B, slices after
            at = d if d < axes[0] else d - len(axes) + brank
        else:  # B first, then the slices in order
            at = brank + sliced.index(d)
        ramp = bb.emit(relax.op.arange(0, dims[d], 1, "int64"))
        out.append(_placed(bb, ramp, 1, at, total))
    return out


def _nonzero_count(node: Any, axis: int) -> object:
    val = node.meta.get("val")
    size = val.shape[axis] if val is not None and len(val.shape) > axis else None
    if isinstance(size, int):
        return size
    return tvm.tirx.Var(f"{node.name}_selected", "int64")


def _mask_positions(node: Any, importer: Any, mask: relax.Expr, axis: int) -> relax.Expr:
    """The flat positions of ``mask``'s ``True`` values (length known as the model runs)."""
    bb = importer.block_builder
    flat = bb.emit(relax.op.reshape(mask, [-1]))
    found = bb.emit(relax.op.nonzero(flat))
    found = bb.match_cast(found, relax.TensorType([1, _nonzero_count(node, axis)], "int64"))
    return bb.emit(relax.op.squeeze(found, axis=[0]))


def index_tensor(node: Any, importer: Any) -> relax.Expr:
    """``aten.index.Tensor(x, indices)``: ``x[indices]`` (None entries are slices)."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    if x.ty.shape is None:  # a shape Relax does not know: 0.27's own converter
        from .torch_fixes import _original

        return _original(importer, "index.Tensor")(node)
    slots, mask = _slots(node, importer, x, node.args[1])
    if mask is not None:  # x[mask]: the masked axes become one axis of the True positions
        at, m = mask
        dims = _dims(x)
        k = m.ty.ndim
        merged = bb.emit(relax.op.reshape(x, [*dims[:at], -1, *dims[at + k :]]))
        return bb.emit(relax.op.take(merged, _mask_positions(node, importer, m, at), axis=at))
    if all(s is None for s in slots):
        return x
    return bb.emit(relax.op.index_tensor(x, _per_axis_indices(bb, x, slots)))


def _values(importer: Any, x: relax.Expr, values: Any) -> relax.Expr:
    dtype = str(x.ty.dtype)
    if isinstance(values, (bool, int, float)):
        return relax.const(values, dtype)
    expr = importer.env[values]
    if str(expr.ty.dtype) != dtype:
        expr = importer.block_builder.emit(relax.op.astype(expr, dtype))
    return expr


def _put_at_mask(
    node: Any, importer: Any, x: relax.Expr, mask: tuple, values: relax.Expr, accumulate: bool
) -> relax.Expr:
    bb = importer.block_builder
    at, m = mask
    k = m.ty.ndim
    rank = x.ty.ndim
    result_rank = rank - k + 1  # the masked axes are one axis of the True positions
    vrank = values.ty.ndim
    if vrank > result_rank:
        raise _refuse(node, f"values of rank {vrank} for an indexing result of rank {result_rank}")
    full = values
    if vrank < result_rank:
        full = bb.emit(relax.op.expand_dims(values, list(range(result_rank - vrank))))
    vdims = _dims(full)
    one_per_position = not (isinstance(vdims[at], tvm.tirx.IntImm) and int(vdims[at]) == 1)
    if one_per_position:  # the k-th True position takes the k-th value
        flat = bb.emit(relax.op.astype(bb.emit(relax.op.reshape(m, [-1])), "int64"))
        rank_of = bb.emit(relax.op.subtract(relax.op.cumsum(flat, 0), relax.const(1, "int64")))
        rank_of = bb.emit(relax.op.maximum(rank_of, relax.const(0, "int64")))
        # one spare value so that an all-False mask (no values) still reads inside the tensor
        spare_shape = [*vdims[:at], 1, *vdims[at + 1 :]]
        spare = relax.op.zeros(relax.ShapeExpr(spare_shape), str(full.ty.dtype))
        padded = bb.emit(relax.op.concat([full, spare], axis=at))
        taken = bb.emit(relax.op.take(padded, rank_of, axis=at))
        mdims = _dims(m)
        tdims = _dims(taken)
        full = bb.emit(relax.op.reshape(taken, [*tdims[:at], *mdims, *tdims[at + 1 :]]))
    else:  # one value for every position: broadcast over the mask's axes
        if k > 1:
            full = bb.emit(relax.op.expand_dims(full, list(range(at + 1, at + k))))
    where = _placed(bb, m, k, at, rank)
    if accumulate:
        full = bb.emit(relax.op.add(x, full))
    return bb.emit(relax.op.where(where, full, x))


def _static(value: object) -> object:
    return int(value) if isinstance(value, tvm.tirx.IntImm) else value


def _scalar_tensor(value: object) -> relax.Expr:
    if isinstance(value, (int, tvm.tirx.IntImm)):
        return relax.const(int(value), "int64")
    # a symbolic extent: its value as a 0-d tensor
    return relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([value])), [])


def index_put(node: Any, importer: Any) -> relax.Expr:
    """``aten.index_put(x, indices, values, accumulate=False)``: ``x[indices] = values`` (or
    ``+=`` with ``accumulate``) on a copy of ``x``."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    indices = node.args[1] if len(node.args) > 1 else node.kwargs["indices"]
    accumulate = bool(node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False))
    raw_values = node.args[2] if len(node.args) > 2 else node.kwargs["values"]
    if x.ty.shape is None:  # a shape Relax does not know: 0.27's own converter
        from .torch_fixes import _original

        return _original(importer, "index_put.default")(node)
    slots, mask = _slots(node, importer, x, indices)
    values = _values(importer, x, raw_values)
    if mask is not None:
        return _put_at_mask(node, importer, x, mask, values, accumulate)
    if all(s is None for s in slots):  # x[...] = v
        v = bb.emit(relax.op.broadcast_to(values, relax.ShapeExpr(_dims(x))))
        return bb.emit(relax.op.add(x, v)) if accumulate else v
    dims = _dims(x)
    checked = list(slots)
    for d, slot in enumerate(slots):  # torch's range [-n, n), negatives from the end
        if slot is None:
            continue
        index = _checked(importer, node, slot, dims[d], "index_put", negative=True)
        if str(index.ty.dtype) != "int64":
            index = bb.emit(relax.op.astype(index, "int64"))
        extent = _scalar_tensor(dims[d])
        wrapped = relax.op.where(
            relax.op.less(index, relax.const(0, "int64")), relax.op.add(index, extent), index
        )
        checked[d] = bb.emit(wrapped)
    per_axis = _per_axis_indices(bb, x, checked)
    offset = None
    stride: object = 1
    for d in reversed(range(len(dims))):  # the flat offset of every indexed element
        term = per_axis[d]
        if not (isinstance(stride, int) and stride == 1):
            term = relax.op.multiply(term, _scalar_tensor(stride))
        offset = term if offset is None else relax.op.add(offset, term)
        stride = _static(dims[d]) * stride
    offset = bb.emit(offset)
    result_shape = relax.ShapeExpr(_dims(offset))
    flat_offset = bb.emit(relax.op.reshape(offset, [-1]))
    spread = bb.emit(relax.op.broadcast_to(values, result_shape))
    flat_values = bb.emit(relax.op.reshape(spread, [-1]))
    flat = bb.emit(relax.op.reshape(x, [-1]))
    reduction = "add" if accumulate else "update"
    out = bb.emit(relax.op.scatter_elements(flat, flat_offset, flat_values, 0, reduction))
    return bb.emit(relax.op.reshape(out, relax.ShapeExpr(dims)))


#: ATen overload -> converter
ADVANCED_INDEX_CONVERTERS = {
    "index.Tensor": index_tensor,
    "index_put.default": index_put,
}
