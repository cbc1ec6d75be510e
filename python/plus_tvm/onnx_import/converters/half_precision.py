"""Half-precision ONNX nodes computed as ONNX Runtime computes them: in float32, rounded once.

ONNX Runtime's CPU provider has float32 kernels for almost every op: it casts a ``float16``
node's inputs to ``float32``, runs the node and casts its outputs back (its
``InsertCastTransformer``). TVM's converters compute in the tensors' dtype, so an op that
reduces, or that TVM expands into several steps, rounds to half precision at every step: a
``float16`` Softmax sums its row in ``float16``, a ReduceMean adds thousands of values in it.

:data:`FLOAT32_OPS` lists the ops whose half-precision result depends on that: reductions,
normalizations, softmax, pooling that averages, recurrent cells, and activations TVM's
converters build from several ops. A node of one of them whose first input is a half tensor is
converted (by whichever converter handles the op) on float32 inputs, and its float32 outputs
rounded to that dtype (:func:`in_float32`). Single element-wise ops stay in half precision:
TVM's code generation computes each in float32 and rounds once, as ONNX Runtime does. Matrix
products and convolutions keep half operands with float32 accumulation
(:mod:`.contraction`); LayerNormalization and Attention do their own (their converters).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

HALF = ("float16", "bfloat16")
FLOAT32 = "float32"

#: ONNX ops computed in float32 on half-precision inputs (module docstring)
FLOAT32_OPS: frozenset[str] = frozenset(
    {
        # reductions
        "ReduceMean",
        "ReduceSum",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceProd",
        "CumSum",
        "Einsum",
        "Mean",
        "Sum",
        # softmax and normalizations
        "Softmax",
        "LogSoftmax",
        "BatchNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "LpNormalization",
        "MeanVarianceNormalization",
        "RMSNormalization",
        # pooling that averages or takes norms
        "AveragePool",
        "GlobalAveragePool",
        "LpPool",
        "GlobalLpPool",
        # recurrent cells (matrix products inside)
        "RNN",
        "GRU",
        "LSTM",
        # activations and functions TVM's converters build from several ops
        "Gelu",
        "Erf",
        "Celu",
        "Elu",
        "Selu",
        "HardSigmoid",
        "HardSwish",
        "Mish",
        "Softplus",
        "Softsign",
        "Swish",
        "Pow",
    }
)


def half_dtype(value: object) -> str | None:
    """The half dtype of a tensor expression, else None."""
    ty = getattr(value, "ty", None)
    dtype = str(getattr(ty, "dtype", "")) if isinstance(ty, relax.TensorType) else ""
    return dtype if dtype in HALF else None


def to_float32(bb: relax.BlockBuilder, value: relax.Expr) -> relax.Expr:
    """``value`` (a half tensor) as float32: a constant stays a constant (converters fold
    constant operands), anything else is cast."""
    if isinstance(value, tvm.ir.GenericConst):
        array = value.value.numpy().astype(np.float32)
        return relax.const(array, FLOAT32)
    return bb.normalize(relax.op.astype(value, FLOAT32))


def needs_float32(op_type: str, inputs) -> bool:
    """Whether a node of ``op_type`` with ``inputs`` is computed by :func:`in_float32`."""
    return op_type in FLOAT32_OPS and len(inputs) > 0 and half_dtype(inputs[0]) is not None


def in_float32(bb: relax.BlockBuilder, inputs, convert: Callable[[list], relax.Expr]) -> relax.Expr:
    """``convert`` (a node's converter) run on ``inputs`` with every half tensor in float32;
    its float32 results rounded to the dtype of the node's first input."""
    dtype = half_dtype(inputs[0])
    cast = type(inputs)(to_float32(bb, x) if half_dtype(x) else x for x in inputs)
    out = convert(cast)
    if isinstance(out, relax.Expr):
        out = bb.normalize(out)
    return _round(bb, out, dtype)


def _round(bb: relax.BlockBuilder, out: object, dtype: str) -> object:
    """Every float32 tensor of a converter's result (an expression, a relax or Python tuple)
    cast to ``dtype``."""
    if isinstance(out, (list, tuple)):
        return type(out)(_round(bb, item, dtype) for item in out)
    if not isinstance(out, relax.Expr):
        return out
    ty = out.ty
    if isinstance(ty, relax.TupleType):
        items = [bb.normalize(relax.TupleGetItem(out, i)) for i in range(len(ty.fields))]
        return relax.Tuple([_round(bb, item, dtype) for item in items])
    if isinstance(ty, relax.TensorType) and str(ty.dtype) == FLOAT32:
        return bb.normalize(relax.op.astype(out, dtype))
    return out
