"""Which model inputs index into a tensor, and the values they may take.

TVM compiles ``take`` (embedding lookups, ONNX Gather) and the gather / scatter kernels without
bounds checks: an out-of-range token id reads or writes memory next to the table (id 100000
segfaults, id 1000 or -1 returns neighbouring numbers), where torch raises ``IndexError``. A
compiled model checks such inputs before it runs: this module finds them.

An input is an *index input* when a chain of value-preserving ops (cast, reshape, expand / squeeze
dims, transpose, flatten, broadcast) takes it to the index operand of ``take``,
``gather_elements`` or ``scatter_elements`` whose indexed axis has a static extent ``n``. Its
valid values are ``[0, n - 1]``, or ``[-n, n - 1]`` when the chain passes through ONNX's
negative-index normalisation (``where(i < 0, i + n, i)``) or the kernel itself maps negative
indices (``scatter_elements``). An input used in several places gets
the intersection of their ranges.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .frontend import num_inputs
from .runtime.index_check import NAME as CHECK_NAME
from .signature import IndexRange

# ops that hand every value of their first operand on unchanged
_VALUE_PRESERVING = frozenset(
    "relax." + name
    for name in (
        "astype",
        "reshape",
        "expand_dims",
        "squeeze",
        "permute_dims",
        "flatten",
        "broadcast_to",
    )
)
# op -> (position of the indexed tensor, position of the indices, whether the kernel itself
# maps -n..-1 to n-1..0: TVM's scatter_elements does, its take and gather_elements do not)
_INDEXING = {
    "relax.take": (0, 1, False),
    "relax.gather_elements": (0, 1, False),
    "relax.scatter_elements": (0, 1, True),
}


def index_input_ranges(mod: tvm.IRModule, func: str = "main") -> dict[str, IndexRange]:
    """The index inputs of ``func`` (by parameter name) and their valid ranges."""
    fn = mod[func]
    inputs = {p: p.name for p in fn.params[: num_inputs(mod, func)]}
    values: dict[relax.Var, relax.Expr] = {}
    uses: list[tuple[relax.Expr, relax.Expr, int | None, str]] = []
    for block in fn.body.blocks if isinstance(fn.body, relax.SeqExpr) else ():
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                continue
            values[binding.var] = binding.value
            call = binding.value
            if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op):
                slots = _INDEXING.get(call.op.name)
                if slots is not None:
                    axis = getattr(call.attrs, "axis", None)
                    axis = None if axis is None else int(axis)
                    data, indices, wraps = call.args[slots[0]], call.args[slots[1]], slots[2]
                    uses.append((data, indices, axis, call.op.name, wraps))
    ranges: dict[str, IndexRange] = {}
    for data, indices, axis, op, wraps in uses:
        traced = _trace(indices, values, inputs)
        if traced is None:
            continue
        name, negatives = traced
        negatives = negatives or wraps
        extent, shape = _extent(data, axis)
        if extent is None or extent < 1:
            continue
        where = f"along axis {axis} " if axis is not None else ""
        found = IndexRange(
            -extent if negatives else 0,
            extent - 1,
            f"indices of {op.removeprefix('relax.')} {where}of a {shape} tensor",
        )
        old = ranges.get(name)
        if old is not None:
            found = IndexRange(max(old.low, found.low), min(old.high, found.high), old.use)
        ranges[name] = found
    return ranges


def traced_input(expr: relax.Expr, values: dict, inputs: dict) -> str | None:
    """The name of the model input ``expr`` is a view of (``values``: the bindings by variable,
    ``inputs``: the model inputs' parameters to their names), else None."""
    traced = _trace(expr, values, inputs)
    return traced[0] if traced is not None else None


def normalised_source(expr: relax.Expr, values: dict) -> relax.Expr | None:
    """``i`` when ``expr`` is bound to ONNX's negative-index normalisation of it
    (``where(i < 0, i + n, i)``), else None."""
    value = values.get(expr)
    if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.where":
        if _normalises_negatives(value, values):
            return value.args[2]
    return None


def is_index_check(value: object) -> bool:
    """A ``plus.check_indices`` call (a runtime guard the frontend or ``CheckIndexBounds``
    puts on an index operand): its result is its first operand, unchanged."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return False
    callee = value.args[0] if value.op.name == "relax.call_pure_packed" and value.args else None
    return isinstance(callee, relax.ExternFunc) and str(callee.global_symbol) == CHECK_NAME


def _trace(expr: relax.Expr, values: dict, inputs: dict) -> tuple[str, bool] | None:
    """The model input ``expr`` carries unchanged, and whether negatives are normalised."""
    negatives = False
    for _ in range(64):  # chains are short; the bound only guards against cycles
        if expr in inputs:
            return inputs[expr], negatives
        value = values.get(expr)
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        if is_index_check(value):
            expr = value.args[1]
        elif value.op.name in _VALUE_PRESERVING:
            if not _integer(value.args[0]):
                return None
            expr = value.args[0]
        elif value.op.name == "relax.where" and _normalises_negatives(value, values):
            negatives = True
            expr = value.args[2]
        else:
            return None
    return None


def _normalises_negatives(where: relax.Call, values: dict) -> bool:
    """``where(less(i, 0), add(i, n), i)``: ONNX's Gather maps ``-n..-1`` to ``0..n-1``."""
    cond = values.get(where.args[0], where.args[0])
    shifted = values.get(where.args[1], where.args[1])
    index = where.args[2]
    return (
        isinstance(cond, relax.Call)
        and getattr(cond.op, "name", "") == "relax.less"
        and cond.args[0].same_as(index)
        and isinstance(shifted, relax.Call)
        and getattr(shifted.op, "name", "") == "relax.add"
        and shifted.args[0].same_as(index)
    )


def _integer(expr: relax.Expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype).startswith(("int", "uint"))


def _extent(data: relax.Expr, axis: int | None) -> tuple[int | None, tuple]:
    """The static extent of the indexed axis (all elements when ``axis`` is None), and the
    tensor's shape for messages; ``None`` when the extent is symbolic or the axis invalid."""
    ty = data.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None, ()
    dims = list(ty.shape.values)
    shown = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in dims)
    if axis is None:
        picked = dims
    elif -len(dims) <= axis < len(dims):
        picked = [dims[axis]]
    else:
        return None, shown
    if not all(isinstance(d, tvm.tirx.IntImm) for d in picked):
        return None, shown
    extent = 1
    for d in picked:
        extent *= int(d)
    return extent, shown
