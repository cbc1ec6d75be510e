"""CheckIndexBounds: no gather or scatter reads or writes outside its tensor.

TVM's indexing kernels (``take``, ``gather_elements``, ``gather_nd``, ``scatter_elements``,
``scatter_nd``, ``index_tensor``, ``index_put``) have no bounds checks: an index computed
inside the model (``i + 1``) and out of range reads neighbouring memory, writes past the
buffer, or ends the process. This pass puts every index operand through
``plus.check_indices`` (:mod:`plus_tvm.runtime.index_check`), which raises an error naming the
operator, the binding, the value and its position, and the model input the index is a view
of, with the range the kernel accepts:

- ``take`` in ``wrap`` mode (``WrapTakeIndices``), ``scatter_elements`` and ``index_put``
  map ``-n..-1`` from the end: ``[-n, n)``; ``take`` in ``fast`` mode ``[0, n)``; ``clip``
  mode clamps by itself;
- ``gather_elements``: ``[0, n)`` (ONNX's importer maps negatives before it);
- ``gather_nd`` / ``scatter_nd``: coordinate ``j`` of each index tuple against the ``j``-th
  indexed axis, ``[0, n_j)``;
- ``index_tensor`` (torch's advanced indexing): ``[-n, n)`` per axis, then the negatives
  mapped (``where(i < 0, i + n, i)``): TVM's kernel does not, and returned wrong values.

An index operand that the frontend already checked (torch's gather, scatter, embedding and
index_select with torch's own ranges and the node's name) is left alone; a constant index is
checked here, at compile time. With ``on_host=False`` (GPU targets) indices are clamped into
range instead, in the graph: memory-safe without an error, since a host check would stop
CUDA-graph capture and synchronise on every call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..errors import IndexOutOfRangeError
from ..index_inputs import is_index_check, normalised_source, traced_input
from ..runtime import index_check
from ._dataflow_rewrite import op_name, rewrite_nested


@dataclass(frozen=True)
class _Indexing:
    """How an op indexes: its index operand's position and the range its kernel accepts."""

    position: int
    negative: bool  # -n..-1 valid (counted from the end)
    per_axis: bool = False  # a tuple of index tensors, one per leading data axis
    last: bool = False  # the index's last axis: one coordinate per indexed data axis
    normalise: bool = False  # negatives valid for the op, not for TVM's kernel: mapped here


# ops that hand every value of their operand on, in another shape
_VIEWS = frozenset(
    ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten", "relax.permute_dims")
)

_OPS = {
    "relax.take": _Indexing(1, negative=True),
    "relax.gather_elements": _Indexing(1, negative=False),
    "relax.gather_nd": _Indexing(1, negative=False, last=True),
    "relax.scatter_elements": _Indexing(1, negative=True),
    "relax.scatter_nd": _Indexing(1, negative=False, last=True),
    "relax.index_tensor": _Indexing(1, negative=True, per_axis=True, normalise=True),
    "relax.index_put": _Indexing(1, negative=True, per_axis=True),
}


@tvm.transform.module_pass(opt_level=0, name="CheckIndexBounds")
class CheckIndexBounds:
    """Check (CPU) or clamp (GPU) every index operand of an indexing op.

    Parameters
    ----------
    on_host : bool
        Check on the host and raise (CPU targets); False: clamp in the graph (GPU targets),
        the frontend's checks included.
    """

    def __init__(self, on_host: bool = True) -> None:
        self.on_host = on_host

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return rewrite_nested(mod, lambda block, func: _Checker(block, func, self.on_host))


