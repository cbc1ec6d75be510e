"""Small helpers shared by plus_tvm's ONNX converters."""

from __future__ import annotations

import numpy as np
import onnx
from tvm import relax

from ...errors import InputRefusedError

# ONNX TensorProto element type -> Relax dtype string
DTYPE_OF_ONNX = {
    code: str(onnx.helper.tensor_dtype_to_np_dtype(code))
    for code in (
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.BOOL,
    )
}


def dims(x: relax.Expr) -> list:
    """The shape of a tensor expression as a list of PrimExprs (rank must be known)."""
    shape = x.ty.shape
    if shape is None:
        raise InputRefusedError(f"needs a tensor of known shape, got {x.ty}")
    return list(shape.values)


def static(n: object, what: str) -> int:
    """``n`` as an int, or an InputRefusedError naming ``what`` when it is symbolic."""
    try:
        return int(n)
    except TypeError:
        raise InputRefusedError(f"{what} must be static, got {n}") from None


def emit(bb: relax.BlockBuilder, expr: relax.Expr) -> relax.Var:
    return bb.emit(expr)


def scalar(value: float | int, dtype: str) -> relax.Constant:
    return relax.const(value, dtype)


def full_like_dtype(bb: relax.BlockBuilder, shape: list, value: float, dtype: str) -> relax.Expr:
    """A tensor of ``shape`` filled with ``value`` (a constant when the shape is static)."""
    try:
        sizes = [int(d) for d in shape]
    except TypeError:  # symbolic: computed at run time
        return emit(bb, relax.op.full(shape, relax.const(value, dtype), dtype))
    return relax.const(np.full(sizes, value, dtype=dtype), dtype)
