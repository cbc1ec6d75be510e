"""ONNX ``TopK`` as ONNX Runtime gives it: NaN the largest value, ``k`` from the input in opset 10.

ONNX Runtime (as torch) takes NaN as larger than every number: ``TopK`` with ``largest=1``
returns the NaNs first, with ``largest=0`` only when the row has too few numbers. TVM 0.27's
converter sorts with ``<`` / ``>``, false for a NaN, so a row holding one came back in an
undefined order (``[nan, 1.0]`` for ``[1, nan, 3, -inf, 2]``, ONNX Runtime ``[nan, 3.0]``).
Float rows are ordered here by :func:`plus_tvm.torch_sort_converters.nan_order` (two stable
sorts; ties in row order, as ONNX Runtime gives them). TVM's converter also has no opset-10
form: an opset-10 model (``k`` an input) ran its opset-1 form, which reads ``k`` from an
attribute that is not there, 1.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import TopK as TVMTopK
from tvm.relax.frontend.onnx.onnx_frontend import get_constant

from ...errors import InputRefusedError
from ...torch_sort_converters import nan_order
from ._common import emit


def _k(inputs, params) -> int:
    k = get_constant(inputs[1], params)
    if not isinstance(k, tvm.ir.GenericConst):
        raise InputRefusedError("TopK's k must be a constant")
    return int(k.value.numpy().item())


def _top_k(bb, data, k: int, axis: int, largest: bool) -> relax.Expr:
    if not str(data.ty.dtype).startswith(("float", "bfloat")):
        return relax.op.topk(data, k, axis, ret_type="both", largest=largest, dtype="int64")
    axis = axis + data.ty.ndim if axis < 0 else axis
    order = nan_order(bb, data, axis, descending=largest)
    index = emit(bb, relax.op.strided_slice(order, [axis], [0], [k]))
    values = emit(bb, relax.op.gather_elements(data, index, axis))
    return relax.Tuple([values, index])


class TopK(TVMTopK):
    """``TopK`` with NaN as the largest value (module docstring)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return _top_k(bb, inputs[0], int(attr.get("k", 1)), int(attr.get("axis", -1)), True)

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        return _top_k(bb, inputs[0], _k(inputs, params), int(attr.get("axis", -1)), True)

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        if attr.get("sorted", 1) != 1:
            return super()._impl_v11(bb, inputs, attr, params)  # (TVM refuses it by name)
        largest = bool(attr.get("largest", 1))
        return _top_k(bb, inputs[0], _k(inputs, params), int(attr.get("axis", -1)), largest)