class _Checker:
    """One dataflow block's rewrite (:func:`rewrite_nested`)."""

    def __init__(self, block: relax.DataflowBlock, func: relax.Function, on_host: bool) -> None:
        self.values = {b.var: b.value for b in block.bindings}
        self.inputs = _model_inputs(func)
        self.on_host = on_host

    def __call__(self, binding: relax.VarBinding, bb: relax.BlockBuilder) -> relax.Expr | None:
        call = binding.value
        if is_index_check(call):
            return None if self.on_host else _clamped(call.args[1], call, bb)
        how = _OPS.get(op_name(call))
        if how is None or not self._applies(call):
            return None
        node = binding.var.name
        op = op_name(call)
        # a take in fast mode (WrapTakeIndices makes them wrap) maps no negative index
        fast = op == "relax.take" and str(call.attrs.mode) == "fast"
        negative = how.negative and not fast
        args = list(call.args)
        data = call.args[0]
        if how.per_axis:
            fields = _tuple_fields(call.args[how.position], self.values)
            if fields is None:
                return None
            checked = [
                self._checked(f, [_dim(data, axis)], how, negative, f"{op} {node}[{axis}]", bb)
                for axis, f in enumerate(fields)
            ]
            if all(c is f for c, f in zip(checked, fields)):
                return None
            args[how.position] = relax.Tuple(checked)
        else:
            extents = _extents(call, op)
            if extents is None:
                return None
            index = call.args[how.position]
            checked = self._checked(index, extents, how, negative, f"{op} {node}", bb)
            if checked is index:
                return None
            args[how.position] = checked
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    def _view_chain(self, expr: relax.Expr):  # noqa: ANN202 - a generator of pairs
        """``(expr, its bound value)``, then the same for the source of every view ``expr`` is
        (views keep every value), until a value that is not a view."""
        for _ in range(16):  # (view chains are short)
            value = self.values.get(expr)
            yield expr, value
            if op_name(value) not in _VIEWS:
                return
            expr = value.args[0]

    def _checked_before(
        self, index: relax.Expr, extents: list, negative: bool, last: bool
    ) -> bool:
        """``index`` holds values a check of this range, or a narrower one, already passed:
        the frontend's (torch's embedding ids, checked before their reshape), or an earlier
        op's. Views keep every value; a coordinate axis (``last``) is taken as it is."""
        for _, value in self._view_chain(index):
            if is_index_check(value):
                fields = index_check.parse(str(value.args[3].value))
                seen = list(value.args[2].values)
                return (
                    len(seen) == len(extents)
                    and all(tvm_ffi.structural_equal(a, b) for a, b in zip(seen, extents))
                    and fields.get("last") == str(int(last))
                    and (negative or fields.get("neg") == "0")
                )
            if last:
                return False
        return False

    def _constant_through_views(self, index: relax.Expr) -> relax.Expr:
        """The constant ``index`` is a view of (a torch index tensor placed on its axes by
        ``expand_dims``), else ``index``."""
        for expr, value in self._view_chain(index):
            for found in (expr, value):
                if isinstance(found, tvm.ir.expr.Constant):
                    return found
        return index

    def _applies(self, call: relax.Call) -> bool:
        if op_name(call) == "relax.take":
            return str(call.attrs.mode) != "clip"
        return True

    def _checked(
        self,
        index: relax.Expr,
        extents: list | None,
        how: _Indexing,
        negative: bool,
        where: str,
        bb: relax.BlockBuilder,
    ) -> relax.Expr:
        """``index`` through a check (or a clamp), or ``index`` itself where nothing is
        needed (already checked, a constant in range). ``where``: the op and the binding."""
        if extents is None or any(e is None for e in extents):
            return index
        if self._checked_before(index, extents, negative, how.last):
            return index
        constant = index if how.last else self._constant_through_views(index)
        if isinstance(constant, tvm.ir.expr.Constant):  # checked here: a compile-time error
            _check_constant(constant, extents, negative, how.last, where)
            return _normalised(index, extents, how.normalise, how.last, bb)
        before = normalised_source(index, self.values)
        if before is not None and (_static(extents) is not None or not how.last):
            # ONNX's importer mapped -n..-1 already: check the model's own value against
            # [-n, n) (a -n - 1 would map into range) and map it again after the check
            checked = self._checked(before, extents, how, True, where, bb)
            return _normalised(checked, extents, True, how.last, bb)
        source = traced_input(index, self.values, self.inputs) or ""
        op, _, node = where.partition(" ")
        config = index_check.config_text(op, node, negative, how.last, source)
        check = relax.call_pure_packed(
            index_check.NAME,
            index,
            relax.ShapeExpr(extents),
            tvm.ir.StringImm(config),
            ty_args=index.ty,
        )
        if self.on_host:
            checked = bb.emit(check, "plus_checked")
        else:
            checked = _clamped(index, check, bb)
        return _normalised(checked, extents, how.normalise, how.last, bb)


