"""ONNX ``Expand`` whose target shape is only known at run time.

With a shape tensor computed at run time (not a constant, not a shape value), TVM's converter
broadcasts to the tensor's values as they are: ``Expand(x[3, 1], [2, 1, 6])`` gives a
``(2, 1, 6)`` result where ONNX's broadcasting rule gives ``(2, 3, 6)`` (a target dimension of 1
keeps the input's). Here the effective shape is computed first, ``where(shape == 1,
input_dims, shape)`` over the right-aligned dims; constant and shape-value targets keep TVM's
converter.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import Expand as TVMExpand

from ._common import dims, emit, static


class Expand(TVMExpand):
    """``Expand(input, shape)`` with ONNX's broadcasting for run-time shapes."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, shape = inputs[0], inputs[1]
        if isinstance(shape, (relax.ShapeExpr, tvm.ir.GenericConst)) or not isinstance(
            shape.ty, relax.TensorType
        ):
            return super()._impl_v13(bb, inputs, attr, params)
        rank = static(dims(shape)[0], "Expand's shape length")
        in_dims = dims(data)
        if len(in_dims) > rank:
            return super()._impl_v13(bb, inputs, attr, params)
        aligned = [1] * (rank - len(in_dims)) + [static(d, "Expand's input dims") for d in in_dims]
        current = relax.const(np.asarray(aligned, dtype="int64"), "int64")
        target = emit(bb, relax.op.astype(shape, "int64"))
        one = relax.const(1, "int64")
        effective = emit(bb, relax.op.where(relax.op.equal(target, one), current, target))
        new_shape = emit(bb, relax.op.tensor_to_shape(effective))
        symbols = [tvm.tirx.Var(f"expand_dim{i}", "int64") for i in range(rank)]
        bb.match_cast(new_shape, relax.ShapeType(symbols))  # defines the symbols
        return emit(bb, relax.op.broadcast_to(data, relax.ShapeExpr(symbols)))
