"""ONNX ``ArgMax`` / ``ArgMin`` as ONNX Runtime gives them, NaN and infinities included.

ONNX Runtime's CPU kernels scan a row from its first element and move to a value strictly
greater (``ArgMax``; ``>=`` with ``select_last_index``; ``ArgMin`` alike with ``<``): a NaN is
never moved to, and a row that starts with a NaN keeps index 0. TVM 0.27's converters are TOPI's
argmax, which starts from (index -1, the lowest *finite* value): a row of ``-inf`` gets -1
(``select_last_index``: the row's length, past its end), and a row holding a NaN an index that
depends on the reduction order. Here, with ``m`` the extreme of the non-NaN values (``-inf``
where there are none):

    index = 0                                   where the row starts with a NaN
          = first (last) position of x == m     otherwise, NaN positions excluded

the positions found with TOPI's argmax over a 0/1 mask (which never meets its starting value).
Half-precision rows are compared as their exact float32 values (TVM has no ``isnan`` for
bfloat16).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import ArgMax as TVMArgMax
from tvm.relax.frontend.onnx.onnx_frontend import ArgMin as TVMArgMin
from tvm.relax.frontend.onnx.onnx_frontend import _argreduce_select_last_index

from ._common import emit

_HALF = ("float16", "bfloat16")


def _position(bb, data, axis: int, keepdims: bool, largest: bool, last: bool) -> relax.Expr:
    """The int64 index ONNX Runtime gives (module docstring)."""
    dtype = str(data.ty.dtype)
    work = emit(bb, relax.op.astype(data, "float32")) if dtype in _HALF else data
    wdtype = str(work.ty.dtype)
    is_float = wdtype.startswith("float")
    reduce = relax.op.max if largest else relax.op.min
    if not is_float:  # (TOPI's max of a row of the dtype's minimum is that minimum: exact)
        extreme = emit(bb, reduce(work, [axis], True))
        mask = relax.op.equal(work, extreme)
    else:
        nan = emit(bb, relax.op.isnan(work))
        infinite = relax.const(float("-inf") if largest else float("inf"), wdtype)
        clean = emit(bb, relax.op.where(nan, infinite, work))
        extreme = emit(bb, reduce(clean, [axis], True))
        # TOPI's max starts from the lowest finite value: a row of -inf (or of NaN) gave that
        start = (tvm.tirx.min_value if largest else tvm.tirx.max_value)(wdtype).value
        start = relax.const(start, wdtype)
        at_start = relax.op.astype(relax.op.equal(clean, start), "int8")
        present = emit(bb, relax.op.astype(relax.op.max(at_start, [axis], True), "bool"))
        fixed = relax.op.where(present, start, infinite)
        extreme = emit(bb, relax.op.where(relax.op.equal(extreme, start), fixed, extreme))
        mask = relax.op.logical_and(relax.op.logical_not(nan), relax.op.equal(work, extreme))
    mask = emit(bb, relax.op.astype(mask, "int8"))
    if last:
        index = emit(bb, _argreduce_select_last_index(bb, mask, axis, True, relax.op.argmax))
    else:
        index = emit(bb, relax.op.argmax(mask, axis, True))
    if is_float:  # a row starting with a NaN stays at index 0
        head = relax.op.strided_slice(work, [axis], [0], [1])
        first_nan = emit(bb, relax.op.isnan(head))
        index = emit(bb, relax.op.where(first_nan, relax.const(0, "int64"), index))
    return index if keepdims else relax.op.squeeze(index, [axis])


def _convert(cls, bb, inputs, attr, largest: bool, shift_axis: bool = True):
    data = inputs[0]
    axis, keepdims = cls._check_attrs(data, attr, shift_axis)
    last = bool(attr.get("select_last_index", False))
    return _position(bb, data, axis, bool(keepdims), largest, last)


class ArgMax(TVMArgMax):
    """``ArgMax`` as ONNX Runtime gives it (module docstring)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return _convert(cls, bb, inputs, attr, largest=True, shift_axis=False)

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        return _convert(cls, bb, inputs, attr, largest=True)

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        return _convert(cls, bb, inputs, attr, largest=True)


class ArgMin(TVMArgMin):
    """``ArgMin`` as ONNX Runtime gives it (module docstring)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return _convert(cls, bb, inputs, attr, largest=False, shift_axis=False)

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        return _convert(cls, bb, inputs, attr, largest=False)

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        return _convert(cls, bb, inputs, attr, largest=False)