def _model_inputs(func: relax.Function) -> dict:
    count = func.attrs.get("num_input") if func.attrs is not None else None
    params = list(func.params) if count is None else list(func.params)[: int(count)]
    return {p: p.name for p in params}


def _dim(data: relax.Expr, axis: int):  # noqa: ANN202
    ty = data.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = list(ty.shape.values)
    return dims[axis] if -len(dims) <= axis < len(dims) else None


def _extents(call: relax.Call, op: str) -> list | None:
    """The extents the index values are checked against (one, or one per coordinate)."""
    data, index = call.args[0], call.args[1]
    ty = data.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = list(ty.shape.values)
    if op in ("relax.gather_nd", "relax.scatter_nd"):
        ity = index.ty
        if not isinstance(ity, relax.TensorType) or ity.shape is None:
            return None
        k = ity.shape.values[-1]
        if not isinstance(k, tvm.tirx.IntImm):
            return None
        start = int(call.attrs.batch_dims) if op == "relax.gather_nd" else 0
        picked = dims[start : start + int(k)]
        return picked if len(picked) == int(k) else None
    axis = call.attrs.axis
    if axis is None:  # take over the flattened tensor
        total = tvm.tirx.IntImm("int64", 1)
        for d in dims:
            total = total * d
        return [total]
    axis = int(axis)
    return [dims[axis]] if -len(dims) <= axis < len(dims) else None


def _tuple_fields(expr: relax.Expr, values: dict) -> list | None:
    if isinstance(expr, relax.Tuple):
        return list(expr.fields)
    bound = values.get(expr)
    return list(bound.fields) if isinstance(bound, relax.Tuple) else None


def _static(extents: list) -> list[int] | None:
    if all(isinstance(e, tvm.tirx.IntImm) for e in extents):
        return [int(e) for e in extents]
    return None


def _check_constant(
    index: tvm.ir.expr.Constant, extents: list, negative: bool, last: bool, where: str
) -> None:
    static = _static(extents)
    if static is None:
        return
    values = index.value.numpy()
    found = index_check.first_out_of_range(values, static, negative, last)
    if found is not None:
        fields = {"op": where, "last": str(int(last))}
        raise IndexOutOfRangeError(index_check.message(fields, found, values.shape))


def _normalised(
    index: relax.Expr, extents: list, apply: bool, last: bool, bb: relax.BlockBuilder
) -> relax.Expr:
    """``where(i < 0, i + n, i)`` (``apply``: the op takes negatives and its kernel does not);
    ``last``: ``n`` per coordinate of the last axis (static extents)."""
    if not apply:
        return index
    dtype = str(index.ty.dtype)
    static = _static(extents)
    if last and static is not None:
        n = relax.const(np.asarray(static, dtype=dtype), dtype)
    elif isinstance(extents[0], tvm.tirx.IntImm):
        n = relax.const(int(extents[0]), dtype)
    else:  # a symbolic extent as a 0-d tensor
        as_tensor = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr(extents[:1])))
        n = bb.emit(relax.op.astype(relax.op.reshape(as_tensor, []), dtype))
    zero = relax.const(0, dtype)
    shifted = bb.emit(relax.op.add(index, n))
    negative = bb.emit(relax.op.less(index, zero))
    return bb.emit(relax.op.where(negative, shifted, index), "plus_index")


def _clamped(index: relax.Expr, check: relax.Call, bb: relax.BlockBuilder) -> relax.Expr:
    """The clamp a GPU build runs instead of the host check ``check`` of ``index``."""
    fields = index_check.parse(str(check.args[3].value))
    extents = _static(list(check.args[2].values))
    if extents is None:
        return index  # symbolic extents on GPU: left to the kernel (see the module docstring)
    dtype = str(index.ty.dtype)
    high = np.asarray(extents if fields.get("last") == "1" else extents[:1], dtype=dtype)
    low = -high if fields.get("neg") == "1" else np.zeros_like(high)
    clamped = relax.op.minimum(
        relax.op.maximum(index, relax.const(low, dtype)), relax.const(high - 1, dtype)
    )
    return bb.emit(clamped, "plus_clamped")
