"""ONNX ``Constant``: every value attribute, not only ``value``.

TVM's converter reads only the tensor attribute ``value`` ("no value in Constant" otherwise);
ONNX 12+ also allows ``value_float``, ``value_floats``, ``value_int``, ``value_ints`` (function
bodies such as Elu, HardSigmoid, Selu or Shrink expanded use them).
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ...errors import InputRefusedError

_SCALARS = {
    "value_float": np.float32,
    "value_int": np.int64,
    "value_floats": np.float32,
    "value_ints": np.int64,
}


class Constant(OnnxOpConverter):
    """``Constant`` with any of its value attributes."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        del bb, inputs, params
        if "value" in attr:
            value = attr["value"]
            array = np.asarray([0], np.int64) if isinstance(value, bytes) else _array(value)
            return relax.const(array, array.dtype.name)
        for key, dtype in _SCALARS.items():
            if key in attr:
                array = np.asarray(attr[key], dtype=dtype)
                return relax.const(array, array.dtype.name)
        present = sorted(k for k in attr if k != "tvm_custom")
        raise InputRefusedError(
            f"Constant with attribute(s) {present}: only value, value_float(s) and "
            "value_int(s) hold numbers"
        )


def _array(value: object) -> np.ndarray:
    if hasattr(value, "dims"):  # a TensorProto
        return numpy_helper.to_array(value)
    return np.asarray(value)
