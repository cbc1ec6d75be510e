"""ONNX ``ReduceMax`` / ``ReduceMin`` of floats over infinities.

TVM's max (min) reduction starts from the lowest (highest) *finite* value of the dtype, so the
maximum of a row of ``-inf`` is ``-65504`` in float16 and ``-3.4e38`` in float32, where ONNX
gives ``-inf`` (and so does an empty reduction). Masked attention depends on it: a fully masked
row is found by ``ReduceMax(bias) == -inf``, and missing it lets the row's NaN softmax through.

Here a result equal to that starting value is replaced by ``-inf`` (``+inf``) unless one of the
reduced values really is the finite extreme (found with the same reduction over an indicator).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import ReduceMax as TVMReduceMax
from tvm.relax.frontend.onnx.onnx_frontend import ReduceMin as TVMReduceMin

from ._common import emit


def _infinite_extremes(bb, convert, inputs, attr, params, largest: bool):
    """``convert`` (TVM's reduction) with infinities as ONNX's reduction gives them."""
    data = inputs[0]
    ty = getattr(data, "ty", None)
    dtype = str(getattr(ty, "dtype", "")) if isinstance(ty, relax.TensorType) else ""
    if not dtype.startswith(("float", "bfloat")) or isinstance(data, tvm.ir.GenericConst):
        return convert(bb, inputs, dict(attr), params)
    out = convert(bb, inputs, dict(attr), params)
    if out is data:  # (noop_with_empty_axes)
        return out
    out = emit(bb, out)
    start = (tvm.tirx.min_value if largest else tvm.tirx.max_value)(dtype).value
    bound = relax.const(start, dtype)
    one, zero = relax.const(1.0, dtype), relax.const(0.0, dtype)
    # largest: max over (x == bound) is 1 when some x is the bound; smallest: min over
    # (x != bound) is 0 then
    at_bound = relax.op.equal(data, bound) if largest else relax.op.not_equal(data, bound)
    found = emit(
        bb, convert(bb, [relax.op.where(at_bound, one, zero), *inputs[1:]], dict(attr), params)
    )
    present = relax.op.equal(found, one if largest else zero)
    infinite = relax.const(float("-inf") if largest else float("inf"), dtype)
    fixed = relax.op.where(present, bound, infinite)
    return relax.op.where(relax.op.equal(out, bound), fixed, out)


class ReduceMax(TVMReduceMax):
    """``ReduceMax`` whose all-``-inf`` (or empty) reductions give ``-inf``."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        return _infinite_extremes(bb, super()._impl_v11, inputs, attr, params, largest=True)

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        return _infinite_extremes(bb, super()._impl_v18, inputs, attr, params, largest=True)


class ReduceMin(TVMReduceMin):
    """``ReduceMin`` whose all-``+inf`` (or empty) reductions give ``+inf``."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        return _infinite_extremes(bb, super()._impl_v11, inputs, attr, params, largest=False)

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        return _infinite_extremes(bb, super()._impl_v18, inputs, attr, params, largest=False)
